"""Render a model's own (GGUF-embedded) Jinja chat template, as HF does."""

from __future__ import annotations

import functools
import json

from jinja2 import Template, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import InvalidRequestError


def _raise(message: str) -> None:
    raise InvalidRequestError(f"the chat template rejected the messages: {message}")


def _tojson(value, indent=None, ensure_ascii=False, separators=None, sort_keys=False) -> str:
    """HF's `tojson`: plain json.dumps (Jinja's own escapes <, > and & for HTML)."""
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, separators=separators, sort_keys=sort_keys)


def render_chat(template: str, messages: list[dict], bos_token: str = "", eos_token: str = "",
                add_generation_prompt: bool = True, tools: list[dict] | None = None) -> str:
    """The prompt text for `messages` (each {"role", "content"}, an assistant's maybe with
    "tool_calls", a tool's with "tool_call_id") and the `tools` offered (OpenAI's shape)."""
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise InvalidRequestError(f"each chat message needs 'role' and 'content', got {m!r}")
    try:
        return _compiled(template).render(
            messages=messages, bos_token=bos_token, eos_token=eos_token,
            add_generation_prompt=add_generation_prompt, tools=tools or None)
    except TemplateError as exc:
        raise InvalidRequestError(f"could not render the model's chat template: {exc}") from exc


@functools.lru_cache(maxsize=8)
def _compiled(template: str) -> Template:
    """The template compiled once (a server renders it for every chat request; compiling
    cost more than rendering). Rendering a compiled template is thread-safe."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.filters["tojson"] = _tojson
    return env.from_string(template)
