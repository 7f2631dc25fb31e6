"""Errors as the OpenAI API answers them: OpenAI's error body {"error": {"message", "type",
"param", "code"}} with an HTTP status, a field named as the client sent it (ParamError),
every 429 with Retry-After (RETRY_AFTER_S), and messages safe to render whatever a client
sent and free of the server's model paths."""

from __future__ import annotations

from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from ..errors import BackendError, BusyError, InvalidRequestError, SpeclmError

# Retry-After of every 429 (and of the connection budget's 503), in seconds: the
# engine frees a queue slot whenever any running request finishes, so the wait is
# short; a longer value would leave the server idle while clients sleep, and
# clients that retry (openai's) back off further on their own.
RETRY_AFTER_S = 1

class ParamError(InvalidRequestError):
    """An InvalidRequestError that names the offending request field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def printable(text: str) -> str:
    """text that renders as UTF-8 whatever a client sent: lone surrogates become \\udXXX escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def unicode_text(text: str, param: str, where: str | None = None) -> str:
    """text, or a ParamError naming `param` when it is not Unicode text a model can read
    (a lone surrogate, which JSON's \\ud800 escapes can carry, has no UTF-8 form)."""
    if printable(text) != text:
        at = next(i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF)
        raise ParamError(f"{where or param} must be valid Unicode text: it holds a lone surrogate "
                         f"{text[at].encode('utf-8', 'backslashreplace').decode()} at character {at}", param)
    return text


def quoted(text: str, limit: int = 200) -> str:
    """A client's string for an error message: repr-quoted (control characters and lone
    surrogates escaped) and cut to `limit` characters."""
    text = text if len(text) <= limit else text[:limit] + "..."
    return printable(repr(text))


# server paths a client-facing message must not show -> what it shows instead (hide_path)
_HIDDEN: dict[str, str] = {}


def hide_path(path: str, shown: str) -> None:
    """Error messages show `shown` wherever they would name `path` (a served model file's
    absolute path: the message names the file, never where it lies on the server)."""
    if path and path != shown:
        _HIDDEN[path] = shown


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error object (the message made safe to render, whatever it echoes, and
    free of the server's model paths)."""
    for path in sorted(_HIDDEN, key=len, reverse=True):
        message = message.replace(path, _HIDDEN[path])
    return {"error": {"message": printable(message), "type": type_,
                      "param": None if param is None else printable(param), "code": code}}


class APIError(Exception):
    """An error answered with `status` and OpenAI's error body."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.body = status, error_body(message, type_, param, code)
        self.headers = headers or {}  # the answer's own (429: Retry-After)

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body, self.status, headers={**self.headers, **(headers or {})})

    def __reduce__(self):  # picklable: it crosses processes in a Ray deployment
        return _api_error_of, (self.status, self.body, self.headers)


def _api_error_of(status: int, body: dict, headers: dict[str, str]) -> APIError:
    err = APIError(status, body["error"]["message"], headers=headers)
    err.body = body
    return err


def api_error(exc: BaseException) -> APIError:
    """Map an exception raised while serving a request to its HTTP answer."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ClientDisconnect):
        return APIError(499, "the client closed the connection", code="client_closed_request")
    if isinstance(exc, BusyError):  # the queue is full, or what the request needs now is all taken
        return APIError(429, str(exc), "rate_limit_error", code="rate_limit_exceeded",
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(exc, (InvalidRequestError, ValueError)):  # ValueError: a tokenizer refusing the text
        return APIError(400, str(exc), param=getattr(exc, "param", None))
    if isinstance(exc, TimeoutError):
        return APIError(504, str(exc) or "timed out", "timeout_error", code="request_timeout")
    if isinstance(exc, SpeclmError) and not isinstance(exc, BackendError):
        return APIError(503, str(exc), "server_error", code="unavailable")
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")


def validation_error(errors: list[dict]) -> APIError:
    """A 400 naming the first invalid field of a FastAPI RequestValidationError."""
    err = errors[0] if errors else {}
    if err.get("type") == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {err.get('ctx', {}).get('error', '')}")
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    loc = [p for p in loc if "[" not in p and p not in ("str", "int", "float", "bool", "list")]  # union tags
    param, msg = ".".join(loc) or None, err.get("msg", "invalid request")
    if param is None:  # the body as a whole: empty, not an object, or not sent as JSON
        return APIError(400, f"the request body must be a JSON object (Content-Type: application/json): {msg}")
    return APIError(400, f"{param}: {msg}", param=loc[0])
