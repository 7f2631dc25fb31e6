"""`speclm` command line: generate | models | serve | bench.

Every user-fixable error is printed as one line `speclm: error: ...` and the
command exits 1 (2 for usage errors, as argparse does).
"""

from __future__ import annotations

import argparse
import json
import sys

from .errors import SpeclmError

METHOD_CHOICES = ("ar", "sd-draft", "sd-ngram", "auto", "heuristic", "ssd")


def add_ssd_options(p: argparse.ArgumentParser) -> None:
    """Flags of method ssd (generate, bench, serve)."""
    s = p.add_argument_group("SSD (method ssd)")
    s.add_argument("--fanout", type=int, default=8, help="pre-drafted branches per round (default 8)")
    s.add_argument("--saguaro-c", type=float, default=1.0,
                   help="Saguaro sampling: scale the draft's top-3 mass by C in (0, 1] (default 1 = off)")
    s.add_argument("--fallback", choices=("auto", "neural", "cheap"), default="auto",
                   help="on a cache miss: draft now (neural), n-gram (cheap), or by load (auto)")
    s.add_argument("--ssd-width", type=int, default=1,
                   help="branches advanced per draft forward: 1 = most likely first (default), "
                        "= --fanout: all branches in lockstep, one batch")
    s.add_argument("--cheap-at-sessions", type=int, default=4,
                   help="--fallback auto: n-gram fallback once this many requests share the speculator (default 4)")
    s.add_argument("--speculator-threads", type=int, default=1, help="draft threads in the speculator (default 1)")
    s.add_argument("--speculator-cores", default=None, help="pin the speculator to these cores, e.g. 1 or 2,3")
    s.add_argument("--speculator-addr", default=None,
                   help="use a running `speclm speculator` at this ZeroMQ address instead of spawning one")
    s.add_argument("--target-threads", type=int, default=None,
                   help="target threads for ssd (default: --threads minus the speculator's)")
    s.add_argument("--speculator-timeout", type=float, default=10.0,
                   help="seconds to wait for a block before finishing on the synchronous path (default 10)")


def speculator_config(args: argparse.Namespace):
    from .errors import InvalidRequestError
    from .speculative.ssd.client import SpeculatorConfig
    try:
        cores = tuple(int(c) for c in args.speculator_cores.split(",")) if args.speculator_cores else None
    except ValueError:
        raise InvalidRequestError(f"--speculator-cores takes core numbers like 1 or 2,3, "
                                  f"got {args.speculator_cores!r}") from None
    if args.speculator_threads < 1 or args.speculator_timeout <= 0:
        raise InvalidRequestError("--speculator-threads must be >= 1 and --speculator-timeout > 0")
    return SpeculatorConfig(threads=args.speculator_threads, cores=cores, addr=args.speculator_addr,
                            timeout_s=args.speculator_timeout)


def _add_generate(sub) -> None:
    g = sub.add_parser("generate", help="generate text, speculatively",
                       description="Generate a continuation of PROMPT and print speculative metrics.")
    g.add_argument("prompt", metavar="PROMPT", help="the prompt text ('-' reads standard input)")
    g.add_argument("--target", default=None, help="target model: registered name or GGUF path "
                   "(default: qwen2.5-coder-1.5b)")
    g.add_argument("--draft", default=None, help="draft model for sd-draft: name or GGUF path "
                   "(default: qwen2.5-coder-0.5b when the target is the default)")
    g.add_argument("--method", choices=METHOD_CHOICES, default="auto",
                   help="default auto: K chosen every round from measured costs, plain decoding when "
                        "speculation does not pay (never measurably slower than ar in `speclm bench`)")
    g.add_argument("--k", type=int, default=4,
                   help="draft tokens per round (default 4; for auto/heuristic the maximum)")
    g.add_argument("--proposer", choices=("draft", "ngram"), default=None,
                   help="what auto/heuristic draft with (default: draft model if any, else n-gram)")
    g.add_argument("--p-min", type=float, default=0.0,
                   help="draft model: stop drafting when its top-1 probability falls below this")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--ngram-min", type=int, default=2)
    g.add_argument("--ngram-max", type=int, default=4)
    g.add_argument("--n-ctx", type=int, default=4096, help="context length per sequence")
    g.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--compare-ar", action="store_true",
                   help="also run plain decoding on the same prompt: speedup and identity")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_ssd_options(g)
    g.set_defaults(func=cmd_generate)


def _add_speculator(sub) -> None:
    # Listed for --help; main() hands its arguments to the worker's own parser.
    sub.add_parser("speculator", help="run an SSD speculator process (for --speculator-addr)")


def build_parser() -> argparse.ArgumentParser:
    from .bench.cli import add_bench_parser
    from .models.cli import add_models_parser
    from .server.cli import add_serve_parser
    parser = argparse.ArgumentParser(prog="speclm", description="Lossless speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    _add_speculator(sub)
    add_models_parser(sub)
    add_serve_parser(sub)
    add_bench_parser(sub)
    return parser


def cmd_generate(args: argparse.Namespace) -> int:
    from .api import LLM, SpecConfig
    from .report import print_stats
    from .sampling import SamplingParams
    from .speculative.identity import compare_greedy

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            min_p=args.min_p, seed=args.seed, max_new_tokens=args.max_new_tokens,
                            stop=tuple(args.stop))
    spec = SpecConfig(method=args.method, k=args.k, ngram_min=args.ngram_min, ngram_max=args.ngram_max,
                      proposer=args.proposer, p_min=args.p_min, fanout=args.fanout, saguaro_c=args.saguaro_c,
                      fallback=args.fallback, target_threads=args.target_threads, ssd_width=args.ssd_width,
                      cheap_at_sessions=args.cheap_at_sessions)
    wants_draft = args.method in ("sd-draft", "ssd") or (args.method in ("auto", "heuristic") and args.proposer != "ngram")
    draft = args.draft if wants_draft else None
    if wants_draft and draft is None and args.target is None:
        from .models.registry import DEFAULT_DRAFT
        draft = DEFAULT_DRAFT
    with LLM(target=args.target, draft=draft, n_ctx=args.n_ctx, n_threads=args.threads,
             speculator=speculator_config(args)) as llm:
        prompt_ids = llm.encode(prompt, chat=args.chat)
        llm.warmup(spec)
        stream = None if args.json else _stdout_stream
        result = llm.generate(prompt_ids, params, spec, on_text=stream)
        if not args.json:
            print(flush=True)
        ar = identity = None
        if args.compare_ar and spec.method != "ar":
            ar = llm.generate(prompt_ids, params, SpecConfig(method="ar"))
            if params.greedy:
                identity = compare_greedy(llm.target, prompt_ids, ar.token_ids, result.token_ids)
    if args.json:
        out = result.to_dict()
        if ar is not None:
            out["ar"] = {"text": ar.text, "token_ids": ar.token_ids, "metrics": ar.summary.to_dict()}
            out["speedup"] = ar.summary.wall_ms / result.summary.wall_ms
            out["identical"] = identity.identical if identity else ar.token_ids == result.token_ids
            out["identity"] = identity.to_dict() if identity else None
        print(json.dumps(out))
    else:
        print_stats(result, ar, identity)
    return 0


def _stdout_stream(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["speculator"]:
        from .speculative.ssd.worker import main as speculator_main
        return speculator_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except SpeclmError as exc:
        print(f"speclm: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("speclm: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
