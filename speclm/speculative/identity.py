"""Greedy identity with plain decoding, and where it breaks, why.

A backend's block forward need not be bit-identical to single-token forwards
(llama.cpp's batched kernels accumulate in another order). So when greedy
speculative output differs from greedy plain output, report the first
position and plain decoding's top-1/top-2 logit margin there: a tiny margin
means a near-tie flipped by numerics, a large one means a real bug.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..backends.base import Backend


@dataclass
class IdentityReport:
    identical: bool
    compared_tokens: int
    first_divergence: int | None = None  # 0-based index into the generated tokens
    ar_token: int | None = None
    sd_token: int | None = None
    ar_top2_margin: float | None = None  # AR's logit(top-1) - logit(top-2) at the divergence

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        if self.identical:
            return f"identical ({self.compared_tokens} tokens)"
        if self.ar_top2_margin is None:
            return f"same first {self.compared_tokens} tokens, then one output ended earlier"
        return (f"differs at token {self.first_divergence} (AR {self.ar_token} vs SD {self.sd_token}; "
                f"AR top-1/top-2 logit margin {self.ar_top2_margin:.4f})")


def top2_margin(logits: np.ndarray) -> float:
    top = np.partition(logits.astype(np.float64), -2)[-2:]
    return float(top[1] - top[0])


def compare_greedy(target: Backend, prompt_ids: list[int], ar_ids: list[int],
                   sd_ids: list[int]) -> IdentityReport:
    """Compare two greedy outputs; on a divergence, measure AR's margin there
    by a single-sequence prefill of prompt + the shared prefix."""
    n = min(len(ar_ids), len(sd_ids))
    pos = next((i for i in range(n) if ar_ids[i] != sd_ids[i]), None)
    if pos is None:
        same = len(ar_ids) == len(sd_ids)
        return IdentityReport(identical=same, compared_tokens=n, first_divergence=None if same else n)
    seq = target.new_sequence()
    try:
        logits = target.prefill(seq, list(prompt_ids) + list(ar_ids[:pos]))
    finally:
        target.free(seq)
    return IdentityReport(identical=False, compared_tokens=n, first_divergence=pos,
                          ar_token=ar_ids[pos], sd_token=sd_ids[pos], ar_top2_margin=top2_margin(logits))


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
