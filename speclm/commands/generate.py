"""`speclm generate`: one prompt, speculatively, with the metrics table (and,
with --compare-ar, plain decoding on the same prompt: speedup and identity)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from ..backends.load import LoadConfig
from ..constraints import Grammar
from ..sampling import SamplingParams
from ..speculative.methods import get_method
from .flags import add_json_option, add_options, add_spec_options, build, open_llm, spec_from_args


def add_generate_parser(sub) -> None:
    g = sub.add_parser("generate", help="generate text, speculatively",
                       description="Generate a continuation of PROMPT and print speculative metrics.")
    g.add_argument("prompt", metavar="PROMPT", help="the prompt text ('-' reads standard input)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--compare-ar", action="store_true",
                   help="also run plain decoding on the same prompt: speedup and identity")
    g.add_argument("--prediction", metavar="FILE",
                   help="the output you expect (e.g. the file before an edit): drafts for auto and sd-suffix "
                        "(Predicted Outputs); it changes speed, never the output")
    shape = g.add_argument_group("structured output (docs/design.md#structured-outputs)").add_mutually_exclusive_group()
    shape.add_argument("--json-schema", metavar="FILE", help="the output is one JSON value valid under this schema")
    shape.add_argument("--json-object", action="store_true", help="the output is one JSON object")
    shape.add_argument("--regex", metavar="PATTERN", help="the output matches this regular expression")
    shape.add_argument("--lark", metavar="FILE", help="the output is a sentence of this Lark grammar "
                                                      "(llguidance's dialect)")
    add_json_option(g)
    add_options(g, LoadConfig, "models")
    add_options(g, SamplingParams, "sampling")
    add_spec_options(g)
    g.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    from ..api import SpecConfig
    from ..speculative.identity import compare_to_ar
    from .stats import print_stats

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    prediction = _read(args.prediction) if args.prediction else None
    params = replace(build(args, SamplingParams), grammar=_grammar(args))
    spec = spec_from_args(args)
    with open_llm(args, spec) as llm:
        if args.draft is not None:
            llm.draft  # a --draft given is checked now, even where the method drafts without it
        prompt_ids = llm.encode(prompt, chat=args.chat)
        llm.warmup(spec)
        kernels = llm.target.kernel_choice
        stream = None if args.json else _stdout_stream
        result = llm.generate(prompt_ids, params, spec, on_text=stream, prediction=prediction)
        if not args.json:
            print(flush=True)
        ar = identity = None
        if args.compare_ar and not get_method(spec.method).baseline:
            ar = llm.generate(prompt_ids, params, SpecConfig(method="ar"))
            if params.greedy or params.seed is not None:  # then plain decoding's text is the one to equal
                identity = compare_to_ar(llm.target, prompt_ids, ar.token_ids, result.token_ids, params)
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


def _grammar(args: argparse.Namespace) -> Grammar | None:
    """The Grammar the structured-output flags ask for (None: free text)."""
    if args.json_schema:
        return Grammar.json_schema(_read(args.json_schema, "JSON schema"))
    if args.json_object:
        return Grammar.json_object()
    if args.regex is not None:
        return Grammar.regex(args.regex)
    if args.lark:
        return Grammar.lark(_read(args.lark, "Lark grammar"))
    return None


def _read(path: str, what: str = "prediction") -> str:
    from ..errors import InvalidRequestError
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"cannot read the {what} file {path}: {exc}") from None


def _stdout_stream(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
