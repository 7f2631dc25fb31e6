"""The "Variants" section of a targets × drafts sweep (analysis/pair_ranking.py): one line per
target × draft, then the best pair."""

from __future__ import annotations

from rich.markup import escape

from .cells import md_table, mib, num
from .sections import Section


def variants_section(v: dict | None) -> Section:
    """None (no sweep): no entry, no lines."""
    if v is None:
        return Section("Variants")
    ks = [str(k) for k in v["ks"]]
    header = ("target (size)", "draft (size)", "target ppl", f"agreement with {v['reference']}", "AR tok/s",
              "v(" + ")/v(".join(ks) + ") ms", "best SD tok/s (config)", "accepted progress /ms", "speedup vs AR")
    rows = [(f"`{r['target']}` ({mib(r['target_size'])})",
             "-" if r["draft"] is None else f"`{r['draft']}` ({mib(r['draft_size'])})",
             num(r["target_perplexity"], ".3f"), num(r["agreement"], ".4f"), num(r["ar_tok_s"], ".1f"),
             " / ".join(num(r["v_ms"].get(k), ".1f") for k in ks),
             "-" if r["best"] is None else f"{num(r['sd_tok_s'], '.1f')} ({r['best']['label']})",
             num(r["accepted_progress_per_ms"], ".4f"), "-" if r["speedup"] is None else f"{r['speedup']:.2f}×")
            for r in v["rows"]]
    files = [f"- `{m['name']}`: {m['file'] or '-'}, sha256 {m['sha256'] or '-'}"
             for m in {m["name"]: m for m in v["targets"] + v["drafts"]}.values()]
    drafts = [f"- draft `{d['name']}`: perplexity {num(d['perplexity'], '.3f')}, agreement with "
              f"`{v['reference']}` {num(d['agreement'], '.4f')}, v(1) {num(d['v_ms'].get('1'), '.1f')} ms"
              for d in v["drafts"]]
    md = [f"Each target measured in turn with its own AR requests. v(k): ms to score k tokens after "
          f"{v['v_context_tokens']} context tokens (median of {v['v_repeats']}); accepted progress per ms = "
          f"output tokens / wall ms of the draft config with the most (all prompts pooled); perplexity and "
          f"teacher-forced greedy agreement on the `models compare` text set"
          + ("." if v["quality"] else " (not measured: rerun with --variant-quality)."), "",
          md_table(header, rows), "", f"**{v['best_sentence']}**", "", *drafts, *files]
    return Section("Variants", {"variants": v}, md if v else None, [escape(v["best_sentence"])] if v else [])
