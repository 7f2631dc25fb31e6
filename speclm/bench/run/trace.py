"""The run's traces, streamed as JSONL once a request is final: rounds.jsonl (one line
per round), requests.jsonl (one per request: the attempt kept), reruns.jsonl (the
attempts a re-run superseded) and concurrency.jsonl (each concurrency request's timeline)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO

from ...metrics import GenerationResult


class TraceSink:
    """Streams per-round lines to rounds.jsonl and per-request lines to requests.jsonl
    (the attempt kept), and superseded attempts to reruns.jsonl."""

    def __init__(self, out_dir: Path):
        out_dir.mkdir(parents=True, exist_ok=True)
        self._rounds: IO[str] = open(out_dir / "rounds.jsonl", "w", encoding="utf-8")
        self._requests: IO[str] = open(out_dir / "requests.jsonl", "w", encoding="utf-8")
        self._dir, self._reruns, self._conc = out_dir, None, None

    def write(self, record: dict, result: GenerationResult) -> None:
        keys = ("request_id", "category", "method", "k", "temperature", "max_new_tokens",
                "prompt_index", "repeat", "target_name", "draft_name")
        head = {key: record[key] for key in keys if key in record}
        for i, r in enumerate(result.rounds):
            self._rounds.write(json.dumps({**head, "round": i, **r.to_dict()}) + "\n")
        self._requests.write(json.dumps(record) + "\n")
        self._rounds.flush()
        self._requests.flush()

    def concurrency(self, head: dict, submitted_ms: float, result: GenerationResult) -> None:
        """One request of a concurrency row (concurrency.jsonl, opened on first use): when it
        was submitted (ms after the row started), queued, prefilled and got its first token,
        and each round's end, block and accepted drafts, so a TTFT can be traced."""
        if self._conc is None:
            self._conc = open(self._dir / "concurrency.jsonl", "w", encoding="utf-8")
        s = result.summary
        self._conc.write(json.dumps({
            **head, "submitted_ms": submitted_ms, "queued_ms": s.queued_ms, "prefill_ms": s.prefill_ms,
            "ttft_ms": s.ttft_ms, "wall_ms": s.wall_ms, "prompt_tokens": result.prompt_tokens,
            "cached_prompt_tokens": result.cached_prompt_tokens, "output_tokens": s.output_tokens,
            "rounds": [[r.at_ms, r.proposed, r.accepted, r.verify_ms, r.batch_tokens] for r in result.rounds],
        }) + "\n")
        self._conc.flush()

    def superseded(self, record: dict) -> None:
        """A starved attempt that a re-run replaced (reruns.jsonl, opened on first use)."""
        if self._reruns is None:
            self._reruns = open(self._dir / "reruns.jsonl", "w", encoding="utf-8")
        self._reruns.write(json.dumps(record) + "\n")
        self._reruns.flush()

    def close(self) -> None:
        self._rounds.close()
        self._requests.close()
        for extra in (self._reruns, self._conc):
            if extra is not None:
                extra.close()
