"""The sections on how the methods speculate: first vs second half of each category
(analysis/halves.py), the copy ceiling (analysis/ceiling.py), SSD's speculation cache
and its projection onto hardware of its own (analysis/projection.py), Medusa heads
(analysis/heads.py)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.markup import escape

from ...costs import MIN_FORWARDS
from ..analysis.groups import GROUP_KEYS
from .cells import md_table, num
from .sections import Section


def halves_section(rows: list[dict]) -> Section:
    """Each category's first and second half side by side (no lines without halves)."""
    several_n = len({r["max_new_tokens"] for r in rows}) > 1
    pairs: dict[tuple, dict[int, dict]] = {}
    for r in rows:
        pairs.setdefault(tuple(r.get(k) for k in GROUP_KEYS), {})[r["half"]] = r
    body = []
    for by_half in pairs.values():
        a, b = by_half.get(1), by_half.get(2)
        if a is None or b is None:
            continue
        span = " / ".join(f"{h['prompt_indices'][0]}–{h['prompt_indices'][-1]}" for h in (a, b))
        body.append((a["category"] + (f" N={a['max_new_tokens']}" if several_n else ""), a["label"],
                     f"{a['temperature']:g}", span, f"{num(a['speedup'])}× → {num(b['speedup'])}×",
                     f"{num(a['acceptance_rate'], '.3f')} → {num(b['acceptance_rate'], '.3f')}",
                     f"{num(a['mean_acceptance_length'])} → {num(b['mean_acceptance_length'])}"))
    md = ["Each category's prompts run in order; half 1 is its first ⌊n/2⌋ prompts, half 2 the rest, each "
          "figure over that half's requests alone. A method that learns across requests (a shared suffix "
          "cache) should gain in the second half; the halves hold different prompts, so part of any "
          "difference is theirs.", "",
          md_table(("category", "method", "T", "prompts (1st / 2nd)", "speedup 1st → 2nd",
                    "acc rate 1st → 2nd", "mean acc len 1st → 2nd"), body)]
    return Section("First half vs second half", {"halves": rows}, md if rows else None)


def _measured(rows: Sequence[dict], c: dict) -> str:
    found = [r for r in rows if r["category"] == c["category"] and r["method"] in c["methods"]
             and r["temperature"] == 0 and r["max_new_tokens"] == c["max_new_tokens"]
             and r.get("target_name") == c["target_name"]]
    return ", ".join(f"{r['method']} K={r['k']} {r['decode_speedup']:.2f}×" for r in found
                     if r.get("decode_speedup") is not None) or "-"


def ceiling_section(ceilings: list[dict], rows: Sequence[dict], several_targets: bool) -> Section:
    """The copy ceiling beside the measured decode-only speedup (nothing without ceilings)."""
    if not ceilings:
        return Section("Copy ceiling (greedy)")
    several = len({c["target_name"] for c in ceilings}) > 1
    body = [(c["category"] + (f" [{c['target_name']}]" if several else ""), _measured(rows, c),
             _replayed(c),
             f"{c['drafter_ceiling']:.2f}× ({c['drafter_tokens_per_round']:.2f} tok/round)",
             f"{c['rematch_ceiling']:.2f}×" if "rematch_ceiling" in c else "-",
             f"{c['prediction_ceiling']:.2f}×" if "prediction_ceiling" in c else "-",
             f"{c['best_ceiling']:.2f}× ({c['best_tokens_per_round']:.2f} tok/round)") for c in ceilings]
    md = ["Decode-only speedup over AR that a perfect controller (knowing how many drafted tokens the target "
          "will accept, it picks every round's K for the least total cost) would reach with this run's cost "
          "curve v(b) (per category: the median of its requests' forwards of b rows where they ran at least "
          f"{MIN_FORWARDS}, other sizes timed after the run and scaled alike), replaying the AR "
          "outputs in run order; an estimate, which a measured figure can pass by the curve's noise. "
          "`suffix drafter`: this run's suffix drafter with a fresh cache. `rematch`: the same drafter with "
          "`--suffix-rematch` (a draft whose source runs out goes on from a new match in any source). "
          "`with prediction`: the drafter given each prompt's prediction too (Predicted Outputs; categories "
          "whose prompts carry one). `best occurrence`: an oracle "
          "that copies the longest verbatim continuation of any earlier occurrence of the last token (what "
          "copying could give at best). A measured figure near the first ceiling means the controller loses "
          "little; a low ceiling means the workload offers little to copy. `auto replayed`: method auto's "
          "controller replayed on the same outputs at the same curve without the model (`speclm bench replay`), "
          "and the share of the ceiling's gain it keeps, (speedup − 1) / (ceiling − 1).", "",
          md_table(("category", "measured decode-only", "auto replayed (kept)", "ceiling: suffix drafter",
                    "ceiling: rematch", "ceiling: with prediction", "ceiling: best occurrence"), body)]
    console = [f"copy ceiling for {escape(c['category'])}"
               f"{' on ' + escape(c['target_name']) if several_targets else ''}: "
               f"a perfect controller would reach {c['drafter_ceiling']:.2f}× AR decode-only with these suffix "
               f"drafts{_with_prediction(c)}, {c['best_ceiling']:.2f}× with the best copy (report.md)"
               for c in ceilings]
    return Section("Copy ceiling (greedy)", {"copy_ceiling": ceilings}, md, console)


def _with_prediction(c: dict) -> str:
    return f", {c['prediction_ceiling']:.2f}× given the predictions" if "prediction_ceiling" in c else ""


def _replayed(c: dict) -> str:
    if "replay_auto" not in c:
        return "-"
    kept = c["replay_kept_share"]
    return f"{c['replay_auto']:.2f}×" + (f" ({kept:.0%})" if kept is not None else "")


def ssd_section(rows: Sequence[dict]) -> Section:
    """SSD's cache hit rates and waits per row (nothing when no SSD row ran)."""
    ssd = [r for r in rows if r.get("ssd")]
    body = [(r["category"], r["label"], f"{r['temperature']:g}", f"{r['ssd']['hit_rate']:.2f}",
             " ".join(f"k={k}:{v:.2f}" for k, v in r["ssd"]["hit_rate_by_k"].items()),
             num(r["mean_acceptance_length"]), f"{r['ssd']['wait_ms_per_round']:.1f}",
             f"{r['ssd']['busy_ms_per_round']:.1f}") for r in ssd]
    md = ["hit rate: rounds whose block was pre-drafted while the target verified; by k: the same among "
          "rounds answering an outcome with k accepted tokens; wait: the verifier's wait for a block; "
          "busy: the speculator's pre-drafting time per round.", "",
          md_table(("category", "method", "T", "hit rate", "hit rate by k", "mean acc len", "wait ms/round",
                    "busy ms/round"), body)]
    return Section("SSD speculation cache", markdown=md if ssd else None)


def structured_section(rows: Sequence[dict]) -> Section:
    """Rows of categories whose prompts carry a grammar (extract, tool-call): speed against
    each row's baseline, the forced share, the rest's acceptance, valid answers."""
    shown = [r for r in rows if r.get("structured") and r["category"] != "all"]
    body = [(r["category"], r["label"], f"{r['temperature']:g}", num(r["tokens_per_s"], ".1f"),
             num(r.get("speedup")), num(r.get("decode_speedup")), num(r["structured"]["forced_share"]),
             num(r["structured"]["rest_acceptance"]),
             f"{r['structured']['valid']}/{r['structured']['answers']} ({r['structured']['stopped']} stopped)")
            for r in shown]
    md = ["NAME+schema rows decode under the prompt's grammar (docs/design.md#structured-outputs); their "
          "speedups are against ar+schema (constrained plain decoding), the other rows' against ar, and "
          "ar+schema's own against ar is the grammar's cost per token. forced: the share of output tokens "
          "the grammar forced (drafted for free); rest acc: the acceptance of the other drafted tokens; valid: "
          "answers that parse and validate against their schema, checked with jsonschema.", "",
          md_table(("category", "method", "T", "tok/s", "speedup", "decode speedup", "forced", "rest acc",
                    "valid"), body)]
    return Section("Structured outputs", {"structured": [
        {k: r.get(k) for k in ("category", "method", "k", "temperature", "tokens_per_s", "speedup",
                               "decode_speedup", "structured")} for r in shown]}, md if shown else None,
        [escape(line) for line in md[2:]] if shown else [])


def projection_section(rows: list[dict]) -> Section:
    """SSD on hardware of its own, labelled a projection (no lines without ssd and sd-draft rows)."""
    def f(x, spec=".1f"):
        return "-" if x is None else format(x, spec)

    body = [(r["category"], str(r["k"]), f"{r['temperature']:g}", f(r["ar_decode_tok_s"]), f(r["sd_decode_tok_s"]),
             f(r["ssd_decode_tok_s_measured"]), f(r["sd_decode_tok_s_modelled"]), f(r["ssd_decode_tok_s_projected"]),
             f(r["projected_vs_sd"], ".2f") + "×", f(r["projected_vs_ar"], ".2f") + "×",
             f"v={r['inputs']['verify_ms_per_round']:.0f} d={r['inputs']['draft_ms_per_token']:.0f} "
             f"h={r['inputs']['hit_rate']:.2f} w={r['inputs']['wait_ms_on_hit']:.0f} "
             f"L={r['inputs']['mean_acceptance_length_ssd']:.2f}") for r in rows]
    md = ["Decode tok/s (prefill excluded). ar, sd-draft and ssd (this machine) are measured in this run; "
          "the last columns assume the speculator runs on separate hardware equal to the target's: "
          "ssd round = v + o + h·w + (1 − h)·K̄·d, sd round = v + o + K̄·d, with v, o, d from sd-draft at the "
          "same K and h, w, K̄, L from ssd; proj/sd compares the two (see speclm/bench/analysis/projection.py).", "",
          md_table(("category", "K", "T", "ar", "sd-draft", "ssd here", "sd MODELLED", "ssd PROJECTED", "proj/sd",
                    "proj/ar", "inputs (ms)"), body)]
    console = [f"ssd K={r['k']} {escape(r['category'])} (T={r['temperature']:g}): cache hit rate "
               f"{r['inputs']['hit_rate']:.2f}, measured {r['ssd_decode_tok_s_measured']:.1f} decode tok/s here; "
               f"[bold]PROJECTION[/] with its own equal hardware {r['ssd_decode_tok_s_projected']:.1f} tok/s "
               f"= {r['projected_vs_sd']:.2f}× sd-draft K={r['k']} modelled alike (not measured; see report.md)"
               for r in rows]
    return Section("SSD with its own hardware — PROJECTION, not a measurement", {"ssd_projection": rows},
                   md if rows else None, console)


def heads_section(heads: list[dict]) -> Section:
    """Per-head acceptance, the heads' cost per round and the online curve (none without heads)."""
    body = [(r["category"], r["label"], f"{r['temperature']:g}", str(r["rounds"]),
             " ".join(f"{x:.2f}" for x in r["per_position_acceptance"] or []),
             num(r["mean_acceptance_length"]), f"{r['heads_ms_per_round']:.2f}",
             f"{r['learn_ms_per_round']:.2f}", " ".join(f"{x:.2f}" for x in r["curve"]) or "-") for r in heads]
    every = heads[0]["curve_rounds"] if heads else 0
    md = [f"Head j's acceptance is the per-position acceptance at j. Heads ms: drafting (all heads, one hidden "
          f"state) per round; learn ms: online adaptation per round (0 without --heads-online). Curve: "
          f"acceptance rate of each {every} consecutive drafting rounds, in run order.", "",
          md_table(("category", "method", "T", "rounds", "acceptance head 1..K", "mean acc len", "heads ms",
                    "learn ms", f"acceptance per {every} rounds"), body)]
    return Section("Medusa heads", {"medusa": heads}, md if heads else None)
