"""Identity with plain decoding (greedy, or seeded sampling), and where it breaks, why.

A backend's block forward need not be bit-identical to single-token forwards
(llama.cpp's batched kernels accumulate in another order). So when speculative
output differs from plain output, report the first position and plain
decoding's margin there: greedy, its top-1/top-2 logit margin; seeded, the gap
between its two best Gumbel-max scores log p_v + g_v (sampling.keyed_sample),
times the temperature, so that both are in logit units. A tiny margin means a
near-tie flipped by numerics, a large one means a real bug.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..backends.base import Backend
from ..sampling import SamplingParams, position_uniforms, target_probs


@dataclass
class IdentityReport:
    identical: bool
    compared_tokens: int
    first_divergence: int | None = None  # 0-based index into the generated tokens
    ar_token: int | None = None
    sd_token: int | None = None
    ar_top2_margin: float | None = None  # AR's top-1 - top-2 margin at the divergence (logit units)
    rule: str = "greedy"  # or "seeded": what plain decoding's choice at each position was

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        if self.identical:
            return f"identical ({self.compared_tokens} tokens)"
        if self.ar_top2_margin is None:
            return f"same first {self.compared_tokens} tokens, then one output ended earlier"
        return (f"differs at token {self.first_divergence} (AR {self.ar_token} vs SD {self.sd_token}; "
                f"AR top-1/top-2 margin {self.ar_top2_margin:.4f} logits)")


def top2_margin(logits: np.ndarray) -> float:
    top = np.partition(logits.astype(np.float64), -2)[-2:]
    return float(top[1] - top[0])


def keyed_margin(logits: np.ndarray, params: SamplingParams, position: int) -> float:
    """Plain decoding's seeded decision at `position` from these logits: the gap between
    its two best scores log p_v - log E_v (sampling.keyed_sample), times the temperature
    (logit units); inf when one token alone has probability."""
    p = target_probs(logits, params)
    live = np.flatnonzero(p)
    if live.size < 2:
        return float("inf")
    e = -np.log1p(-position_uniforms(params.seed, position, p.size)[live])
    top = np.partition(np.log(p[live]) - np.log(e), -2)[-2:]
    return float(top[1] - top[0]) * params.temperature


def compare_to_ar(target: Backend, prompt_ids: list[int], ar_ids: list[int], sd_ids: list[int],
                  params: SamplingParams | None = None) -> IdentityReport:
    """Compare an output with plain decoding's under the same `params` (None or greedy:
    greedy; else seeded); on a divergence, measure AR's margin there (keyed_margin when
    seeded) by a single-sequence prefill of prompt + the shared prefix."""
    if params is not None and not params.greedy and params.seed is None:
        raise ValueError("identity with plain decoding is defined for greedy or seeded sampling only")
    greedy = params is None or params.greedy
    rule = "greedy" if greedy else "seeded"
    n = min(len(ar_ids), len(sd_ids))
    pos = next((i for i in range(n) if ar_ids[i] != sd_ids[i]), None)
    if pos is None:
        same = len(ar_ids) == len(sd_ids)
        return IdentityReport(identical=same, compared_tokens=n, first_divergence=None if same else n, rule=rule)
    seq = target.new_sequence()
    try:
        logits = target.prefill(seq, list(prompt_ids) + list(ar_ids[:pos]))
    finally:
        target.free(seq)
    margin = top2_margin(logits) if greedy else keyed_margin(logits, params, len(prompt_ids) + pos)
    return IdentityReport(identical=False, compared_tokens=n, first_divergence=pos,
                          ar_token=ar_ids[pos], sd_token=sd_ids[pos], ar_top2_margin=margin, rule=rule)


def batch_noise(backend: Backend, context: list[int], block: list[int]) -> float:
    """Max |logit| difference between scoring `block` after `context` in one
    forward and scoring it one token at a time: the backend's batch numerics.
    A greedy divergence at an AR margin below twice this is numerics, not a bug."""
    rows = []
    for one_pass in (True, False):
        seq = backend.new_sequence()
        try:
            backend.prefill(seq, context)
            rows.append(backend.score(seq, block) if one_pass
                        else np.stack([backend.score(seq, [t])[0] for t in block]))
        finally:
            backend.free(seq)
    return float(np.abs(rows[0] - rows[1]).max())
