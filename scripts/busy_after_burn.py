"""What the kernel probe's busy check says right after a CPU-heavy command ends (issue 57's
"cries wolf after install"): both cores are burned for --seconds in child processes (a
compile's stand-in), then the two readings are taken at once: the 1-minute load average (what
the check read before) and speclm.machine.busy_cpus (a 1 s sample of /proc/stat, what it reads
now), each through busy_warning.

    python scripts/busy_after_burn.py --seconds 40
"""

import argparse
import multiprocessing as mp
import os
import time

from speclm.machine import busy_cpus, busy_warning


def burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=40.0)
    args = p.parse_args()
    cores = os.cpu_count() or 1
    procs = [mp.Process(target=burn, args=(args.seconds,)) for _ in range(cores)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    load1 = os.getloadavg()[0]
    print(f"load average {load1:.2f}:", busy_warning(load1, cores) or "quiet")
    busy = busy_cpus()
    print(f"1 s sample, {busy:.2f} CPUs busy by others:", busy_warning(busy, cores) or "quiet")
