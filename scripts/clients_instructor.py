"""instructor against a live `speclm serve` (docs/server.md#tool-calls): TOOLS mode with a
Pydantic model holding an enum and a nested model (parameters with `$defs`), and
JSON_SCHEMA mode, five prompts each, no retries. instructor pins openai<3, so run this
from its own virtualenv (docs/results.md#c59 has the commands):

    python scripts/clients_instructor.py --base-url http://127.0.0.1:8000/v1 [--log bodies.jsonl]

Prints each answer and `MODE: passed/5`; --log writes every request body sent."""

from __future__ import annotations

import enum
import json

import httpx
import instructor
import openai
from client_args import parse
from pydantic import BaseModel

PROMPTS = ["Add a high priority task 'ship the release' owned by Ana from the platform team.",
           "Create a low priority task to water the plants; Bo from facilities owns it.",
           "New task: fix the login bug, urgent (high priority), assigned to Chen on the web team.",
           "Please track 'write the quarterly report' at medium priority for Dana in finance.",
           "Log a task 'renew the TLS certificate', medium priority, owner Eli of the ops team."]


class Priority(str, enum.Enum):
    low = "low"
    medium = "medium"
    high = "high"


class Owner(BaseModel):
    name: str
    team: str


class Task(BaseModel):
    title: str
    priority: Priority
    owner: Owner


def run(base_url: str, model: str, mode: instructor.Mode, log) -> int:
    """Asks each prompt once in `mode`; returns how many came back as a valid Task."""
    hooks = {"request": [lambda r: log and log.write(r.content.decode() + "\n")]}
    raw = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, http_client=httpx.Client(event_hooks=hooks, timeout=600))
    client = instructor.from_openai(raw, mode=mode)
    passed = 0
    for prompt in PROMPTS:
        try:
            task = client.chat.completions.create(model=model, response_model=Task, max_retries=0, temperature=0,
                                                  max_tokens=200, messages=[{"role": "user", "content": prompt}])
            passed += 1
            print(f"  ok   {task.model_dump_json()}")
        except Exception as e:  # the count is the result: show why one failed and go on
            print(f"  FAIL {type(e).__name__}: {str(e)[:300]}")
    print(f"{mode.name}: {passed}/{len(PROMPTS)}", flush=True)
    return passed


def main() -> None:
    args, log = parse(__doc__)
    results = [run(args.base_url, args.model, m, log) for m in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA)]
    raise SystemExit(0 if all(r == len(PROMPTS) for r in results) else 1)


if __name__ == "__main__":
    main()
