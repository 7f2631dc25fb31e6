"""Request and response models of the OpenAI-compatible API.

Requests are validated strictly (no "5" for 5, no true for 1); unknown fields
are accepted and ignored, except the OpenAI features speclm cannot honour
(n > 1, best_of, the deprecated functions and function_call), which are
rejected (`unsupported()`) rather than silently dropped. response_format
is structured.py's; tools, tool_choice and tool calls in messages are tools.py's. Every error body has OpenAI's
shape: {"error": {"message", "type", "param", "code"}}, and an error about a
field names it as the client sent it (max_completion_tokens, not max_tokens).
Errors and their bodies are api_errors.py's.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, create_model

from ..api import SpecConfig
from ..constraints import Grammar
from ..errors import InvalidRequestError
from ..options import options_of
from ..sampling import MAX_LOGPROBS, SamplingParams
from ..speculative.config import spec_options
from ..speculative.methods import get_method
from .api_errors import ParamError, unicode_text
from .call_reading import LITERAL, Tags, token_tags
from .generic_tools import generic_messages
from .structured import ResponseFormat
from .text_calls import CallSpec
from .tools import ToolCall, ToolChoice, ToolDef, bad, call_grammar, check_choice, tools_supported

if TYPE_CHECKING:
    from ..api import LLM

_REQUEST = ConfigDict(strict=True, extra="allow")

# field -> the value(s) speclm can serve (absent, or asking for nothing); anything else is a 400.
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1), "suffix": (None, ""), "functions": (None, []), "function_call": (None, "none"),
}
_UNSUPPORTED_IN_MESSAGES: dict[str, tuple[Any, ...]] = {"function_call": (None,)}
_CHAT_ONLY = ("tools", "tool_choice", "parallel_tool_calls")  # a 400 on /v1/completions

# The most prompts one completions request may hold (each is a request of its own in the engine's queue).
MAX_PROMPTS = 64


def _refuse_unsupported(extra: dict[str, Any] | None, table: dict[str, tuple[Any, ...]], where: str = "") -> None:
    """ParamError naming the first field of `extra` (the fields the model does not
    declare) whose value is not one `table` allows; `where` prefixes its name."""
    for name, ok in table.items():
        value = (extra or {}).get(name)
        if not any(value is v or (type(value) is type(v) and value == v) for v in ok):
            shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:80] + "..."
            raise ParamError(f"{where}{name} is not supported by speclm (got {shown}): drop it", where + name)


def _speculative_options() -> type[BaseModel]:
    """The `speculative` extension (overrides of the server's default per request):
    one optional field per SpecConfig option declared `request=True`."""
    fields: dict[str, Any] = {o.name: (o.kind | None, None) for o in spec_options() if o.request}
    return create_model("SpeculativeOptions", __config__=ConfigDict(strict=True, extra="forbid"), **fields)


SpeculativeOptions = _speculative_options()

OPENAI_DEFAULTS = {"temperature": 1.0}  # where a request's default is OpenAI's, not the library's
OPENAI_RANGES = {"temperature": (0.0, 2.0), "presence_penalty": (-2.0, 2.0), "frequency_penalty": (-2.0, 2.0)}


def _sampling_fields() -> dict[str, Any]:
    """One optional request field per SamplingParams option declared `request`,
    under its request name (max_new_tokens is max_tokens, as OpenAI spells it)."""
    fields: dict[str, Any] = {}
    for o in options_of(SamplingParams):
        if o.request is None:
            continue
        if o.kind is bool:
            fields[o.request] = (bool, False)
        elif o.many:
            fields[o.request] = (o.kind | list[o.kind] | None, None)
        else:
            low, high = OPENAI_RANGES.get(o.name, (None, None))
            fields[o.request] = (o.kind | None, Field(None, ge=low, le=high))
    return fields


class StreamOptions(BaseModel):
    model_config = _REQUEST
    include_usage: bool = False


class _RequestBase(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions, beside the
    sampling fields generated from SamplingParams (`_GenerationRequest`)."""

    model_config = _REQUEST
    prompt_param: ClassVar[str] = "prompt"  # the field a too-long prompt is blamed on
    default_max_tokens: ClassVar[int | None] = 16  # OpenAI's; None: as many as fit
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    speculative: SpeculativeOptions | None = None

    def unsupported(self) -> None:
        """Raise InvalidRequestError for a feature speclm does not serve."""
        if self.n is not None and self.n > 1:
            raise ParamError(f"n > 1 is not supported (got n={self.n}): send one request per completion", "n")
        if self.n is not None and self.n < 1:
            raise ParamError(f"n must be 1, got {self.n}", "n")
        _refuse_unsupported(self.model_extra, _UNSUPPORTED)
        if isinstance(self.stop, list) and len(self.stop) > 16:
            raise ParamError(f"at most 16 stop strings, got {len(self.stop)}", "stop")

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def max_tokens_param(self) -> str:
        """The field the client set its token limit with (what errors about it name)."""
        return "max_tokens"

    def spec(self, default: SpecConfig, has_draft: bool) -> SpecConfig:
        """`default` with the request's `speculative` overrides (SpecConfig validates)."""
        opts = self.speculative.model_dump(exclude_none=True) if self.speculative else {}
        try:
            spec = default.with_options(**opts)
        except InvalidRequestError as exc:
            raise ParamError(str(exc), "speculative") from None
        method = get_method(spec.method)
        if "method" in opts and method.needs_draft(spec, has_draft) and not has_draft:
            raise ParamError(f"method {spec.method} needs a draft model: this server has none", "speculative")
        unused = [o.name for o in spec.unused_settings(method.proposal_for(spec, has_draft)) if o.name in opts]
        if unused:  # only what this request set: the server's own defaults are for several methods
            raise ParamError(f"speculative.{', speculative.'.join(unused)} {'is' if len(unused) == 1 else 'are'} "
                             f"not read by method {spec.method}: drop {'it' if len(unused) == 1 else 'them'}",
                             "speculative")
        return dataclasses.replace(spec, shared=True)

    def bind(self, llm: LLM) -> None:
        """Learn what the request's fields mean on this server's target (before grammar())."""

    def prompt_ids(self, llm: LLM) -> list[int]:
        raise NotImplementedError

    def scores_only(self) -> bool:
        """Whether the request only scores its prompt (generates nothing)."""
        return False

    def logprob_fields(self) -> dict[str, int | None]:
        """SamplingParams' logprobs and prompt_logprobs from the request's own fields."""
        return {}

    def prediction_text(self) -> str | None:
        """The request's Predicted Outputs text (None: none sent)."""
        return None

    @property
    def grammar_param(self) -> str:
        """The field a grammar that fails to compile is blamed on."""
        return "response_format"

    def calls_tools(self) -> bool:
        """Whether the answer may hold tool calls (chat with tools, tool_choice not "none")."""
        return False

    def call_spec(self) -> CallSpec | None:
        """What calls the answer may hold (None: none)."""
        return None

    def grammar(self) -> Grammar | None:
        """What the output must match (response_format; None: free text)."""
        return None if self.response_format is None else self.response_format.grammar()

    def sampling(self, max_tokens: int) -> SamplingParams:
        """The request's SamplingParams (validated there: a ParamError naming the field);
        a field the request leaves out takes OpenAI's default where it has one, else the library's."""
        given = {o.name: getattr(self, o.request) for o in options_of(SamplingParams) if o.request is not None}
        values = {name: OPENAI_DEFAULTS.get(name) if value is None else value for name, value in given.items()}
        values = {name: value for name, value in values.items() if value is not None}
        try:
            return SamplingParams(**{**values, **self.logprob_fields(), "logit_bias": self.logit_bias,
                                     "grammar": self.grammar(), "max_new_tokens": max_tokens,
                                     "shown_as": self.shown_as()})
        except InvalidRequestError as exc:
            raise self.naming(exc) from None

    def shown_as(self) -> tuple[tuple[int, str], ...]:
        """Tokens the answer's text shows as other text (SamplingParams.shown_as)."""
        return ()

    def naming(self, exc: InvalidRequestError) -> ParamError:
        """exc as a ParamError naming the request field its message starts with (the
        library's messages name the setting first: "logit_bias names token 99 ...")."""
        named = str(exc).split(" ", 1)[0]
        return ParamError(str(exc), named if named in type(self).model_fields else getattr(exc, "param", None))


_GenerationRequest = create_model("_GenerationRequest", __base__=_RequestBase, **_sampling_fields())


class PredictionContent(BaseModel):
    """OpenAI's Predicted Outputs: {"type": "content", "content": text or text parts}."""

    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["content"]
    content: str | list[ContentPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise ParamError(f"prediction content parts must be text parts, got type {part.type!r}",
                                 "prediction")
        return "".join(p.text or "" for p in self.content)


class CompletionRequest(_GenerationRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    prediction: str | PredictionContent | None = None  # speclm: Predicted Outputs on completions too

    def unsupported(self) -> None:
        """Also refuse the chat-only tool fields (a prompt has no template to show tools in)."""
        super().unsupported()
        for name in _CHAT_ONLY:
            if (self.model_extra or {}).get(name) is not None:
                raise ParamError(f"{name} is served on /v1/chat/completions only (the chat template shows "
                                 "the tools to the model): send the request there", name)

    def logprob_fields(self) -> dict[str, int | None]:
        """logprobs N: N alternatives per generated token; with echo, per prompt token too."""
        return {"logprobs": self.logprobs, "prompt_logprobs": self.logprobs if self.echo else None}

    def prediction_text(self) -> str | None:
        text = self.prediction if self.prediction is None or isinstance(self.prediction, str) \
            else self.prediction.text()
        return None if text is None else unicode_text(text, "prediction")

    def echo_text(self) -> str | None:
        """The prompt as sent, when it is text (echo: true echoes it); None for token ids."""
        prompt = self.prompt[0] if isinstance(self.prompt, list) and len(self.prompt) == 1 else self.prompt
        return prompt if isinstance(prompt, str) else None

    def scores_only(self) -> bool:
        """max_tokens 0 with echo and logprobs: score the prompt, generate nothing."""
        return self.max_tokens == 0 and self.echo and self.logprobs is not None

    def prompts(self) -> list[CompletionRequest]:
        """One request per prompt, each with a single prompt (text or token ids): OpenAI's
        four forms (a string, strings, token ids, token-id lists) answered choice by choice."""
        prompt = self.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            return [self]
        if not prompt:
            raise ParamError("prompt is an empty list: give a string, a list of strings, a list of token ids "
                             "or a list of token-id lists", "prompt")
        if len(prompt) > MAX_PROMPTS:
            raise ParamError(f"at most {MAX_PROMPTS} prompts per request, got {len(prompt)}: split them over "
                             "several requests", "prompt")
        return [self.model_copy(update={"prompt": p}) for p in prompt]

    def prompt_ids(self, llm: LLM) -> list[int]:
        """Text tokenized as `llm.encode` does; token ids pass through (one prompt: `prompts()`)."""
        if isinstance(self.prompt, list) and self.prompt and not isinstance(self.prompt[0], int):
            raise ParamError("several prompts are answered one choice each: split them with prompts()", "prompt")
        if isinstance(self.prompt, str):
            unicode_text(self.prompt, "prompt")
        return llm.encode(self.prompt)  # empty text or ids: InvalidRequestError


class ContentPart(BaseModel):
    model_config = _REQUEST
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = _REQUEST
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls, sent back in a later turn
    tool_call_id: str | None = None  # a tool message: the call it answers

    def as_template_input(self, index: int) -> dict:
        """{"role", "content"} with text parts joined (other parts are a 400), an
        assistant's tool_calls and a tool's tool_call_id as chat templates read them."""
        out: dict = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            if self.role != "assistant":
                raise ParamError(f"messages[{index}].tool_calls: only assistant messages carry tool calls",
                                 "messages")
            out["tool_calls"] = [c.as_template_input(f"messages[{index}].tool_calls[{j}]")
                                 for j, c in enumerate(self.tool_calls)]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise ParamError(f"message content part of type {part.type!r} is not supported: "
                                 "only text parts", "messages")
        return "".join(p.text or "" for p in self.content)


class ChatCompletionRequest(_GenerationRequest):
    prompt_param: ClassVar[str] = "messages"
    default_max_tokens: ClassVar[int | None] = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    prediction: PredictionContent | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    _generic: bool = PrivateAttr(False)  # tools in the generic format (generic_tools.py): see bind
    _tags: Tags = PrivateAttr(LITERAL)  # how calls' tags appear in the answer's text (call_reading.py)
    _tag_tokens: tuple[tuple[int, str], ...] = PrivateAttr(())

    def bind(self, llm: LLM) -> None:
        """Read the target's chat template: without a tool-call format of its own, calls
        use the generic one (generic_tools.py); with one whose tags are tokens of the
        vocabulary, calls are read by those tokens (call_reading.py)."""
        self._generic = not tools_supported(llm.target.chat_template() or "")
        if not self._generic:
            self._tags, self._tag_tokens = token_tags(
                lambda text: llm.target.tokenize(text, add_special=False, special=True))

    def shown_as(self) -> tuple[tuple[int, str], ...]:
        return self._tag_tokens if self.calls_tools() else ()

    @property
    def grammar_param(self) -> str:
        return "tools" if self.calls_tools() else "response_format"

    def calls_tools(self) -> bool:
        """Whether the answer may hold tool calls (tools given, tool_choice not "none")."""
        return bool(self.tools) and self.tool_choice != "none"

    def call_spec(self) -> CallSpec | None:
        """The functions the answer may call; under tool_choice "auto" calls written as JSON
        text count too (text_calls.py)."""
        if not self.calls_tools():
            return None
        return CallSpec({t.function.name: t.function.parameters for t in self.tools or []},
                        text_form=self.tool_choice in (None, "auto"), tags=self._tags)

    def grammar(self) -> Grammar | None:
        """response_format's grammar, or with tools the call format's (tools.call_grammar)."""
        if self.tool_choice is not None and not self.tools:
            if self.tool_choice == "none":
                return super().grammar()
            raise ParamError("tool_choice needs tools: declare the functions it may call", "tool_choice")
        check_choice(self.tools or [], self.tool_choice)
        answer = super().grammar()
        return call_grammar(self.tools, self.tool_choice, self.parallel_tool_calls, answer,
                            tokens=not self._generic) if self.tools else answer

    def logprob_fields(self) -> dict[str, int | None]:
        if self.top_logprobs is not None and not self.logprobs:
            raise ParamError("top_logprobs needs logprobs: true", "top_logprobs")
        return {"logprobs": (self.top_logprobs or 0) if self.logprobs else None}

    def prediction_text(self) -> str | None:
        return None if self.prediction is None else unicode_text(self.prediction.text(), "prediction")

    def prompt_ids(self, llm: LLM) -> list[int]:
        """The messages rendered with the target's chat template: its markup tokenized
        with control tokens, the contents as plain text (no message can forge a turn)."""
        messages = [m.as_template_input(i) for i, m in enumerate(self.messages)]
        for i, m in enumerate(messages):
            unicode_text(m["content"], "messages", f"messages[{i}].content")
            unicode_text(json.dumps(m, ensure_ascii=False), "messages", f"messages[{i}] (as JSON)")
        if not any(m["content"].strip() or m.get("tool_calls") for m in messages):
            raise ParamError("the messages are empty: give some text", "messages")
        tools = [t.model_dump(exclude_none=True) for t in self.tools or []]
        unicode_text(json.dumps(tools, ensure_ascii=False), "tools", "tools (as JSON)")
        for where, value in [("tools", tools), *[(f"messages[{i}].tool_calls", m.get("tool_calls"))
                                                 for i, m in enumerate(messages)]]:
            if value and llm.target.holds_control_text(json.dumps(value, ensure_ascii=False)):
                raise bad(f"{where} spells a control token of the model's vocabulary; such text would become "
                          "the token in the prompt: remove it", where.split("[")[0])
        if not tools_supported(llm.target.chat_template() or ""):
            return llm.target.tokenize_chat(generic_messages(messages, tools if self.calls_tools() else []))
        return llm.target.tokenize_chat(messages, tools or None)

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def max_tokens_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def unsupported(self) -> None:
        """Also refuse what messages carry that speclm cannot honour (tool calls)."""
        super().unsupported()
        for i, message in enumerate(self.messages):
            _refuse_unsupported(message.model_extra, _UNSUPPORTED_IN_MESSAGES, f"messages[{i}].")
