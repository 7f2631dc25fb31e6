"""Speedup ratios over (method record, AR record) pairs of the same prompt, repeat,
T, max_new_tokens and target (`pair_with_ar`; docs/design.md#metrics). A method can stop earlier or later
than AR (T > 0, a divergence, a stop string), so every ratio is of time per
token, never of raw wall time unless the lengths match:

- speedup          AR time per output token / method time per output token:
                   (Σ AR wall / Σ AR output tokens) / (Σ method wall / Σ method output
                   tokens) = method tok/s over AR tok/s on the same prompts.
- decode_speedup   the same with each request's prefill taken out: (wall − prefill)
                   per token emitted after it (`decode_tokens`: the first round, carried
                   by the prompt's forward, counts with the prefill; design.md#the-first-token).
- prefill_speedup  AR prefill ms per prompt token / method prefill ms per prompt token.
- wall_speedup     Σ AR wall / Σ method wall over the `same_length` pairs (of `pairs`)
                   whose output lengths match; None when none match.
- speedup_dist     per-pair ratios of time per output token; prompts_faster: prompts
                   whose time per output token over their repeats is lower with the method.

With equal lengths everywhere, speedup = wall_speedup = Σ AR wall / Σ method wall.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

from ..setup.methods import BASELINE, baseline_of
from .distributions import distribution

Pair = tuple[dict, dict]
PAIR_KEYS = ("category", "prompt_index", "repeat", "temperature", "max_new_tokens", "target")


def pair_with_ar(requests: Sequence[dict]) -> list[Pair]:
    """(method record, its baseline's record of the same prompt, repeat, T and max_new_tokens):
    AR's, or for a NAME+schema method constrained AR's (setup/methods.baseline_of)."""
    bases = {baseline_of(r["method"]) for r in requests} | {BASELINE}
    ar = {(r["method"], *(r.get(k) for k in PAIR_KEYS)): r for r in requests if r["method"] in bases}
    return [(r, ar[key]) for r in requests
            if r["method"] != BASELINE and (key := (baseline_of(r["method"]), *(r.get(k) for k in PAIR_KEYS))) in ar]


def _per(recs: Sequence[dict], ms: Callable[[dict], float], tokens: Callable[[dict], float | None]) -> float | None:
    """Σ ms / Σ tokens over recs; None when a token count is missing or the sum is 0."""
    counts = [tokens(r) for r in recs]
    if any(c is None for c in counts) or sum(counts) <= 0:
        return None
    return sum(ms(r) for r in recs) / sum(counts)


def _ratio(ar: float | None, m: float | None) -> float | None:
    return ar / m if ar is not None and m else None


def _wall(r: dict) -> float:
    return r["wall_ms"]


def _decode(r: dict) -> float:
    return r["wall_ms"] - r.get("prefill_ms", 0.0)


def _out(r: dict) -> float | None:
    return r.get("output_tokens")


def decode_tokens(r: dict) -> float | None:
    """The tokens a record emitted after its prefill_ms (all of them in records that do not say)."""
    return r.get("decode_tokens", r.get("output_tokens"))


def _prompt(r: dict) -> float | None:
    return r.get("prompt_tokens") if r.get("prefill_ms") is not None else None


def per_token_ratio(pairs: Sequence[Pair], ms: Callable[[dict], float] = _wall,
                    tokens: Callable[[dict], float | None] = _out) -> float | None:
    """(Σ AR ms / Σ AR tokens) / (Σ method ms / Σ method tokens) over `pairs`."""
    return _ratio(_per([a for _, a in pairs], ms, tokens), _per([m for m, _ in pairs], ms, tokens))


def speedup_stats(pairs: Sequence[Pair]) -> dict:
    """The ratios of the module docstring for one group of pairs."""
    same = [(m, a) for m, a in pairs if m.get("output_tokens") == a.get("output_tokens")]
    if not pairs:
        return {"speedup": None, "decode_speedup": None, "prefill_speedup": None, "wall_speedup": None,
                "same_length": 0, "pairs": 0, "speedup_dist": distribution([]), "prompts_faster": 0, "prompts": 0}
    ratios = [r for m, a in pairs if (r := per_token_ratio([(m, a)])) is not None]
    per_prompt: dict[tuple, list[Pair]] = defaultdict(list)
    for m, a in pairs:
        per_prompt[(m["category"], m["prompt_index"])].append((m, a))
    faster = [per_token_ratio(ps) for ps in per_prompt.values()]
    return {"speedup": per_token_ratio(pairs), "decode_speedup": per_token_ratio(pairs, _decode, decode_tokens),
            "prefill_speedup": per_token_ratio(pairs, lambda r: r["prefill_ms"], _prompt),
            "wall_speedup": sum(a["wall_ms"] for _, a in same) / sum(m["wall_ms"] for m, _ in same) if same else None,
            "same_length": len(same), "pairs": len(pairs), "speedup_dist": distribution(ratios),
            "prompts_faster": sum(1 for r in faster if r is not None and r > 1.0), "prompts": len(per_prompt)}


def baseline_stats(recs: Sequence[dict]) -> dict:
    """speedup_stats' keys for the AR rows themselves (every ratio 1)."""
    return {"speedup": 1.0, "decode_speedup": 1.0, "prefill_speedup": 1.0, "wall_speedup": 1.0,
            "same_length": len(recs), "pairs": len(recs), "speedup_dist": distribution([1.0] * len(recs)),
            "prompts_faster": 0, "prompts": len({(r["category"], r["prompt_index"]) for r in recs})}


def worth_it(row: dict) -> bool:
    """The verdict rule: p50 per-pair speedup > 1, total speedup > 1, most prompts faster."""
    p50, total = row["speedup_dist"]["p50"], row["speedup"]
    return (p50 is not None and total is not None and p50 > 1.0 and total > 1.0
            and row["prompts_faster"] * 2 > row["prompts"])
