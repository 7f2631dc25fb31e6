"""`speclm bench`: sweep methods × K × temperature over prompt categories (and,
with --targets/--drafts, over target and draft models: see bench/run/sweep.py) and
write raw traces, summary.json, report.md, plots and manifest.json.

Starved requests are flagged and re-run, after a bounded wait for a quiet
machine (bench/trust/). `--endpoint URL [--endpoint-b URL]` runs the same
prompts against OpenAI-compatible servers instead (bench/endpoint/).

Wire it with `add_bench_parser(subparsers)`; the command's function is
`cmd_bench(args) -> exit code`. `run_to_dir` is the same pipeline for an
already built LLM (tests, notebooks).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from ..bench.output.sections import print_sections
from ..bench.run.sweep import plan_models, run_sweep
from ..bench.setup.config import BenchConfig
from ..bench.setup.methods import BENCH_DEFAULT, bench_methods
from ..bench.setup.workloads import Prompt, load_builtin, load_dataset, select
from ..bench.trust.policy import TrustPolicy
from ..bench.trust.quiet import busy_warning
from ..errors import InvalidRequestError
from ..prefix_cache import PREFIX_CACHE_TOKENS, PrefixCache
from ..sampling import SamplingParams
from .bench_endpoint import add_endpoint_options, check_endpoint_args, cmd_endpoint_bench
from .options import add_kernels_option, add_spec_options, spec_from_args, speculator_config

# Sized by measurement on 2 Zen 3 cores: ~6 prompts × the default methods (3) × 48 tokens.
QUICK = {"categories": ["humaneval", "code-edit", "chat"], "prompts_per_category": 2, "k": [4],
         "temperature": [0.0], "max_new_tokens": [48], "methods": list(BENCH_DEFAULT),
         "repeats": 1, "concurrency": [], "concurrency_repeats": 1, "prefix_cache_tokens": PREFIX_CACHE_TOKENS}
DEFAULTS = {"categories": None, "prompts_per_category": 20, "k": [2, 4, 8], "temperature": [0.0],
            "max_new_tokens": [128], "methods": list(BENCH_DEFAULT), "repeats": 1,
            "concurrency": [], "concurrency_repeats": 1, "prefix_cache_tokens": PREFIX_CACHE_TOKENS}


def _csv(kind: Callable[[str], object], what: str) -> Callable[[str], list]:
    def parse(text: str) -> list:
        try:
            items = [kind(x.strip()) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}") from None
        if not items:
            raise argparse.ArgumentTypeError(f"expected at least one {what}")
        return items
    return parse


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    """Register `bench` on an argparse subparsers object."""
    b = subparsers.add_parser("bench", help="benchmark methods against plain decoding",
                              description="Benchmark speculative methods against plain (AR) decoding, "
                                          "interleaved per prompt, and write a report.")
    b.add_argument("--target", default=None, help="target model: name or GGUF path (default qwen2.5-coder-1.5b)")
    b.add_argument("--draft", default=None, help="draft model for sd-draft (default qwen2.5-coder-0.5b "
                   "when the target is the default or one of its NAME@QUANT variants)")
    b.add_argument("--targets", type=_csv(str, "model names"), default=None,
                   help="sweep targets: comma-separated names, NAME@QUANT variants or GGUF paths, loaded in turn; "
                        "agreement and perplexity cost are against the first")
    b.add_argument("--drafts", type=_csv(str, "model names"), default=None,
                   help="sweep drafts: draft methods run once per draft with every target")
    b.add_argument("--variant-quality", action="store_true",
                   help="also measure perplexity of every target and draft and greedy agreement with the "
                        "first target (the `models compare` text set; minutes)")
    b.add_argument("--categories", type=_csv(str, "category names"), default=None,
                   help="humaneval,code-edit,chat,summarize,translate,math (default: all)")
    b.add_argument("--prompts-per-category", type=int, default=None, help="first N prompts of each (default 20)")
    b.add_argument("--methods", type=_csv(str, "method names"), default=None,
                   help=f"comma-separated, from {', '.join(bench_methods())} (AR always runs; "
                        f"default {','.join(BENCH_DEFAULT)})")
    b.add_argument("--k", type=_csv(int, "integers"), default=None, help="draft lengths (default 2,4,8)")
    b.add_argument("--temperature", type=_csv(float, "numbers"), default=None, help="default 0 (greedy)")
    b.add_argument("--max-new-tokens", type=_csv(int, "integers"), default=None, help="default 128")
    b.add_argument("--repeats", type=int, default=None, help="repeats of the whole sweep (default 1)")
    b.add_argument("--seed", type=int, default=0, help="base sampling seed (default 0)")
    b.add_argument("--concurrency", type=_csv(int, "integers"), default=None,
                   help="also measure throughput with N requests in flight, e.g. 1,2,4")
    b.add_argument("--concurrency-repeats", type=int, default=None, metavar="R",
                   help="run every concurrency row R times, AR and the methods alternating who goes first; "
                        "the report gives each ratio's range over the repeats (default 1)")
    b.add_argument("--dataset", default=None, help="Spec-Bench question.jsonl or JSONL of {category, prompt}")
    b.add_argument("--out", default=None, help="output directory (default bench-out/<timestamp>)")
    b.add_argument("--quick", action="store_true", help="a small smoke sweep (~2 prompts × 3 categories, "
                   "K=4, greedy, 48 tokens); explicit flags override it")
    b.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: all cores)")
    add_kernels_option(b)
    b.add_argument("--n-ctx", type=int, default=4096, help="context per sequence (default 4096)")
    b.add_argument("--ignore-eos", action="store_true", help="always generate max-new-tokens tokens")
    b.add_argument("--prefix-cache-tokens", type=int, default=None, metavar="N",
                   help="each arm's own cache of finished requests' KV, so a prompt that starts like an "
                   f"earlier one prefills only the rest (default {PREFIX_CACHE_TOKENS} tokens, as `speclm "
                   "serve`; 0: off, every prompt prefilled whole)")
    t = b.add_argument_group("contamination (requests starved of CPU by other processes)")
    t.add_argument("--min-cpu-share", type=float, default=0.6, metavar="F",
                   help="flag a request whose process CPU share (CPU s / wall s) is below F × the threads "
                        "llama.cpp computes with (default 0.6; 0 turns the check off)")
    t.add_argument("--max-reruns", type=int, default=3, metavar="N",
                   help="re-run a flagged request (with its AR partner) at most N times (default 3; 0: flag only)")
    t.add_argument("--max-total-reruns", type=int, default=None, metavar="N",
                   help="re-run at most N generations in all (default: half the planned requests, at least 4)")
    t.add_argument("--wait-quiet", type=float, default=60.0, metavar="SECONDS",
                   help="before timing, wait up to SECONDS for the 1-minute load average to fall below "
                        "--quiet-load (default 60)")
    t.add_argument("--no-wait-quiet", action="store_true", help="do not wait for a quiet machine")
    t.add_argument("--quiet-load", type=float, default=None, metavar="LOAD",
                   help="the load average counted as quiet (default: half the cores)")
    add_endpoint_options(b)
    add_spec_options(b, skip=("method", "k"))  # --methods and --k sweep those
    b.set_defaults(func=cmd_bench)
    return b


def _notify(text: str) -> None:
    print(f"speclm: {text}", file=sys.stderr, flush=True)


def trust_from_args(args: argparse.Namespace) -> TrustPolicy:
    """The contamination policy of the flags (the CLI waits for quiet unless told not to)."""
    wait = 0.0 if getattr(args, "no_wait_quiet", True) else getattr(args, "wait_quiet", 0.0)
    return TrustPolicy(min_share=getattr(args, "min_cpu_share", 0.6), max_reruns=getattr(args, "max_reruns", 3),
                       max_total_reruns=getattr(args, "max_total_reruns", None), wait_quiet_s=wait,
                       quiet_load=getattr(args, "quiet_load", None), notify=_notify)


def resolve_args(args: argparse.Namespace) -> dict:
    """Flag values with --quick (or the defaults) filling what was not given; validated."""
    base = QUICK if args.quick else DEFAULTS
    v = {key: getattr(args, key) if getattr(args, key) is not None else base[key] for key in base}
    if getattr(args, "dataset", None) and args.categories is None:
        v["categories"] = None  # a dataset's own categories, all of them
    for key in ("prompts_per_category", "repeats", "concurrency_repeats"):
        if v[key] is not None and v[key] < 1:
            raise InvalidRequestError(f"--{key.replace('_', '-')} must be >= 1, got {v[key]}")
    if any(n < 1 for n in v["concurrency"]):
        raise InvalidRequestError(f"--concurrency values must be >= 1, got {v['concurrency']}")
    cfg = BenchConfig(methods=v["methods"], ks=v["k"], temperatures=v["temperature"],
                      max_new_tokens=v["max_new_tokens"], repeats=v["repeats"], seed=args.seed,
                      concurrency=v["concurrency"], concurrency_repeats=v["concurrency_repeats"],
                      ignore_eos=args.ignore_eos, base=spec_from_args(args), trust=trust_from_args(args),
                      prefix_cache_tokens=v["prefix_cache_tokens"])
    PrefixCache(cfg.prefix_cache_tokens)  # a bad size fails before any model loads
    for method, k in cfg.configs():  # fail before loading any model
        method.spec(k)
    for t in cfg.temperatures:
        for n in cfg.max_new_tokens:
            SamplingParams(temperature=t, max_new_tokens=n, seed=args.seed)
    return {**v, "config": cfg}


def load_prompts(dataset: str | None, categories: list[str] | None, n: int | None) -> list[Prompt]:
    pool = load_dataset(dataset) if dataset else load_builtin(categories, None)
    return select(pool, categories, n)


def cmd_bench(args: argparse.Namespace) -> int:
    """Entry point of `speclm bench`."""
    endpoint = getattr(args, "endpoint", None) or getattr(args, "endpoint_b", None)
    if endpoint:
        check_endpoint_args(args)
    v = resolve_args(args)
    cfg: BenchConfig = v["config"]
    prompts = load_prompts(args.dataset, v["categories"], v["prompts_per_category"])
    if endpoint:
        return cmd_endpoint_bench(args, v, prompts)
    plan = plan_models(args.target, args.targets, args.draft, args.drafts, cfg.uses_draft())
    err = Console(stderr=True, highlight=False)
    warning = busy_warning(os.getloadavg()[0], os.cpu_count() or 1)
    if warning:
        err.print(f"[bold red]WARNING:[/] {escape(warning)}")
    out_dir = Path(args.out or Path("bench-out") / time.strftime("%Y%m%d-%H%M%S"))
    out = run_sweep(plan, prompts, cfg, out_dir, n_ctx=args.n_ctx, threads=args.threads, dataset=args.dataset,
                    variant_quality=args.variant_quality, progress=True, speculator=speculator_config(args),
                    kernels=args.kernels)
    print_sections(out["sections"])
    print(f"report: {out['report']}")
    return 0
