"""The generic tool-call format, for chat templates that render no tools
(docs/server.md#generic-tool-call-format): speclm shows the tools to the model in a
system message of its own and the model writes each call as plain text in the Hermes
shape, `<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>`. Earlier turns'
calls and the tools' results are rendered as text the same way (a result as the user's
`<tool_response>` message), so any template serves a tool loop."""

from __future__ import annotations

import json

from .tools import CALL_CLOSE, CALL_OPEN

PREAMBLE = ("You may call functions to answer. The functions, as JSON schemas:\n{tools}\n"
            f"To call one, reply with {CALL_OPEN}\\n{{\"name\": NAME, \"arguments\": {{...}}}}\\n{CALL_CLOSE} "
            "(one block per call) and nothing after the calls; its result comes back in "
            "<tool_response></tool_response>. Otherwise, answer in plain text.")


def call_text(name: str, arguments: dict) -> str:
    """One call as the generic format writes it."""
    return f"{CALL_OPEN}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{CALL_CLOSE}"


def generic_messages(messages: list[dict], tools: list[dict]) -> list[dict]:
    """`messages` (as chat templates read them) rewritten for a template without tools:
    the tools in the system message (merged into the first one, or a new one first),
    an assistant's calls appended to its text, a tool's result a user message."""
    out: list[dict] = []
    for m in messages:
        if m.get("tool_calls"):
            calls = "\n".join(call_text(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"])
            out.append({"role": "assistant", "content": f"{m['content']}\n{calls}" if m["content"] else calls})
        elif m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    if tools:
        shown = PREAMBLE.replace("{tools}", "\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{shown}"}
        else:
            out.insert(0, {"role": "system", "content": shown})
    return out
