"""A local stand-in for Anthropic's and OpenAI's HTTP APIs, for testing the providers through the
real SDK clients without a network.

``FakeLLM`` serves ``POST /v1/messages`` (Anthropic) and ``POST /v1/chat/completions`` (OpenAI and
compatible servers) on 127.0.0.1 from a thread. It answers each request with the next scripted
``Reply`` (build them with ``anthropic_message``, ``openai_completion``, ``error`` and ``stall``)
and records every request (path, headers, JSON body) so tests can assert on the exact wire format.

    with FakeLLM() as fake:
        fake.reply(error(429, "slow down", retry_after_ms=1), anthropic_message("hi"))
        client = anthropic.Anthropic(api_key="k", base_url=fake.base_url)
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Sequence

ANTHROPIC_PATH = "/v1/messages"
OPENAI_PATH = "/v1/chat/completions"
_ids = itertools.count(1)


@dataclass
class Reply:
    """One scripted answer."""

    status: int = 200
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    error: str = ""
    """An error reply's message; its body is written in the format of the path that gets it."""
    stall_s: float = 0.0
    """Wait this long before answering (longer than the client's timeout: a stalled server)."""
    before: Callable[[], None] | None = None
    """Run when this reply is taken, before it is sent (a test plants a file while the model "thinks")."""


@dataclass
class Request:
    """One request as it reached the server."""

    path: str
    headers: dict[str, str]
    """Names in lower case."""
    body: dict[str, Any]
    at: float = field(default_factory=time.monotonic)
    """When it arrived (time.monotonic)."""


def anthropic_message(text: str = "", tool_calls: Sequence[tuple[str, str, dict[str, Any]]] = (), *,
                      stop_reason: str | None = None, input_tokens: int = 12, output_tokens: int = 7,
                      cache_read: int = 0, cache_write: int = 0, model: str = "claude-test") -> Reply:
    """A Messages API reply: a text block (when ``text``), then a tool_use block per (id, name, input)."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [{"type": "tool_use", "id": cid, "name": name, "input": args} for cid, name, args in tool_calls]
    return Reply(body={
        "id": f"msg_{next(_ids):024d}", "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": stop_reason or ("tool_use" if tool_calls else "end_turn"), "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens,
                  "cache_read_input_tokens": cache_read, "cache_creation_input_tokens": cache_write},
    })


def openai_completion(text: str | None = None, tool_calls: Sequence[tuple[str, str, dict[str, Any] | str]] = (), *,
                      finish_reason: str | None = None, prompt_tokens: int | None = 20, completion_tokens: int = 9,
                      cached_tokens: int | None = None, model: str = "gpt-test") -> Reply:
    """A Chat Completions reply; each tool call is (id, name, arguments), arguments a dict (sent as
    its JSON) or a string (sent as it is, malformed or not). ``prompt_tokens=None`` leaves out
    "usage", as some local servers do."""
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if tool_calls:
        message["tool_calls"] = [{"id": cid, "type": "function", "function": {
            "name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}} for cid, name, args in tool_calls]
    body: dict[str, Any] = {
        "id": f"chatcmpl-{next(_ids)}", "object": "chat.completion", "created": int(time.time()), "model": model,
        "system_fingerprint": "fp_fake",
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop")}],
    }
    if prompt_tokens is not None:
        body["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                         "total_tokens": prompt_tokens + completion_tokens}
        if cached_tokens is not None:
            body["usage"]["prompt_tokens_details"] = {"cached_tokens": cached_tokens, "audio_tokens": 0}
    return Reply(body=body)


def error(status: int, message: str, *, retry_after_ms: int | None = None, retry_after: float | None = None) -> Reply:
    """An error in the format of the path that gets it, with retry-after headers when given (tests
    pass ``retry_after_ms=1`` so that the SDKs' retries take a millisecond)."""
    headers = {}
    if retry_after_ms is not None:
        headers["retry-after-ms"] = str(retry_after_ms)
    if retry_after is not None:
        headers["retry-after"] = f"{retry_after:g}"
    return Reply(status=status, error=message, headers=headers)


def stall(seconds: float = 10.0) -> Reply:
    """No answer for ``seconds`` (the server cuts the wait short when it stops)."""
    return Reply(stall_s=seconds)


_ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                          500: "api_error", 529: "overloaded_error"}
_OPENAI_ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
                       429: "rate_limit_exceeded", 500: "server_error", 503: "server_error"}


def _error_body(path: str, status: int, message: str) -> dict[str, Any]:
    if path == ANTHROPIC_PATH:
        return {"type": "error", "error": {"type": _ANTHROPIC_ERROR_TYPES.get(status, "api_error"), "message": message},
                "request_id": f"req_{next(_ids):020d}"}
    return {"error": {"message": message, "type": _OPENAI_ERROR_TYPES.get(status, "server_error"), "param": None,
                      "code": None}}


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
        fake = self.server.fake
        path = self.path.split("?", 1)[0]
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        fake._record(Request(path, {k.lower(): v for k, v in self.headers.items()}, json.loads(raw or b"{}")))
        if path not in (ANTHROPIC_PATH, OPENAI_PATH):
            reply = Reply(status=404, error=f"fake_llm: no route {path}")
        else:
            reply = fake._next()
        if reply.before is not None:
            reply.before()
        if reply.stall_s and fake._closing.wait(reply.stall_s):
            return
        body = _error_body(path, reply.status, reply.error) if reply.error else reply.body or {}
        data = json.dumps(body).encode()
        id_header = "request-id" if path == ANTHROPIC_PATH else "x-request-id"
        try:
            self.send_response(reply.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.send_header(id_header, f"req_{next(_ids):020d}")
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client gave up (a stall past its timeout)
            pass

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the signature http.server calls
        pass


class _Server(ThreadingHTTPServer):
    block_on_close = False
    fake: FakeLLM


class FakeLLM:
    """The server; a context manager. ``base_url`` is Anthropic's (the SDK adds /v1/messages),
    ``openai_base_url`` OpenAI's (the SDK adds /chat/completions). With no scripted reply left a
    request gets a 400 that says so (not retried by the SDKs)."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self._replies: list[Reply] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def openai_base_url(self) -> str:
        return self.base_url + "/v1"

    def reply(self, *replies: Reply) -> None:
        """Queue replies, answered in order."""
        with self._lock:
            self._replies.extend(replies)

    def _next(self) -> Reply:
        with self._lock:
            if self._replies:
                return self._replies.pop(0)
        return Reply(status=400, error="fake_llm: no scripted reply left")

    def _record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def __enter__(self) -> FakeLLM:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
