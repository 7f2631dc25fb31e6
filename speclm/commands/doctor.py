"""`speclm doctor`: what this machine can run and what speclm will use.

CPU model and instruction sets, llama.cpp's build, each kernel
configuration's probe verdict and v(b) row for the target (and the small
model the probe screens with), the configuration speclm loads, and for each
prepared verify-cheap variant of the target (`speclm models prepare --pure`)
whether it would be faster here and at what perplexity cost. It never
switches the target: outputs are lossless against a named file. The text is
what a user pastes into a bug report; --json gives the same as one object.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..backends import kernels as K
from ..backends import probe
from ..backends.load import LoadConfig
from .flags import add_json_option, add_options
from ..machine import cpu_model, isa_flags

AMX_REBUILD = ("CMAKE_ARGS=\"-DGGML_NATIVE=ON -DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' "
               "-DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'\" pip install --force-reinstall "
               "--no-deps --no-cache-dir llama-cpp-python==0.3.36")


def add_doctor_parser(subparsers) -> None:
    d = subparsers.add_parser("doctor", help="show this machine's kernels, their verdicts and costs",
                              description="Probe llama.cpp's kernel configurations on this machine (once; cached) "
                                          "and show what speclm will use, with v(b) for each.")
    add_options(d, LoadConfig, "models", skip=("draft", "n_ctx"))
    d.add_argument("--reprobe", action="store_true", help="forget this machine's verdicts and probe again "
                   "(after rebuilding llama-cpp-python, say)")
    d.add_argument("--no-quality", action="store_true", help="skip the perplexity pass over prepared variants")
    add_json_option(d)
    d.set_defaults(func=cmd_doctor)


def _model_report(name: str, work: str, request: str | None, threads: int | None) -> dict:
    from ..models.catalog import resolve_model
    path = resolve_model(name)
    choice = probe.choose_kernels(path, request, threads, work, apply=False)
    rows = {n: {"verdict": v.describe(), "v_ms": {str(b): round(ms, 1) for b, ms in sorted(v.v_ms.items())},
                "prefill_ms": round(v.prefill_ms, 1) if v.prefill_ms else None,
                **{f"{w}_tok_s": round(probe.work_rate(v.v_ms, w, 1, v.prefill_ms), 2) if v.v_ms else None
                   for w in ("speculation", "decoding")}}
            for n, v in choice.verdicts.items()}
    return {"name": name, "file": path.name, "uses": choice.name, "reason": choice.reason, "configs": rows,
            "_path": path, "_choice": choice}


def _variants_of(target: str) -> list[str]:
    from ..models.variants import list_variants
    return [v.name for v in list_variants() if v.source == target and v.state == "ready"]


def _quality(names: list[str], threads: int | None) -> dict[str, dict]:
    """Perplexity of each model on the built-in text, and greedy agreement with the first."""
    from ..backends.load import load_backend
    from ..bench.analysis import quality
    from ..bench.setup.texts import TEXT_TOKENS, load_texts
    texts, out, ref = load_texts(0), {}, None
    for name in names:
        backend = load_backend(name, TEXT_TOKENS, threads, 1)
        try:
            q = quality.measure_quality(backend, texts, ref)
        finally:
            backend.close()
        ref = ref or q
        out[name] = {"perplexity": q.perplexity, "tokens": q.ppl_tokens, "agreement": q.agreement}
    return out


def diagnose(target: str | None = None, threads: int | None = None, request: str | None = None,
             reprobe: bool = False, quality: bool = True) -> dict:
    """The doctor's findings as a JSON-able dict (probing what has not been probed)."""
    from ..models.catalog import resolve_model
    from ..models.registry import DEFAULT_TARGET
    target = target or DEFAULT_TARGET
    build = K.build_info()
    if reprobe:
        probe.forget()
    models = [_model_report(target, "speculation", request, threads)]
    small = probe._small_model_path(resolve_model(target))
    if small is not None:
        models.append(_model_report(probe.SMALL_MODEL, "speculation", request, threads))
    variants = []
    for name in _variants_of(target):
        report = _model_report(name, "speculation", request, threads)
        base = models[0]["_choice"]
        mine = report["_choice"]
        report["speedup_vs_target"] = {
            work: round(probe.work_rate(mine.v_ms, work, 1, mine.prefill_ms)
                        / probe.work_rate(base.v_ms, work, 1, base.prefill_ms), 3)
            for work in ("speculation", "decoding")}
        variants.append(report)
    if variants and quality:
        found = _quality([target] + [v["name"] for v in variants], threads)
        for v in variants:
            q, ref = found[v["name"]], found[target]
            v["perplexity"], v["target_perplexity"] = q["perplexity"], ref["perplexity"]
            v["perplexity_cost"] = q["perplexity"] / ref["perplexity"] - 1 if q["perplexity"] else None
            v["greedy_agreement"], v["quality_tokens"] = q["agreement"], q["tokens"]
    for report in models + variants:
        report.pop("_path"), report.pop("_choice")
    return {"cpu": cpu_model(), "isa": list(isa_flags()), "llama_cpp": _llama_cpp_version(),
            "system_info": build.system_info, "amx_in_build": build.amx, "verdict_file": str(probe.cache_path()),
            "machine_key": probe.machine_key(), "threads": threads, "models": models, "variants": variants,
            "kernels_env": K.check_request(None), "speclm_kernels": _native()}


def _native() -> dict:
    from .. import native
    st = native.status()
    return {"available": st.available, "isa": st.isa, "detail": st.reason}


def _llama_cpp_version() -> str | None:
    import llama_cpp
    return getattr(llama_cpp, "__version__", None)


def render(d: dict) -> str:
    lines = [f"CPU          {d['cpu']}",
             f"ISA          {' '.join(d['isa']) or '-'}",
             f"llama.cpp    llama-cpp-python {d['llama_cpp']}; {d['system_info']}",
             f"speclm       {'kernels ' + d['speclm_kernels']['detail'] if d['speclm_kernels']['available'] else 'kernels off: ' + d['speclm_kernels']['detail']}",
             f"verdicts     {d['verdict_file']} (machine key {d['machine_key']})"]
    for m in d["models"] + d["variants"]:
        lines += ["", f"{m['name']} ({m['file']})",
                  f"  {'kernels':<21}{'verdict':<31}" + "".join(f"{f'v({b})':>8}" for b in probe.TIMED_BLOCKS)
                  + f"{f'pre({probe.PREFILL_TOKENS})':>10}{'spec tok/s':>12}{'AR tok/s':>10}"]
        for name, row in m["configs"].items():
            v = row["v_ms"]
            lines.append(f"  {name:<21}{row['verdict'][:30]:<31}"
                         + "".join(f"{v.get(str(b), '-'):>8}" for b in probe.TIMED_BLOCKS)
                         + f"{row['prefill_ms'] or '-':>10}"
                         + f"{row['speculation_tok_s'] or '-':>12}{row['decoding_tok_s'] or '-':>10}")
        lines.append(f"  speclm uses: {m['uses']} ({m['reason']})")
        if "speedup_vs_target" in m:
            s = m["speedup_vs_target"]
            cost = m.get("perplexity_cost")
            quality = (f"perplexity {m['perplexity']:.3f} vs {m['target_perplexity']:.3f} ({cost:+.2%}) over "
                       f"{m['quality_tokens']} tokens, greedy agreement {m['greedy_agreement']:.3f}"
                       if cost is not None else "perplexity not measured (--no-quality)")
            lines.append(f"  vs the target: {s['speculation']:.2f}x speculation, {s['decoding']:.2f}x plain "
                         f"decoding; {quality}. Outputs are lossless against the file you load: switch with "
                         f"--target {m['name']} if that trade suits you.")
    if d["amx_in_build"]:
        crashed = any("amx" in n and not r["verdict"].startswith("ok")
                      for m in d["models"] for n, r in m["configs"].items())
        if crashed:
            lines += ["", "AMX is compiled into this llama.cpp and failed its probe here: speclm masks it and runs "
                      "the kernels a build without AMX would. To drop AMX from the build itself:", f"  {AMX_REBUILD}"]
    if not d["variants"]:
        lines += ["", "No verify-cheap variant of the target is prepared; `speclm models prepare "
                  f"{d['models'][0]['name']} --quant iq4_nl --pure` makes one, then run `speclm doctor` again."]
    return "\n".join(lines)


def cmd_doctor(args: argparse.Namespace) -> int:
    if args.n_threads is not None and args.n_threads < 1:
        from ..errors import InvalidRequestError
        raise InvalidRequestError(f"--threads must be >= 1, got {args.n_threads}")
    d = diagnose(args.target, args.n_threads, args.kernels, args.reprobe, not args.no_quality)
    print(json.dumps(d) if args.json else render(d), file=sys.stdout)
    return 0
