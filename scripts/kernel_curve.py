"""v(b) of kernel configurations, interleaved in one run: the figures docs/results.md compares.

Each configuration runs in its own child process (the kernel switches are process-wide), one
child per configuration per round, rounds alternating the order, so that a noisy minute hits
every configuration alike. A child loads the model, times blocks of b rows after 64 tokens
with costs.time_curve (median of --repeats) and a --prefill-token prompt, and prints JSON.

    python scripts/kernel_curve.py --configs repack+tiled,speclm+tiled --rounds 3
    python scripts/kernel_curve.py --configs repack+tiled,speclm+tiled@rows=1-64,speclm+tiled@isa=avx2

A configuration may carry settings of speclm's kernels after "@" (rows=LO-HI: SPECLM_NATIVE_ROWS;
isa=avx2: SPECLM_NATIVE_ISA), for its child only.

It prints, per configuration, the median over rounds of each v(b) and of the prefill, and each
one's ratio to the first configuration's; the CPU, the load average before and after. --per-round
adds each round's ratio, for differences smaller than the noise between minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

BLOCKS = (1, 2, 3, 4, 8, 16, 32, 64)


def blocks_of(args: argparse.Namespace) -> tuple[int, ...]:
    return tuple(int(b) for b in args.blocks.split(",")) if args.blocks else BLOCKS


def child(args: argparse.Namespace) -> None:
    from speclm import native
    from speclm.backends import kernels as K
    from speclm.backends.llamacpp import LlamaCppBackend
    from speclm.costs import time_curve, time_prefill
    from speclm.models.catalog import resolve_model
    config = K.parse_config(args.child.partition("@")[0])
    path = resolve_model(args.model)
    K.apply(config, path.name)
    backend = LlamaCppBackend(path, n_ctx=1024, n_threads=args.threads, n_seq_max=1, kernels=config)
    curve = time_curve(backend, blocks_of(args), 64, args.repeats, statistics.median)
    prefill = time_prefill(backend, args.prefill_tokens, args.repeats, statistics.median)
    print(json.dumps({"v_ms": curve, "prefill_ms": prefill, "native": native.status().reason,
                      "handled": native.handled()}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="repack+tiled,speclm+tiled")
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prefill-tokens", type=int, default=512)
    p.add_argument("--blocks", default="", help="the block sizes to time (default: " + ",".join(map(str, BLOCKS)) + ")")
    p.add_argument("--per-round", action="store_true",
                   help="also print each round's ratio to the first configuration (its child ran next to it)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    from speclm.machine import cpu_model
    configs = args.configs.split(",")
    load0 = os.getloadavg()
    found: dict[str, list[dict]] = {c: [] for c in configs}
    for r in range(args.rounds):
        for c in (configs if r % 2 == 0 else configs[::-1]):
            cmd = [sys.executable, __file__, "--child", c, "--model", args.model, "--repeats", str(args.repeats),
                   "--threads", str(args.threads), "--prefill-tokens", str(args.prefill_tokens), "--blocks", args.blocks]
            env = dict(os.environ)
            for setting in filter(None, c.partition("@")[2].split("@")):
                key, _, value = setting.partition("=")
                env[{"rows": "SPECLM_NATIVE_ROWS", "isa": "SPECLM_NATIVE_ISA"}[key]] = value
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
            found[c].append(json.loads(out.strip().splitlines()[-1]))
    print(f"{cpu_model()}; {args.model}; {args.threads} threads; {args.rounds} rounds x median of {args.repeats}; "
          f"load {load0[0]:.2f} before, {os.getloadavg()[0]:.2f} after")
    base, blocks = None, blocks_of(args)
    for c in configs:
        med = {b: statistics.median(run["v_ms"][str(b)] for run in found[c]) for b in blocks}
        pre = statistics.median(run["prefill_ms"] for run in found[c])
        base = base or (med, pre)
        cells = "  ".join(f"v({b}) {med[b]:7.1f} ({med[b] / base[0][b]:.2f}, {med[b] / med[blocks[0]]:.2f} steps)"
                          for b in blocks)
        print(f"{c:<14} {cells}  prefill({args.prefill_tokens}) {pre:7.0f} ({pre / base[1]:.2f})  "
              f"[{found[c][0]['native']}; {found[c][0]['handled']} matmuls by speclm's kernels]")
        if args.per_round and c != configs[0]:
            print(" " * 15 + "  ".join(f"v({b}) ÷ first by round " + " ".join(
                f"{run['v_ms'][str(b)] / first['v_ms'][str(b)]:.3f}" for run, first in zip(found[c], found[configs[0]]))
                for b in blocks))


if __name__ == "__main__":
    main()
