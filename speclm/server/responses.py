"""Response bodies of the OpenAI-compatible API: completions and chat completions,
whole and as streamed chunks, with usage (speclm's speculative counters beside
OpenAI's) and logprobs in OpenAI's shapes. A chat answer that may call tools has
its calls parsed into tool_calls (tools.py)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..metrics import GenerationResult, TokenLogprob, summarize
from .text_calls import CallSpec, read_calls


class SpeculativeUsage(BaseModel):
    method: str
    k: int
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    drafted: int
    accepted: int
    cache_hit_rate: float | None = None  # SSD: rounds whose block was pre-drafted / rounds


class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens whose KV the prefix cache restored (OpenAI's field)


class CompletionTokensDetails(BaseModel):
    accepted_prediction_tokens: int  # the prediction's tokens that appear in the completion (OpenAI's)
    rejected_prediction_tokens: int  # the rest of the prediction's tokens


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails | None = None  # with a prediction
    speculative: SpeculativeUsage

    @classmethod
    def of(cls, r: GenerationResult) -> Usage:
        return cls.of_all([r])

    @classmethod
    def of_all(cls, results: list[GenerationResult]) -> Usage:
        """The usage of one request's results (several prompts: their sums; the speculative
        counters summarised over all their rounds)."""
        r0 = results[0]
        n = sum(len(r.token_ids) for r in results)
        prompt = sum(r.prompt_tokens for r in results)
        s = r0.summary if len(results) == 1 else summarize(
            [rd for r in results for rd in r.rounds], n, max(r.summary.wall_ms if r.summary else 0.0 for r in results),
            None)
        predictions = [r.prediction for r in results if r.prediction is not None]
        details = None if not predictions else CompletionTokensDetails(
            accepted_prediction_tokens=sum(p.accepted for p in predictions),
            rejected_prediction_tokens=sum(p.rejected for p in predictions))
        return cls(prompt_tokens=prompt, completion_tokens=n, total_tokens=prompt + n,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=sum(r.cached_prompt_tokens
                                                                               for r in results)),
                   completion_tokens_details=details,
                   speculative=SpeculativeUsage(
                       method=r0.method, k=r0.k, acceptance_rate=s.acceptance_rate if s else None,
                       mean_acceptance_length=s.mean_acceptance_length if s else None,
                       drafted=s.proposed if s else 0, accepted=s.accepted if s else 0,
                       cache_hit_rate=s.cache_hit_rate if s else None))


def _text(piece: bytes) -> str:
    return piece.decode("utf-8", "replace")


def chat_logprobs(entries: list[TokenLogprob]) -> dict:
    """OpenAI's chat `logprobs` object for generated tokens."""
    return {"content": [{"token": _text(e.piece), "logprob": e.logprob, "bytes": list(e.piece),
                         "top_logprobs": [{"token": _text(b), "logprob": lp, "bytes": list(b)} for _, lp, b in e.top]}
                        for e in entries], "refusal": None}


def completion_logprobs(entries: list[TokenLogprob], offset: int = 0) -> dict:
    """OpenAI's legacy completions `logprobs` object (text_offset counts characters from `offset`)."""
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(_text(e.piece))
    return {"tokens": [_text(e.piece) for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [None if e.logprob is None else {_text(b): lp for _, lp, b in e.top} for e in entries],
            "text_offset": offsets}


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: dict | None = None
    finish_reason: str | None


class _Response(BaseModel):
    id: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    usage: Usage


class CompletionResponse(_Response):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[dict] | None = None  # OpenAI's {"id", "type": "function", "function": {"name", "arguments"}}


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: dict | None = None
    finish_reason: str | None


class ChatCompletionResponse(_Response):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]


def result_logprobs(r: GenerationResult, chat: bool) -> dict | None:
    """The choice's `logprobs` for a result: generated tokens (chat), or with echo the
    prompt's tokens before them (completions), and there the end-of-sequence token the
    completion ended on last, as OpenAI lists it (its text empty); None when none were asked."""
    if chat:
        return None if r.logprobs is None else chat_logprobs(r.logprobs)
    if r.logprobs is None and r.prompt_logprobs is None:
        return None
    end = [] if r.eos_logprob is None else [replace(r.eos_logprob, piece=b"")]
    return completion_logprobs([*(r.prompt_logprobs or []), *(r.logprobs or []), *end])


def echoed(r: GenerationResult) -> str:
    """The prompt's text as its tokens decode, echoed before the completion (echo: true)."""
    return b"".join(e.piece for e in r.prompt_logprobs or []).decode("utf-8", "replace")


def chat_finish_reason(r: GenerationResult, calls: list) -> str:
    """The result's finish_reason; "tool_calls" for an answer that ended with its calls."""
    return "tool_calls" if calls and r.finish_reason == "stop" else r.finish_reason


def response_body(rid: str, model: str, results: list[GenerationResult], chat: bool,
                  tools: CallSpec | None = None, echoes: list[str | None] | None = None) -> dict:
    """The non-streaming response for finished results, one choice each in order (a chat
    request has one; a completions request one per prompt); with `tools` (the functions a chat
    answer may call) its calls are parsed into tool_calls (text_calls.read_calls). A completion with an echo (its
    prompt's text: echo: true) starts with it; one that scored its prompt (echo with
    logprobs) starts with the text its prompt tokens decode to, as its logprobs count it."""
    if chat:
        r = results[0]
        content, calls = read_calls(r.text, tools) if tools else (r.text, [])
        message = AssistantMessage(content=content, tool_calls=[c.as_dict() for c in calls] or None)
        return ChatCompletionResponse(id=rid, model=model, usage=Usage.of(r), choices=[ChatChoice(
            message=message, logprobs=result_logprobs(r, chat), finish_reason=chat_finish_reason(r, calls))]).model_dump()
    echoes = echoes or [None] * len(results)
    return CompletionResponse(id=rid, model=model, usage=Usage.of_all(results), choices=[CompletionChoice(
        index=i, text=(echoed(r) if r.prompt_logprobs is not None else echo or "") + r.text,
        logprobs=result_logprobs(r, chat), finish_reason=r.finish_reason)
        for i, (r, echo) in enumerate(zip(results, echoes))]).model_dump()


def chunk_body(rid: str, model: str, created: int, chat: bool, text: str | None = None,
               role: bool = False, finish_reason: str | None = None,
               usage: Usage | None = None, logprobs: dict | None = None, tool_calls: list[dict] | None = None) -> dict:
    """One streaming chunk in OpenAI's format (usage given: the choices-less usage chunk)."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    body: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": model}
    if usage is not None:
        return {**body, "choices": [], "usage": usage.model_dump()}
    if chat:
        delta: dict[str, str] = {"role": "assistant", "content": ""} if role else {}
        if text is not None:
            delta["content"] = text
        if tool_calls:  # OpenAI's deltas: {"index", "id", "type", "function": {"name", "arguments"}}, then
            delta["tool_calls"] = tool_calls  # {"index", "function": {"arguments": more}}
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
    return {**body, "choices": [choice]}
