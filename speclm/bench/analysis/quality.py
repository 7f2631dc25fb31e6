"""Model quality on the text set (setup/texts.py): perplexity, and greedy agreement with
a reference model, teacher-forced on the same tokens (`measure_quality`); shared by
`speclm models compare` (model_compare.py), the bench's variant sweep (run/models.py)
and `speclm doctor`. And a model's speed on it: `timing_block` cuts the context and
block that v(k) is timed on (speclm.costs), `v_summary` writes the timings as JSON,
and `model_line` puts both in a model's line of the variants section.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from ...backends.base import Backend
from ...costs import clock_ms, time_blocks
from ..setup.texts import TEXT_TOKENS

CONTEXT = 64  # tokens before the timed block
CHUNK = 128  # tokens per score() call in the perplexity pass
V_KS = (1, 4, 8, 16)  # the block sizes v(k) is timed at per model (the variants section)
V_REPEATS = 3


def _log_softmax_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log p(target) per row, log-softmax in float64."""
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
    return lse - x[np.arange(len(targets)), targets]


def quality_pass(backend, token_lists: Sequence[Sequence[int]], chunk: int = CHUNK) -> tuple[float, int, list[np.ndarray]]:
    """(sum of NLL, predicted tokens, argmax next token per position per text), teacher-forced.

    Each text is scored in one sequence, ``chunk`` tokens per score() call (so
    every position sees the whole text before it)."""
    nll, count, argmaxes = 0.0, 0, []
    for toks in token_lists:
        seq = backend.new_sequence()
        try:
            tops = []
            for start in range(0, len(toks), chunk):
                block = list(toks[start:start + chunk])
                logits = backend.score(seq, block)
                targets = np.asarray(toks[start + 1:start + 1 + len(block)], dtype=np.int64)
                rows = logits[:len(targets)]
                if len(targets):
                    nll += float(_log_softmax_nll(rows, targets).sum())
                    count += len(targets)
                tops.append(rows.argmax(axis=1))
        finally:
            backend.free(seq)
        argmaxes.append(np.concatenate(tops) if tops else np.zeros(0, dtype=np.int64))
    return nll, count, argmaxes


@dataclass
class Quality:
    """One model's pass over the text set: its tokens, argmax per position, perplexity,
    and greedy agreement with a reference model's pass (None when not comparable)."""

    tokens: list[list[int]]
    argmaxes: list[np.ndarray]
    vocab_size: int
    perplexity: float | None
    ppl_tokens: int
    seconds: float
    same_tokenizer: bool
    agreement: float | None
    note: str | None = None
    ran: bool = True  # False: only tokenized (measure_quality's run=False)


def measure_quality(backend, text_set: Sequence[tuple[str, str]], ref: Quality | None = None,
                    run: bool = True) -> Quality:
    """Perplexity of ``backend`` on ``text_set`` (setup/texts.py) and its teacher-forced
    greedy agreement with ``ref`` (1.0 when ``ref`` is None: this is the reference).
    ``run=False`` only tokenizes (perplexity and agreement None)."""
    toks = [backend.tokenize(t)[:TEXT_TOKENS] for _, t in text_set]
    t0 = clock_ms()
    nll, count, argmaxes = quality_pass(backend, toks if run else [])
    q = Quality(toks, argmaxes, backend.vocab_size, float(np.exp(nll / count)) if count else None, count,
                round((clock_ms() - t0) / 1000, 2), True, None, None if run else "quality pass skipped", run)
    return compared(q, ref)


def compared(q: Quality, ref: Quality | None) -> Quality:
    """``q`` with its greedy agreement with ``ref``'s pass over the same text set: 1.0 when
    ``ref`` is None (``q`` is the reference), None with a note where their tokens differ,
    None where ``q``'s pass did not run."""
    same = ref is None or (q.vocab_size == ref.vocab_size and q.tokens == ref.tokens)
    if not q.ran:
        return replace(q, same_tokenizer=same)
    if not same:
        return replace(q, same_tokenizer=False, agreement=None,
                       note="different tokenizer: not comparable position by position")
    if ref is None:
        return replace(q, same_tokenizer=True, agreement=1.0)
    total = sum(len(x) for x in q.argmaxes)
    agree = sum(int((x == y).sum()) for x, y in zip(q.argmaxes, ref.argmaxes)) / total if total else None
    return replace(q, same_tokenizer=True, agreement=agree)


def timing_block(token_lists: Sequence[Sequence[int]], max_k: int) -> tuple[list[int], list[int]]:
    """(CONTEXT tokens of context, max_k tokens to score) from the first long enough text
    (a short text set: the longest text repeated)."""
    text = next((t for t in token_lists if len(t) >= CONTEXT + max_k), None)
    if text is None:
        longest = max(token_lists, key=len)
        text = (list(longest) * (1 + (CONTEXT + max_k) // max(1, len(longest))))[:CONTEXT + max_k]
    return list(text[:CONTEXT]), list(text[CONTEXT:CONTEXT + max_k])


def v_summary(times: dict[int, list[float]]) -> dict:
    """{"v_ms": median ms per k, "v_ms_all": every timing} with string keys (JSON)."""
    return {"v_ms": {str(k): round(statistics.median(ts), 2) for k, ts in times.items()},
            "v_ms_all": {str(k): [round(t, 2) for t in ts] for k, ts in times.items()}}


def model_line(described: dict, q: Quality | None, ref: Quality | None, backend: Backend,
               tokens: Sequence[Sequence[int]]) -> dict:
    """A model's line in the variants section: its file (run/manifest.describe_model's dict),
    its pass over the text set compared with the reference's (`compared`; q None: no pass),
    and v(k) at V_KS after CONTEXT tokens of `tokens` (median of V_REPEATS)."""
    if q is not None:
        q = compared(q, ref)
    context, block = timing_block(tokens, max(V_KS))
    return {"name": described["name"], "file": described.get("path"), "size": described.get("size"),
            "sha256": described.get("sha256"), "source": described.get("source"), "quant": described.get("quant"),
            "perplexity": q and q.perplexity, "ppl_tokens": q.ppl_tokens if q else 0,
            "agreement": q and q.agreement, "agreement_note": q.note if q else "quality pass skipped",
            **v_summary(time_blocks([backend], context, block, V_KS, V_REPEATS)[0])}
