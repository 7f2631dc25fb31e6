"""Per-round trace and the metric definitions of docs/design.md#metrics.

One definition each, used by the CLI, the API, bench and the server:
- acceptance rate            = Σ a_r / Σ K_r
- mean acceptance length     = Σ e_r / rounds   (tokens per target forward)
- per-position acceptance[j] = #(a_r ≥ j) / #(K_r ≥ j), j = 1..max K
- accepted progress per ms   = emitted tokens / wall ms

Delivered accounting: a_r (accepted) and e_r (emitted) count only tokens the
user received. A round normally delivers its a_r accepted draft tokens plus
its last token (correction or bonus), e_r = a_r + 1. When EOS, a stop string
or max_new_tokens ends the request inside a round, the round's tokens after
the cut (the EOS token itself included) are counted in `discarded`, not in
a_r or e_r: Σ e_r over a request equals len(result.token_ids) exactly. The
acceptance rate is therefore the share of drafted tokens that reached the
output; the verifier's own count is `verified` (= a_r + discarded drafts),
and the rejection position comes from it (a stop is not a rejection).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class RoundRecord:
    """One draft → score → accept → resample round."""

    proposed: int  # K_r
    accepted: int  # a_r: draft tokens accepted by the target AND delivered
    draft_ms: float
    verify_ms: float
    other_ms: float
    note: str | None = None  # why this K was chosen (adaptive controllers)
    info: dict | None = None  # the proposer's facts about this round (SSD: hit, fan-out, waits)
    # tokens the round produced (accepted drafts, then its last token) but never
    # delivered: cut by EOS (the EOS token counts here), a stop string or the length
    discarded: int = 0
    batch_passes: list[int] | None = None  # rows of each pass of the forward, when other requests shared it
    at_ms: float | None = None  # when the round ended, ms after the request was submitted
    # prompt tokens its forward prefilled in front of its block (the first round, folded
    # with the prompt's last chunk): its verify_ms is then the prefill's, not its block's
    prompt_rows: int = 0

    @property
    def batch_tokens(self) -> int | None:
        """Tokens of the whole forward when other requests shared it."""
        return sum(self.batch_passes) if self.batch_passes else None

    @property
    def emitted(self) -> int:
        """e_r: tokens delivered by this round. A cut drops a suffix of the
        round's tokens, so its last token was delivered iff nothing was discarded."""
        return self.accepted + (1 if self.discarded == 0 else 0)

    @property
    def verified(self) -> int:
        """Draft tokens the target accepted, delivered or not (the verifier's a)."""
        return self.accepted + max(0, self.discarded - 1)

    @property
    def rejection_position(self) -> int | None:
        """1-based position of the first rejected draft token, None if all accepted."""
        return self.verified + 1 if self.verified < self.proposed else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["batch_tokens"] = self.batch_tokens
        d["emitted"] = self.emitted
        d["verified"] = self.verified
        d["rejection_position"] = self.rejection_position
        return d


@dataclass
class Summary:
    rounds: int
    proposed: int
    accepted: int  # Σ a_r (delivered)
    output_tokens: int  # tokens delivered (= Σ e_r when every token came from a round)
    acceptance_rate: float | None  # None when nothing was proposed (AR)
    mean_acceptance_length: float | None
    per_position_acceptance: list[float]
    wall_ms: float
    ttft_ms: float | None
    tpot_ms: float | None
    tokens_per_s: float
    accepted_progress_per_ms: float
    prefill_ms: float  # target forwards over the prompt: up to the first token when round 1 folds its last chunk
    draft_ms: float
    verify_ms: float
    other_ms: float
    cache_hit_rate: float | None = None  # SSD: rounds whose block was pre-drafted / rounds
    discarded: int = 0  # Σ discarded: produced by a round, never delivered (EOS / stop / length cut)
    queued_ms: float = 0.0  # submitted → admitted by a scheduler (its KV sequence taken)

    def to_dict(self) -> dict:
        return asdict(self)


def per_position_acceptance(rounds: list[RoundRecord]) -> list[float]:
    max_k = max((r.proposed for r in rounds), default=0)
    out = []
    for j in range(1, max_k + 1):
        eligible = [r for r in rounds if r.proposed >= j]
        out.append(sum(r.accepted >= j for r in eligible) / len(eligible))
    return out


def summarize(rounds: list[RoundRecord], output_tokens: int, wall_ms: float,
              ttft_ms: float | None, prefill_ms: float = 0.0, queued_ms: float = 0.0) -> Summary:
    """Aggregate a request's rounds. `output_tokens` counts tokens actually
    delivered to the user (the rounds' Σ e_r; a stop can cut a round's tail)."""
    proposed = sum(r.proposed for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    n = len(rounds)
    tpot = None
    if ttft_ms is not None and output_tokens > 1:
        tpot = (wall_ms - ttft_ms) / (output_tokens - 1)
    return Summary(
        rounds=n,
        proposed=proposed,
        accepted=accepted,
        output_tokens=output_tokens,
        acceptance_rate=accepted / proposed if proposed else None,
        mean_acceptance_length=sum(r.emitted for r in rounds) / n if n else None,
        per_position_acceptance=per_position_acceptance(rounds),
        wall_ms=wall_ms,
        ttft_ms=ttft_ms,
        tpot_ms=tpot,
        tokens_per_s=1000.0 * output_tokens / wall_ms if wall_ms > 0 else 0.0,
        accepted_progress_per_ms=output_tokens / wall_ms if wall_ms > 0 else 0.0,
        prefill_ms=prefill_ms,
        draft_ms=sum(r.draft_ms for r in rounds),
        verify_ms=sum(r.verify_ms for r in rounds if not r.prompt_rows),  # a folded round's is in prefill_ms
        other_ms=sum(r.other_ms for r in rounds),
        cache_hit_rate=cache_hit_rate(rounds),
        discarded=sum(r.discarded for r in rounds),
        queued_ms=queued_ms,
    )


def cache_hit_rate(rounds: list[RoundRecord]) -> float | None:
    """SSD: the share of rounds whose block came from the speculation cache
    (None when no round went through a speculator)."""
    ssd = [r for r in rounds if r.info and "hit" in r.info]
    return sum(bool(r.info["hit"]) for r in ssd) / len(ssd) if ssd else None


@dataclass(frozen=True)
class TokenLogprob:
    """A token and its log-probability under the target's raw logits (before the
    request's processors and temperature: OpenAI's definition), with the `top` most
    likely tokens at that position, most likely first."""

    token: int
    logprob: float | None  # None: the first prompt token (nothing before it predicts it)
    piece: bytes = b""  # the bytes the token decodes to (part of a UTF-8 character, maybe)
    top: tuple[tuple[int, float, bytes], ...] = ()  # (token, logprob, piece)

    def to_dict(self) -> dict:
        return {"token": self.token, "logprob": self.logprob, "text": self.piece.decode("utf-8", "replace"),
                "top": [[t, lp] for t, lp, _ in self.top]}


@dataclass(frozen=True)
class PredictionCounts:
    """Predicted Outputs (OpenAI's usage.completion_tokens_details): the prediction's tokens
    that appear, in order, in the completion, and the rest; they add up to its length."""

    accepted: int
    rejected: int


@dataclass
class GenerationResult:
    """What one request produced, with its trace and summary."""

    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS or stop string) | "length" | "content_filter" (no token left) | "cancelled"
    prompt_tokens: int
    method: str
    k: int
    rounds: list[RoundRecord] = field(default_factory=list)
    summary: Summary | None = None
    target: str = ""
    draft: str | None = None
    cached_prompt_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    logprobs: list[TokenLogprob] | None = None  # one per token_ids entry, when SamplingParams.logprobs asked
    prompt_logprobs: list[TokenLogprob] | None = None  # per prompt token (the first's logprob: None)
    eos_logprob: TokenLogprob | None = None  # logprobs asked and it ended on end-of-sequence: that token's entry
    prediction: PredictionCounts | None = None  # the request's prediction, used and unused
    forced_tokens: int | None = None  # a constrained request: emitted tokens drafted because its grammar forced them

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "method": self.method,
            "k": self.k,
            "target": self.target,
            "draft": self.draft,
            "metrics": self.summary.to_dict() if self.summary else None,
            **({"logprobs": [t.to_dict() for t in self.logprobs]} if self.logprobs is not None else {}),
            **({"prompt_logprobs": [t.to_dict() for t in self.prompt_logprobs]}
               if self.prompt_logprobs is not None else {}),
            **({"eos_logprob": self.eos_logprob.to_dict()} if self.eos_logprob is not None else {}),
            **({"prediction": asdict(self.prediction)} if self.prediction is not None else {}),
            **({"forced_tokens": self.forced_tokens} if self.forced_tokens is not None else {}),
            "rounds": [r.to_dict() for r in self.rounds],
        }
