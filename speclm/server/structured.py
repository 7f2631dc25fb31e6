"""Structured outputs on the OpenAI API: `response_format` as the request's Grammar
(docs/server.md#structured-outputs).

- {"type": "text"} (or none): no constraint.
- {"type": "json_object"}: any JSON object.
- {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}: one JSON
  value valid under the schema. The schema is enforced whether `strict` is set or
  not (what vLLM and llama-server do): an answer that may break the schema is
  never what a client that sent one wants.
- speclm's extensions: {"type": "regex", "regex": PATTERN} and
  {"type": "lark", "lark": GRAMMAR} (llguidance's Lark dialect).

A format that does not compile against the model's vocabulary, is over speclm's
bounds (speclm/grammar_safety.py) or fails at its first token is a 400 naming
`response_format` (`tools` for the call grammar), with llguidance's message or the bound.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..constraints import Grammar, first_allowed
from ..errors import InvalidRequestError

_STRICT = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


class JsonSchemaFormat(BaseModel):
    """OpenAI's response_format.json_schema."""

    model_config = _STRICT
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's response_format, with speclm's regex and lark kinds."""

    model_config = _STRICT
    type: Literal["text", "json_object", "json_schema", "regex", "lark"]
    json_schema: JsonSchemaFormat | None = None
    regex: str | None = None
    lark: str | None = None

    def grammar(self) -> Grammar | None:
        """The Grammar this format asks for (None: free text); a ParamError-shaped
        InvalidRequestError when a kind's field is missing or set for another kind."""
        given = {k for k in ("json_schema", "regex", "lark") if getattr(self, k) is not None}
        wanted = {self.type} & {"json_schema", "regex", "lark"}
        if given - wanted:
            raise _bad(f"response_format.{sorted(given - wanted)[0]} is only read with type "
                       f"{sorted(given - wanted)[0]!r}, not {self.type!r}: drop it")
        if wanted - given:
            raise _bad(f"response_format of type {self.type!r} needs response_format.{self.type}")
        try:
            if self.type == "json_object":
                return Grammar.json_object()
            if self.type == "json_schema":
                return Grammar.json_schema(self.json_schema.schema_ or {})
            if self.type == "regex":
                return Grammar.regex(self.regex)
            if self.type == "lark":
                return Grammar.lark(self.lark)
        except InvalidRequestError as exc:
            raise _bad(f"response_format: {exc}") from None
        return None


def compiled(grammar: Grammar, backend, param: str) -> np.ndarray:
    """The tokens `grammar` allows first (bool per vocabulary entry); a 400 naming `param`
    unless it compiles against backend's vocabulary (compiled safely, within speclm's
    bounds, first mask included: constraints.matcher_for)."""
    try:
        return first_allowed(grammar, backend)
    except InvalidRequestError as exc:
        raise _bad(f"{param}: {exc}", param) from None


def _bad(message: str, param: str = "response_format") -> InvalidRequestError:
    err = InvalidRequestError(message)
    err.param = param  # api_errors.api_error answers it as a 400 naming the field
    return err
