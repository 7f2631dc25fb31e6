"""Render a model's own (GGUF-embedded) Jinja chat template, as HF does."""

from __future__ import annotations

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import InvalidRequestError


def _raise(message: str) -> None:
    raise InvalidRequestError(f"the chat template rejected the messages: {message}")


def render_chat(template: str, messages: list[dict[str, str]], bos_token: str = "",
                eos_token: str = "", add_generation_prompt: bool = True) -> str:
    """The prompt text for `messages` (each {"role", "content"})."""
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise InvalidRequestError(f"each chat message needs 'role' and 'content', got {m!r}")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    try:
        return env.from_string(template).render(
            messages=messages, bos_token=bos_token, eos_token=eos_token,
            add_generation_prompt=add_generation_prompt)
    except TemplateError as exc:
        raise InvalidRequestError(f"could not render the model's chat template: {exc}") from exc
