"""The copy ceiling: how fast the drafts of a run could have gone with a perfect controller.

A measured `auto` ÷ AR mixes two limits: what the drafter offers and what the
controller makes of it. This module separates them, per target and category,
from a run's own greedy AR outputs and its own cost curve v(b): the ms to score
a block of b rows, timed after the target's requests, per category after as many
tokens as the category's average round sees (a long context makes a one-row
step dearer relative to a block on one file, cheaper on another). Where the category's requests ran a block
size often enough, its price is what their own forwards cost instead
(`observed_curves`): a curve timed in one sitting can miss the run's v(1), and
the measured speedup the ceiling is set beside
is priced by the requests' own forwards:

- **drafter**: the AR outputs, in run order, are replayed through a fresh
  SuffixProposer (the run's suffix settings, one shared cache per target as the
  LLM has). At every position it drafts up to k_max tokens, of which the first
  r agree with what the target then emitted.
- **best occurrence**: an oracle whose draft at every position is the verbatim
  run continuing the earlier occurrence of the context's last token (in earlier
  requests, the prompt or the output so far; a run may go on into the draft
  itself, as the drafter's does) that turns out longest. The suffix
  drafter's draft is such a run (it follows occurrences of its matched suffix, at
  least one token), so this is what copying could give at best.
- **prediction**: where the prompts carry Predicted Outputs, the drafter given
  each stream's prediction as well (its first source), as `auto+prediction`
  drafts.
- **rematch**: the drafter with `rematch` on (a draft whose source runs out goes
  on from a new match of the context plus the draft, in any source: one draft
  can follow the answer from the document to earlier outputs and back), so its
  gain over the run's drafter is measured beside the best occurrence.

A perfect controller knows r at every position and picks each round's K (0..r)
to finish the output at the least cost, a round of K accepted tokens costing
v(K + 1) and emitting K + 1 (dynamic programming over positions). ceiling = AR's
cost (n rounds of v(1)) ÷ that least cost: the decode-only speedup no choice of K
beats with those drafts at those costs, and never below 1 (K = 0 throughout is
AR). It is an estimate: the curve is timed at one context length per category
and a perfect controller seeks out whichever block size timed cheap, so the
curve's noise moves it (docs/bench.md says by how much). Greedy only (T = 0): at T > 0 acceptance is random. The
report sets it beside the measured decode-only speedup of the methods that
draft by suffix.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from ...costs import cost_ratios, observed_curve
from ...sampling import SamplingParams
from ...speculative.proposers.suffix import SuffixProposer
from ...speculative.replay import Replayed, Stream, replay
from ...speculative.proposers.suffix_index import SuffixCache, SuffixConfig
from ..setup.methods import BASELINE

MATCH = 1  # tokens an occurrence must share with the context's end to count
REPEATS = 5  # timings per block size (median); each is noise a perfect controller would exploit


def drafter_runs(proposer: SuffixProposer, prompt: list[int], output: list[int], k_max: int) -> list[int]:
    """At every position i of the greedy `output`: how many of `proposer`'s (begun on prompt)
    up to k_max drafted tokens agree with output[i:]."""
    params = SamplingParams(temperature=0.0, max_new_tokens=max(1, len(output)))
    runs = []
    for i in range(len(output)):
        draft = proposer.propose(prompt + output[:i], k_max, params, None).tokens
        r = 0
        while r < len(draft) and i + r < len(output) and draft[r] == output[i + r]:
            r += 1
        runs.append(r)
    proposer.update(prompt + output)
    return runs


def _chars(ids: Sequence[int]) -> str:
    return "".join(chr(0x100 + t) for t in ids)  # one character per token: str.find does the matching


def best_occurrence_runs(history: str, prompt: list[int], output: list[int], k_max: int,
                         match: int = MATCH) -> list[int]:
    """At every position of `output`: the best-occurrence oracle's run (module docstring), at
    most k_max; `history` is _chars of the earlier requests' prompts and outputs, each after a NUL."""
    text = history + "\0" + _chars(prompt)
    out = _chars(output)
    runs = []
    for i in range(len(out)):
        seen = text + out[:i]
        key = seen[-match:] if i + len(prompt) >= match else None
        r = 0  # a run may go on into its own draft (a repeat reaching the context's end keeps copying)
        while key and r < k_max and i + r < len(out) and (seen + out[i:i + r]).find(key + out[i:i + r + 1]) >= 0:
            r += 1
        runs.append(r)
    return runs


def least_cost(runs: Sequence[int], ratio: Sequence[float]) -> tuple[float, int]:
    """(least total cost in v(1) units, its number of rounds) to emit len(runs) tokens when a
    round at position i may verify K <= runs[i] drafted tokens (all accepted) for ratio[K + 1]."""
    n = len(runs)
    cost, rounds = [0.0] * (n + 1), [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        best = min(range(min(runs[i], n - 1 - i) + 1), key=lambda k: ratio[k + 1] + cost[i + k + 1])
        cost[i], rounds[i] = ratio[best + 1] + cost[i + best + 1], 1 + rounds[i + best + 1]
    return cost[0], rounds[0]


def streams(ar: Sequence[dict], prompt_ids: dict[tuple[str, int], list[int]],
            predictions: Mapping[tuple[str, int], list[int]] | None = None) -> list[Stream]:
    """The greedy_ar records as replayable streams (run order), with their prompts' predictions."""
    return [Stream(r["category"], prompt_ids[(r["category"], r["prompt_index"])], list(r["token_ids"]),
                   r["max_new_tokens"], (predictions or {}).get((r["category"], r["prompt_index"])))
            for r in ar if r["token_ids"]]


def replay_fields(replayed: Replayed, row: dict) -> dict:
    """What method auto's controller, replayed on a category's outputs and curve, keeps of
    the suffix drafter's ceiling (speculative/replay.py)."""
    return {"replay_auto": replayed.speedup, "replay_kept_share": replayed.kept_share(row["drafter_ceiling"]),
            "replay_rounds": replayed.rounds}


def greedy_ar(requests: Sequence[dict]) -> list[dict]:
    """The AR records a ceiling is built from: greedy, first repeat, the first max_new_tokens
    (run order kept)."""
    ar = [r for r in requests if r["method"] == BASELINE and r["temperature"] == 0 and r.get("repeat", 0) == 0
          and r.get("token_ids") is not None]
    return [r for r in ar if r["max_new_tokens"] == ar[0]["max_new_tokens"]] if ar else []


def timing_context(records: Sequence[dict], prompt_ids: dict[tuple[str, int], list[int]]) -> list[int]:
    """Tokens to time a category's blocks after: as many as its average round sees (prompt plus
    half the output, averaged over its requests), cut from its longest request's tokens."""
    pairs = [(prompt_ids[(r["category"], r["prompt_index"])], list(r["token_ids"])) for r in records]
    n = round(sum(len(p) + len(o) / 2 for p, o in pairs) / len(pairs))
    texts = [p + o for p, o in pairs]
    longest = max(texts, key=len)
    return (longest * (1 + n // len(longest)))[:max(1, n)]


def read_rounds(run_dir: Path) -> list[dict]:
    """A run's rounds.jsonl lines so far ([] when it has none)."""
    path = run_dir / "rounds.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def observed_curves(timed: Mapping[str, dict[int, float]], rounds: Iterable[dict], target: str | None
                    ) -> tuple[dict[str, dict[int, float]], dict[str, dict[int, int]]]:
    """Per category of `timed`: (costs.observed_curve of its timed curve and the forwards
    `target`'s rounds ran there, the forwards counted per block size). rounds: rounds.jsonl
    lines of any method; a round run in a shared forward (batch_passes) or folded with the
    prompt's last chunk (prompt_rows) is left out, as its time is not one block's."""
    forwards: dict[str, list[tuple[int, float]]] = {cat: [] for cat in timed}
    for r in rounds:
        own_forward = not r.get("batch_passes") and not r.get("prompt_rows")
        if r.get("target_name") == target and r.get("category") in forwards and own_forward:
            forwards[r["category"]].append((r["proposed"] + 1, r["verify_ms"]))
    seen = {cat: observed_curve(curve, forwards[cat]) for cat, curve in timed.items()}
    return {cat: c for cat, (c, _) in seen.items()}, {cat: n for cat, (_, n) in seen.items()}


@dataclasses.dataclass
class Totals:
    """One category's output tokens, and the least cost (in v(1) units) and rounds a perfect
    controller needs to emit them with one drafter's runs."""

    tokens: int = 0
    cost: float = 0.0
    rounds: int = 0

    @property
    def ceiling(self) -> float:
        return self.tokens / self.cost


def least_costs(streams: Sequence[Stream], curves: Mapping[str, dict[int, float]], k_max: int,
                runs_of: Callable[[Stream], list[int]]) -> dict[str, Totals]:
    """Per category (run order): Totals over `streams` (run order) with runs_of(stream), each
    stream's accepted run at every position; runs_of sees the streams in order."""
    ratios = {cat: cost_ratios(curve, k_max) for cat, curve in curves.items()}
    out: dict[str, Totals] = {}
    for s in streams:
        cost, rounds = least_cost(runs_of(s), ratios[s.category])
        total = out.setdefault(s.category, Totals())
        total.tokens += len(s.output)
        total.cost += cost
        total.rounds += rounds
    return out


def drafter_ceiling(streams: Sequence[Stream], curves: Mapping[str, dict[int, float]], k_max: int,
                    suffix: SuffixConfig, predicted: bool = False,
                    piece: Callable[[int], bytes] | None = None) -> dict[str, Totals]:
    """least_costs of the suffix drafter with these settings (one cache shared by all the
    streams, as the LLM's is); predicted: given each stream's prediction too (piece: the
    tokenizer's bytes per token, as the live drafter has them)."""
    cache = SuffixCache()

    def runs_of(s: Stream) -> list[int]:
        proposer = SuffixProposer(cache, suffix)
        if predicted and s.prediction is not None:
            proposer.predict(s.prediction, piece)
        proposer.begin(s.prompt, SamplingParams(temperature=0.0))
        runs = drafter_runs(proposer, s.prompt, s.output, k_max)
        proposer.close()
        return runs
    return least_costs(streams, curves, k_max, runs_of)


def best_ceiling(streams: Sequence[Stream], curves: Mapping[str, dict[int, float]], k_max: int) -> dict[str, Totals]:
    """least_costs of the best-occurrence oracle over the streams' earlier prompts and outputs."""
    history = ""

    def runs_of(s: Stream) -> list[int]:
        nonlocal history
        runs = best_occurrence_runs(history, s.prompt, s.output, k_max)
        history += "\0" + _chars(s.prompt) + _chars(s.output)
        return runs
    return least_costs(streams, curves, k_max, runs_of)


def copy_ceiling(ar: Sequence[dict], prompt_ids: dict[tuple[str, int], list[int]],
                 curves: Mapping[str, dict[int, float]], *, k_max: int = 16,
                 suffix: SuffixConfig | None = None, methods: Sequence[str] = (),
                 predictions: Mapping[tuple[str, int], list[int]] | None = None,
                 piece: Callable[[int], bytes] | None = None) -> list[dict]:
    """One row per category (run order) from one target's greedy_ar records (run order).
    prompt_ids: (category, index) -> the ids the run encoded; curves: category -> v(b) in ms.
    `methods`: the run's methods that draft by suffix (the report compares them). Beside the
    run's drafter, the same drafter with rematch on (a draft may go on from another source),
    and in a category whose prompts carry `predictions` ((category, index) -> ids), the
    drafter given them (piece: the tokenizer's bytes per token)."""
    suffix = suffix or SuffixConfig()
    runs = streams(ar, prompt_ids, predictions)
    mine = drafter_ceiling(runs, curves, k_max, suffix)
    predicted = drafter_ceiling(runs, curves, k_max, suffix, predicted=True, piece=piece)
    has_prediction = {s.category for s in runs if s.prediction is not None}
    multi = drafter_ceiling(runs, curves, k_max, dataclasses.replace(suffix, rematch=True))
    best = best_ceiling(runs, curves, k_max)
    return [{"category": cat, "target_name": ar[0].get("target_name"),
             "max_new_tokens": ar[0]["max_new_tokens"], "k_max": k_max, "tokens": t.tokens,
             "methods": list(methods), "v_ms": {str(b): round(ms, 2) for b, ms in curves[cat].items()},
             "suffix": dataclasses.asdict(suffix),
             "drafter_rounds": t.rounds, "drafter_tokens_per_round": t.tokens / t.rounds,
             "drafter_ceiling": t.ceiling,
             "rematch_rounds": multi[cat].rounds, "rematch_ceiling": multi[cat].ceiling,
             "best_rounds": best[cat].rounds, "best_tokens_per_round": t.tokens / best[cat].rounds,
             "best_ceiling": best[cat].ceiling,
             **({"prediction_rounds": predicted[cat].rounds, "prediction_ceiling": predicted[cat].ceiling}
                if cat in has_prediction else {})} for cat, t in mine.items()]


@dataclasses.dataclass
class CeilingInput:
    """One target's copy ceiling, as gathered while it was loaded: its greedy_ar records,
    the ids its prompts were encoded to ((category, index) -> ids), the curves timed after
    its requests (category -> {b: ms}), its prompts' predictions as ids, and the bytes of
    every token those hold (the predicted drafter realigns by them)."""

    target_name: str | None
    ar: list[dict]
    prompt_ids: dict[tuple[str, int], list[int]]
    timed: dict[str, dict[int, float]]
    predictions: dict[tuple[str, int], list[int]]
    pieces: dict[int, bytes]


def copy_ceilings(inputs: Sequence[CeilingInput], rounds: Sequence[dict], *, methods: Sequence[str], k_max: int,
                  suffix: SuffixConfig) -> tuple[list[dict], list[dict]]:
    """(copy_ceiling rows of every target, each category priced by observed_curves of its
    timed curve and the run's `rounds`, with what method auto's controller keeps of it
    replayed on the same outputs and curves; the greedy streams as streams.jsonl's lines)."""
    rows: list[dict] = []
    lines: list[dict] = []
    for c in inputs:
        seen, forwards = observed_curves(c.timed, rounds, c.target_name)
        # rounded once, as summary.json stores them, so `speclm bench replay` prices exactly as this run did
        curves = {cat: {b: round(ms, 2) for b, ms in curve.items()} for cat, curve in seen.items()}
        mine = copy_ceiling(c.ar, c.prompt_ids, curves, k_max=k_max, suffix=suffix, methods=methods,
                            predictions=c.predictions, piece=c.pieces.__getitem__)
        runs = streams(c.ar, c.prompt_ids, c.predictions)
        replayed = {r.category: r for r in replay(runs, curves, k_max=k_max, suffix=suffix)}
        for row in mine:
            row["timed_v_ms"] = {str(b): round(ms, 2) for b, ms in c.timed[row["category"]].items()}
            row["forwards"] = {str(b): n for b, n in forwards[row["category"]].items()}
            row.update(replay_fields(replayed[row["category"]], row))
        rows += mine
        lines += [{"target_name": c.target_name, **dataclasses.asdict(s)} for s in runs]
    return rows, lines
