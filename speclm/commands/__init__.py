"""`speclm` command line: generate | models | serve | bench | heads | doctor.

Every user-fixable error is printed as one line `speclm: error: ...` and the
command exits 1 (2 for usage errors, as argparse does).
"""

from __future__ import annotations

import argparse
import json
import sys

from .options import add_kernels_option, add_spec_options, draft_for, kernels_for, spec_from_args, speculator_config
from ..errors import SpeclmError


def _add_generate(sub) -> None:
    g = sub.add_parser("generate", help="generate text, speculatively",
                       description="Generate a continuation of PROMPT and print speculative metrics.")
    g.add_argument("prompt", metavar="PROMPT", help="the prompt text ('-' reads standard input)")
    g.add_argument("--target", default=None, help="target model: registered name or GGUF path "
                   "(default: qwen2.5-coder-1.5b)")
    g.add_argument("--draft", default=None, help="draft model for sd-draft: name or GGUF path "
                   "(default: qwen2.5-coder-0.5b when the target is the default)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--n-ctx", type=int, default=4096, help="context length per sequence")
    g.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    add_kernels_option(g)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--compare-ar", action="store_true",
                   help="also run plain decoding on the same prompt: speedup and identity")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_spec_options(g)
    g.set_defaults(func=cmd_generate)


def _add_speculator(sub) -> None:
    # Listed for --help; main() hands its arguments to the worker's own parser.
    sub.add_parser("speculator", help="run an SSD speculator process (for --speculator-addr)")


def build_parser() -> argparse.ArgumentParser:
    from .bench import add_bench_parser
    from .doctor import add_doctor_parser
    from .heads import add_heads_parser
    from .models import add_models_parser
    from .serve import add_serve_parser
    parser = argparse.ArgumentParser(prog="speclm", description="Lossless speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    _add_speculator(sub)
    add_models_parser(sub)
    add_serve_parser(sub)
    add_bench_parser(sub)
    add_heads_parser(sub)
    add_doctor_parser(sub)
    return parser


def cmd_generate(args: argparse.Namespace) -> int:
    from ..api import LLM, SpecConfig
    from .stats import print_stats
    from ..sampling import SamplingParams
    from ..speculative.identity import compare_greedy

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            min_p=args.min_p, seed=args.seed, max_new_tokens=args.max_new_tokens,
                            stop=tuple(args.stop))
    spec = spec_from_args(args)
    with LLM(target=args.target, draft=draft_for(args, spec), n_ctx=args.n_ctx, n_threads=args.threads,
             speculator=speculator_config(args), kernels=args.kernels, kernels_for=kernels_for(spec)) as llm:
        if args.draft is not None:
            llm.draft  # a --draft given is checked now, even where the method drafts without it
        prompt_ids = llm.encode(prompt, chat=args.chat)
        llm.warmup(spec)
        kernels = llm.target.kernel_choice
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
        out["kernels"] = kernels.to_dict() if kernels is not None else None
        if ar is not None:
            out["ar"] = {"text": ar.text, "token_ids": ar.token_ids, "metrics": ar.summary.to_dict()}
            out["speedup"] = ar.summary.wall_ms / result.summary.wall_ms
            out["identical"] = identity.identical if identity else ar.token_ids == result.token_ids
            out["identity"] = identity.to_dict() if identity else None
        print(json.dumps(out))
    else:
        print_stats(result, ar, identity, kernels)
    return 0


def _stdout_stream(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["speculator"]:
        from ..speculative.ssd.worker import main as speculator_main
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
