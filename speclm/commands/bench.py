"""`speclm bench`: sweep methods × K × temperature over prompt categories (and,
with --targets/--drafts, over target and draft models: see bench/pipeline.py) and
write raw traces, summary.json, report.md, plots and manifest.json.

Starved requests are flagged and re-run, after a bounded wait for a quiet
machine (bench/trust/). `--endpoint URL [--endpoint-b URL]` runs the same
prompts against OpenAI-compatible servers instead (bench/endpoint/).

Wire it with `add_bench_parser(subparsers)`; the command's function is
`cmd_bench(args) -> exit code`. It plans the run by model names and runs
bench/pipeline.py's `run_pipeline`, the one pipeline an already built LLM
(tests, notebooks) runs too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..backends.load import LoadConfig
from ..bench.analysis.replays import COSTS
from ..bench.output.sections import print_sections
from ..bench.pipeline import run_pipeline
from ..bench.setup.plan import plan_bench, plan_models
from ..bench.setup.config import BenchConfig
from ..bench.setup.workloads import WorkloadConfig
from ..bench.trust.policy import TrustPolicy
from ..machine import busy_cpus, busy_warning
from ..speculative.replay import BOUNDS, POLICIES
from .bench_endpoint import add_endpoint_options, check_endpoint_args, cmd_endpoint_bench
from .flags import add_json_option, add_options, add_spec_options, build, spec_from_args, speculator_config

# Sized by measurement on 2 Zen 3 cores: ~6 prompts × the default methods (3) × 48 tokens.
QUICK = {"categories": ["humaneval", "code-edit", "chat"], "prompts_per_category": 2, "ks": [4],
         "temperatures": [0.0], "max_new_tokens": [48]}


def _names(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected at least one model name")
    return names


def _listed(names: Iterable[str], default: str | None = None, what: dict[str, str] | None = None) -> str:
    """'a, b or c' of `names` (a help list made from the list it describes), each followed
    by what it is where `what` says, the default marked."""
    items = []
    for n in names:
        notes = ([what[n]] if what else []) + (["default"] if n == default else [])
        items.append(f"{n} ({'; '.join(notes)})" if notes else n)
    return f"{', '.join(items[:-1])} or {items[-1]}" if len(items) > 1 else "".join(items)


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    """Register `bench` on an argparse subparsers object."""
    b = subparsers.add_parser("bench", help="benchmark methods against plain decoding",
                              description="Benchmark speculative methods against plain (AR) decoding, "
                                          "interleaved per prompt, and write a report.")
    add_options(b, LoadConfig, "models")
    m = b.add_argument_group("model sweeps")
    m.add_argument("--targets", type=_names, default=None,
                   help="sweep targets: comma-separated names, NAME@QUANT variants or GGUF paths, loaded in turn; "
                        "agreement and perplexity cost are against the first")
    m.add_argument("--drafts", type=_names, default=None,
                   help="sweep drafts: draft methods run once per draft with every target")
    m.add_argument("--variant-quality", action="store_true",
                   help="also measure perplexity of every target and draft and greedy agreement with the "
                        "first target (the `models compare` text set; minutes)")
    add_options(b, WorkloadConfig, "prompts", unset=True)
    add_options(b, BenchConfig, "sweep", unset=True)
    b.add_argument("--out", default=None, help="output directory (default bench-out/<timestamp>)")
    b.add_argument("--quick", action="store_true", help="a small smoke sweep (~2 prompts × 3 categories, "
                   "K=4, greedy, 48 tokens); explicit flags override it")
    t = b.add_argument_group("contamination (requests starved of CPU by other processes)")
    add_options(t, TrustPolicy)
    t.add_argument("--no-wait-quiet", action="store_true", help="do not wait for a quiet machine")
    add_endpoint_options(b)
    add_spec_options(b, skip=("method", "k"))  # --methods and --k sweep those
    b.set_defaults(func=cmd_bench)
    r = b.add_subparsers(dest="bench_command", metavar="replay").add_parser(
        "replay", help="replay a run's greedy outputs through controller policies, without the model",
        description="Replay a recorded greedy run (its streams.jsonl and copy ceiling) through controller "
                    "policies at the run's own cost curves, and print per category the decode-only speedup each "
                    "would have reached and the share of the ceiling's gain it keeps.")
    r.add_argument("run_dir", metavar="RUN_DIR", help="a `speclm bench` output directory")
    r.add_argument("--policy", type=_names, default=["auto"],
                   help=f"policies, comma-separated: {_listed(POLICIES, 'auto')}; or, a bound reading the run's "
                        f"outcomes in advance, {_listed(BOUNDS)}")
    r.add_argument("--suffix-rematch", choices=("on", "off"), default=None,
                   help="replay with the suffix drafter's rematch on or off (default: as the run drafted); "
                        "the kept share is then of that drafter's ceiling")
    r.add_argument("--costs", choices=COSTS, default="recorded",
                   help=f"the cost curve to price at: {_listed(COSTS, 'recorded', COSTS)}; the ceilings are "
                        "recomputed at it")
    add_json_option(r)
    r.set_defaults(func=cmd_replay)
    return b


def cmd_replay(args: argparse.Namespace) -> int:
    """`speclm bench replay RUN_DIR`."""
    from ..bench.analysis.replays import replay_run
    rematch = None if args.suffix_rematch is None else args.suffix_rematch == "on"
    rows = replay_run(Path(args.run_dir), args.policy, rematch=rematch, costs=args.costs)
    if args.json:
        print(json.dumps(rows))
        return 0
    table = Table(title=f"replayed decode-only speedup over AR ({args.run_dir})")
    for name in ("target", "category", "policy", "speedup", "kept of the ceiling", "ceiling", "best occurrence",
                 "tokens/round"):
        table.add_column(name)
    for r in rows:
        kept = "-" if r["kept_share"] is None else f"{r['kept_share']:.0%}"
        table.add_row(escape(r["target_name"] or "-"), r["category"], r["policy"], f"{r['speedup']:.2f}x", kept,
                      f"{r['ceiling']:.2f}x", f"{r['best_ceiling']:.2f}x", f"{r['tokens'] / r['rounds']:.2f}")
    Console(highlight=False).print(table)
    return 0


def _notify(text: str) -> None:
    print(f"speclm: {text}", file=sys.stderr, flush=True)


def trust_from_args(args: argparse.Namespace) -> TrustPolicy:
    """The contamination policy of the flags (the command waits for quiet unless told not to)."""
    return build(args, TrustPolicy, notify=_notify, **({"wait_quiet_s": 0.0} if args.no_wait_quiet else {}))


def resolve_args(args: argparse.Namespace) -> dict:
    """The run's workload ("workload") and sweep ("config") from the flags, --quick
    filling what was not given; validated before any model loads."""
    preset = QUICK if args.quick else {}
    if args.dataset and args.categories is None:
        preset = {**preset, "categories": None}  # a dataset's own categories, all of them
    workload = build(args, WorkloadConfig, preset)
    config = build(args, BenchConfig, preset, base=spec_from_args(args), trust=trust_from_args(args))
    return {"workload": workload, "config": config}


def cmd_bench(args: argparse.Namespace) -> int:
    """Entry point of `speclm bench`."""
    endpoint = getattr(args, "endpoint", None) or getattr(args, "endpoint_b", None)
    if endpoint:
        check_endpoint_args(args)
    v = resolve_args(args)
    cfg: BenchConfig = v["config"]
    prompts = v["workload"].prompts()
    if endpoint:
        return cmd_endpoint_bench(args, v, prompts)
    load = build(args, LoadConfig)
    models = plan_models(args.target, args.targets, args.draft, args.drafts, cfg.uses_draft(), n_ctx=load.n_ctx,
                         threads=load.n_threads, kernels=load.kernels, speculator=speculator_config(args))
    plan = plan_bench(prompts, cfg, models, dataset=args.dataset, variant_quality=args.variant_quality)
    err = Console(stderr=True, highlight=False)
    if unused := cfg.unused_settings():
        err.print(f"[bold yellow]warning:[/] {escape(', '.join(unused))} set, but no method of --methods reads "
                  f"{'it' if len(unused) == 1 else 'them'}")
    warning = busy_warning(busy_cpus(), os.cpu_count() or 1)
    if warning:
        err.print(f"[bold red]WARNING:[/] {escape(warning)}")
    out_dir = Path(args.out or Path("bench-out") / time.strftime("%Y%m%d-%H%M%S"))
    out = run_pipeline(plan, out_dir, progress=True)
    print_sections(out["sections"])
    print(f"report: {out['report']}")
    return 0
