"""The "Contamination" section: requests starved of CPU, their re-runs and what is left
(trust/starvation.py, trust/reruns.py)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.markup import escape

from .cells import md_table
from .sections import Section


def headline(c: dict) -> str:
    """One sentence: flagged, re-run (why), recovered, still starved."""
    p = c["policy"]
    by = ", ".join(f"{n} {why}" for why, n in c["reruns_by_reason"].items()) or "none"
    text = (f"{c['flagged']} of {c['checked']} checked requests starved of CPU (share < {p['min_cpu_share']:g} × "
            f"threads); {c['reruns']} re-run generations ({by}; cap {c['rerun_cap']}), "
            f"{c['recovered']} recovered, {len(c['still_starved'])} still starved")
    waits = [w for w in c["waits"] if w["max_wait_s"] > 0]
    if waits:
        w = waits[-1]
        text += (f"; waited {w['waited_s']:g} s for quiet (load {w['loads'][-1][1]:.2f}, threshold "
                 f"{w['threshold']:.2f}: {'quiet' if w['quiet'] else 'never quiet'})")
    return text + "."


def _share(d: dict | None) -> str:
    return "-" if not d or d.get("cpu_share") is None else f"{d['cpu_share']:.2f}"


def contamination_section(c: dict | None, reruns: Sequence[dict] = ()) -> Section:
    """`c` is trust.starvation.starvation_summary's; `reruns` the log's re-run events."""
    if not c:
        return Section("Contamination (CPU starvation) and re-runs", {"contamination": c})
    p = c["policy"]
    md = [f"A request is starved when its process CPU share (CPU s / wall s) is below "
          f"{p['min_cpu_share']:g} × the threads llama.cpp computes with; it is re-run with its AR partner "
          f"after the sweep, at most {p['max_reruns']} times each and {c['rerun_cap']} generations in all; "
          "the last attempt is the one reported (reruns.jsonl keeps the others).", "", f"**{headline(c)}**"]
    if reruns:
        body = [(e["request_id"], e["category"], str(e["prompt_index"]),
                 e["method"] + (f" K={e['k']}" if e["k"] else ""), str(e["pass"]), e["reason"],
                 _share(e["before"]), _share(e.get("after")),
                 f"{e['before']['wall_ms']:.0f} → {e['after']['wall_ms']:.0f}" if e.get("after") else "-")
                for e in reruns]
        md += ["", md_table(("request", "category", "prompt", "method", "pass", "why", "CPU share before",
                             "after", "wall ms"), body)]
    if c["still_starved"]:
        md += ["", "Still starved (their ratios are unreliable):", ""]
        md += [f"- {s['request_id']} {s['category']} #{s['prompt_index']} {s['method']}: CPU share "
               f"{_share(s)}; {s['why_not_rerun'] or 'starved again on every re-run'}" for s in c["still_starved"]]
    return Section("Contamination (CPU starvation) and re-runs", {"contamination": c}, md,
                   [f"contamination: {escape(headline(c))}"])
