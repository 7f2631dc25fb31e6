"""Memory soak of `speclm serve`: RSS while the caches fill past their bounds.

Starts `speclm serve` on SmolLM2-135M with small cache bounds, sends distinct
prompts from a few clients for a while (speclm/loadgen.py), and samples every
few seconds the server's RSS (/proc) and what its caches hold (/metrics, read
from loopback). A failed request ends the run with its error.
Once every cache is at its bound, RSS should stay flat: growth after that is
memory the caches do not account for. One phase with the prefix cache on, one
with it off (--phase on|off for one of them); a CSV and a plot go to --out.

    python scripts/soak.py --minutes 5 --out /tmp/soak
    python scripts/soak.py --phase on --minutes 60 --every 30 --out /tmp/soak-hour
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from speclm.loadgen import Request, openai_client, run_clients, timed_request

WORDS = ("alpha beta gamma delta parse render merge index cache route token table query batch stream "
         "vector matrix signal buffer socket thread worker queue lock timer event graph node edge").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cache_tokens(url: str) -> tuple[float, float]:
    """(suffix cache tokens, prefix cache tokens) summed over scopes."""
    text = httpx.get(url + "/metrics", timeout=10).text

    def total(name: str) -> float:
        return sum(float(m) for m in re.findall(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M))

    return total("speclm_suffix_cache_tokens"), total("speclm_prefix_cache_tokens")


def prompts(seed: int) -> Iterator[Request]:
    """Distinct function-header prompts without end, non-streamed, 48 tokens at T = 0.7."""
    rng = random.Random(seed)
    while True:
        prompt = "def " + "_".join(rng.sample(WORDS, 3)) + "(" + ", ".join(rng.sample(WORDS, 2)) + "):\n"
        yield Request(prompt, max_tokens=48, temperature=0.7, stream=False)


def phase(name: str, prefix_tokens: int, args: argparse.Namespace, rows: list[dict]) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(args.out / f"serve-{name}.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "speclm", "serve", "--target", "smollm2-135m", "--port", str(port),
                             "--max-concurrency", str(args.clients), "--n-ctx", "512", "--log-level", "warning",
                             "--suffix-cache-tokens", str(args.suffix_tokens),
                             "--prefix-cache-tokens", str(prefix_tokens)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start: see {log.name}")
            time.sleep(0.5)
        stop, sent = threading.Event(), [0]
        api = openai_client(url, None, 120)

        def send(req: Request) -> None:
            timed_request(api, req, model=None, timeout=120)
            sent[0] += 1
        with ThreadPoolExecutor(1) as pool:  # the clients run while this thread samples; a failure ends the phase
            load = pool.submit(run_clients, args.clients, prompts(0), send, stop=stop)
            t0 = time.monotonic()
            try:
                while (elapsed := time.monotonic() - t0) < args.minutes * 60 and not load.done():
                    suffix, prefix = cache_tokens(url)
                    rows.append({"phase": name, "seconds": round(elapsed, 1), "rss_mb": round(rss_mb(proc.pid), 1),
                                 "suffix_cache_tokens": suffix, "prefix_cache_tokens": prefix, "requests": sent[0]})
                    print(rows[-1], flush=True)
                    time.sleep(args.every)
            finally:
                stop.set()
            load.result()
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def plot(rows: list[dict], path: Path, args: argparse.Namespace) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, name in zip(axes, ("prefix-cache-on", "prefix-cache-off")):
        mine = [r for r in rows if r["phase"] == name]
        if not mine:
            ax.set_visible(False)
            continue
        t = [r["seconds"] for r in mine]
        ax.plot(t, [r["rss_mb"] for r in mine], color="black", label="server RSS (MB)")
        ax.set_title(name)
        ax.set_xlabel("seconds")
        twin = ax.twinx()
        twin.plot(t, [r["suffix_cache_tokens"] for r in mine], color="tab:blue", ls="--", label="suffix cache tokens")
        twin.plot(t, [r["prefix_cache_tokens"] for r in mine], color="tab:orange", ls=":", label="prefix cache tokens")
        twin.set_ylim(0, max(args.suffix_tokens, args.prefix_tokens) * 1.2)
        twin.legend(loc="lower right", fontsize=8)
    axes[0].set_ylabel("RSS (MB)")
    axes[0].legend(loc="upper left", fontsize=8)
    fig.suptitle(f"speclm serve, SmolLM2-135M, {args.clients} clients; bounds: suffix {args.suffix_tokens}, "
                 f"prefix {args.prefix_tokens} tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0, help="per phase")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--suffix-tokens", type=int, default=4000)
    ap.add_argument("--prefix-tokens", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=Path("soak"))
    ap.add_argument("--phase", choices=("both", "on", "off"), default="both", help="prefix cache on, off, or both")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    if args.phase in ("both", "on"):
        phase("prefix-cache-on", args.prefix_tokens, args, rows)
    if args.phase in ("both", "off"):
        phase("prefix-cache-off", 0, args, rows)
    with open(args.out / "soak.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, args.out / "soak.png", args)
    print(f"{args.out / 'soak.csv'}, {args.out / 'soak.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
