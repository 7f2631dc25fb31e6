"""`speclm bench --endpoint URL [--endpoint-b URL]`: the bench's prompts against one or two
running OpenAI-compatible servers (client.py): the latency phase, then the concurrency
rows (run.py), reported as the local bench is (report.py). A server keeps what it is
sent, so each phase gets prompts of its own when the prompt set allows, else is
flagged a replay, and no row has more in flight than its prompts (trust/phases.py).

Traffic goes only to the URLs given: GET /v1/models once per server (the model id and a
compatibility check), GET /metrics before and after (metrics.py), and run.py's requests.
A failure (unreachable URL, refused key, a server that is not OpenAI-compatible, a
timeout) stops the run; what was measured so far is written (requests.jsonl, streamed;
summary.json with "partial": true and the "error"; manifest.json; report.md) and then
the failure is raised, naming where the partial results are.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...errors import SpeclmError
from ..output.sections import write_report
from ..run.manifest import build_manifest
from ..setup.config import BenchConfig
from ..setup.workloads import Prompt, prompt_set_hash
from ..trust import phases
from ..trust.quiet import client_never_quiet, wait_for_quiet
from .client import EndpointError, connect
from .metrics import scrape
from .report import endpoint_sections
from .run import EndpointRun, run_concurrency, run_sequential


@dataclass(frozen=True)
class Endpoint:
    """A server under test, as the command names it: label ('A' or 'B'), URL, API keys (several: as many
    tenants), model id (None: its first), and the key /metrics is read with (a speclm
    server's operator key; None: the first API key)."""

    label: str
    url: str
    api_keys: tuple[str, ...]
    model: str | None
    metrics_key: str | None = None


def bench_endpoints(servers: Sequence[Endpoint], prompts: Sequence[Prompt], cfg: BenchConfig, out_dir: Path, *,
                    timeout: float, dataset: str | None = None) -> dict:
    """Benchmark `servers` on `prompts` and write every output into out_dir; returns
    {"summary", "manifest", "report" (report.md's path), "sections" (for the console)}.
    `timeout`: seconds any one request may take."""
    out_dir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    quiet = wait_for_quiet(cfg.trust, os.cpu_count() or 1)
    cfg.observed.waits.append(quiet)
    passes, rows = phases.plan(prompts, cfg, forgets=False)  # a server keeps what it was sent
    run = EndpointRun([])
    failure: BaseException | None = None
    with open(out_dir / "requests.jsonl", "w", encoding="utf-8") as requests:
        def write(rec: dict) -> None:
            requests.write(json.dumps(rec) + "\n")
            requests.flush()
        try:
            for s in servers:
                run.endpoints.append(connect(s.label, s.url, list(s.api_keys), s.model, timeout))
            metrics_keys = {s.label: s.metrics_key or next(iter(s.api_keys), None) for s in servers}
            for ep in run.endpoints:
                run.metrics_before[ep.label] = scrape(ep.url, metrics_keys[ep.label], timeout)
            run_sequential(run, passes, cfg, write)
            run_concurrency(run, rows, cfg, lambda row: None)
            for ep in run.endpoints:
                run.metrics_after[ep.label] = scrape(ep.url, metrics_keys[ep.label], timeout)
        except BaseException as exc:  # keep what was measured, then report the failure
            failure = exc
            run.error = str(exc) if isinstance(exc, SpeclmError) else f"{type(exc).__name__}: {exc}"
    run.ended = time.time()
    config = {**{k: v for k, v in cfg.to_dict().items() if k not in ("methods", "ks", "base_spec")},
              "endpoints": {"A": None, "B": None, **{s.label: s.url for s in servers}}, "request_timeout_s": timeout}
    manifest = build_manifest(
        target=None, draft=None, config=config, prompts_hash=prompt_set_hash(prompts), n_prompts=len(prompts),
        categories=list(dict.fromkeys(p.category for p in prompts)), dataset=dataset, threads=None,
        seed=cfg.seed, load_before=load_before, load_after=os.getloadavg(), started=run.started, ended=run.ended,
        extra={"endpoints": [{"label": e.label, "url": e.url, "model": e.model, "tenants": len(e.clients)}
                             for e in run.endpoints]})
    warnings = client_never_quiet(quiet) + phases.warnings(passes + rows)
    sections = endpoint_sections(run, config, quiet, manifest, warnings, passes + rows)
    summary, report = write_report(out_dir, sections, manifest)
    if isinstance(failure, SpeclmError):
        raise EndpointError(f"{failure} (partial results in {out_dir})") from None
    if failure is not None:
        raise failure
    return {"summary": summary, "manifest": manifest, "report": report, "sections": sections}
