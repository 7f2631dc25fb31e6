"""The --endpoint flags of `speclm bench` and the command that runs them (endpoint.py).

A failure (unreachable URL, refused key, a server that is not OpenAI-compatible,
a timeout) ends the run with one line, `speclm: error: ...` (exit 1), after
writing what was measured so far: requests.jsonl (streamed), summary.json
("partial": true, "error"), manifest.json and report.md.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from ..errors import InvalidRequestError, SpeclmError
from ..bench.trust.quiet import wait_for_quiet
from ..bench.endpoint import EndpointError, EndpointRun, base_url, connect, run_concurrency, run_sequential
from ..bench.endpoint_metrics import scrape
from ..bench.run.manifest import build_manifest
from ..bench.output.sections import print_sections, write_report
from ..bench.setup.workloads import prompt_set_hash

NOT_WITH_ENDPOINT = ("target", "targets", "draft", "drafts", "methods", "k", "variant_quality",
                     "concurrency_repeats", "prefix_cache_tokens")


def add_endpoint_options(b: argparse.ArgumentParser) -> None:
    e = b.add_argument_group("servers (--endpoint: the same prompts against OpenAI-compatible servers)")
    e.add_argument("--endpoint", default=None, metavar="URL",
                   help="benchmark the server at URL (e.g. http://127.0.0.1:8000) instead of local models")
    e.add_argument("--endpoint-b", default=None, metavar="URL",
                   help="a second server, compared with the first: B vs A per category, output identity at T=0")
    e.add_argument("--api-key", default=None, metavar="KEY",
                   help="bearer key for the servers (default $SPECLM_API_KEY; a flag is visible in `ps`)")
    e.add_argument("--api-key-b", default=None, metavar="KEY", help="key for --endpoint-b (default: --api-key)")
    e.add_argument("--endpoint-model", default=None, metavar="ID",
                   help="model id to request from A (default: the first one its /v1/models lists)")
    e.add_argument("--endpoint-model-b", default=None, metavar="ID", help="model id for B (default: its first)")
    e.add_argument("--request-timeout", type=float, default=120.0, metavar="SECONDS",
                   help="cut off any one request to a server after SECONDS (default 120)")


def check_endpoint_args(args: argparse.Namespace) -> None:
    """Refuse flags that do not apply to servers, before anything is sent."""
    if not args.endpoint:
        raise InvalidRequestError("--endpoint-b needs --endpoint URL (the server B is compared with)")
    given = [f"--{name.replace('_', '-')}" for name in NOT_WITH_ENDPOINT if getattr(args, name, None)]
    if given:
        raise InvalidRequestError(f"{', '.join(given)} do not apply with --endpoint (the servers decide what "
                                  "runs and how): drop them")
    if not args.request_timeout > 0:
        raise InvalidRequestError(f"--request-timeout must be > 0, got {args.request_timeout}")
    for url in filter(None, (args.endpoint, args.endpoint_b)):
        base_url(url)  # a malformed URL fails before anything is sent


def cmd_endpoint_bench(args: argparse.Namespace, v: dict, prompts: list) -> int:
    """`speclm bench --endpoint URL [--endpoint-b URL]`: `v` the resolved flags
    (bench.cli.resolve_args), `prompts` the prompt set they select."""
    from ..bench.endpoint_report import endpoint_sections
    cfg = v["config"]
    out_dir = Path(args.out or Path("bench-out") / time.strftime("%Y%m%d-%H%M%S"))
    out_dir.mkdir(parents=True, exist_ok=True)
    key_a = args.api_key or os.environ.get("SPECLM_API_KEY") or None
    key_b = args.api_key_b or key_a
    load_before = os.getloadavg()
    quiet = wait_for_quiet(cfg.trust, os.cpu_count() or 1)
    cfg.observed.waits.append(quiet)
    run = EndpointRun([])
    requests = open(out_dir / "requests.jsonl", "w", encoding="utf-8")

    def write(rec: dict) -> None:
        import json
        requests.write(json.dumps(rec) + "\n")
        requests.flush()

    failure: BaseException | None = None
    try:
        for label, url, key, model in (("A", args.endpoint, key_a, args.endpoint_model),
                                       ("B", args.endpoint_b, key_b, args.endpoint_model_b)):
            if url:
                run.endpoints.append(connect(label, url, key, model, args.request_timeout))
        for ep in run.endpoints:
            run.metrics_before[ep.label] = scrape(ep.url, ep.api_key, args.request_timeout)
        run_sequential(run, prompts, cfg, write)
        if cfg.concurrency:
            run_concurrency(run, prompts, cfg, lambda row: None)
        for ep in run.endpoints:
            run.metrics_after[ep.label] = scrape(ep.url, ep.api_key, args.request_timeout)
    except BaseException as exc:  # keep what was measured, then report the failure
        failure = exc
        run.error = str(exc) if isinstance(exc, SpeclmError) else f"{type(exc).__name__}: {exc}"
    finally:
        requests.close()
        run.ended = time.time()
    config = {**{k: v for k, v in cfg.to_dict().items() if k not in ("methods", "ks", "base_spec")},
              "endpoints": {"A": args.endpoint, "B": args.endpoint_b}, "request_timeout_s": args.request_timeout}
    warnings = [] if quiet["quiet"] or not cfg.trust.wait_quiet_s else [
        f"this machine never got quiet (load {quiet['loads'][-1][1]:.2f} >= {quiet['threshold']:.2f}): if a server "
        "runs here, its timings are noisy"]
    manifest = build_manifest(
        target=None, draft=None, config=config, prompts_hash=prompt_set_hash(prompts), n_prompts=len(prompts),
        categories=list(dict.fromkeys(p.category for p in prompts)), dataset=args.dataset, threads=None,
        seed=cfg.seed, load_before=load_before, load_after=os.getloadavg(), started=run.started, ended=run.ended,
        extra={"endpoints": [{"label": e.label, "url": e.url, "model": e.model} for e in run.endpoints]})
    sections = endpoint_sections(run, config, quiet, manifest, warnings)
    _, report = write_report(out_dir, sections, manifest)
    if failure is not None:
        if isinstance(failure, SpeclmError):
            raise EndpointError(f"{failure} (partial results in {out_dir})") from None
        raise failure
    print_sections(sections)
    print(f"report: {report}")
    return 0
