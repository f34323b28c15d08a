"""What the providers that call a vendor's SDK share: the mapping of the SDK's exceptions to a
``ProviderError`` with every secret hidden, and the parsing of a tool call's arguments.

Retries are the SDKs' own (``max_retries``: exponential backoff from 0.5 s to 8 s with jitter,
honouring ``retry-after-ms`` and ``retry-after``, on 408, 409, 429, 5xx, timeouts and lost
connections); what still fails becomes a ``ProviderError`` whose text has every secret of the
environment replaced by ``[redacted]`` (``forge_tui.redaction``).
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable

from ...redaction import hide
from ..messages import ProviderError, ToolCall

RETRYABLE_STATUS = (408, 409, 429)


def one_line(text: str, limit: int = 300) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_arguments(call_id: str, name: str, raw: Any) -> ToolCall:
    """A tool call from the model's arguments, which should be a JSON object in a string; when
    they are not, the call keeps them in ``raw_arguments`` and says why in ``arguments_error``."""
    if isinstance(raw, dict):  # some servers send the object itself
        return ToolCall(id=call_id, name=name, arguments=raw, raw_arguments=json.dumps(raw))
    raw = raw if isinstance(raw, str) else json.dumps(raw)
    if not raw.strip():  # a call without arguments, as some servers write it
        return ToolCall(id=call_id, name=name, raw_arguments=raw)
    try:
        value = json.loads(raw)
    except ValueError as err:
        return ToolCall(id=call_id, name=name, raw_arguments=raw, arguments_error=f"the arguments are not valid JSON ({err})")
    if not isinstance(value, dict):
        return ToolCall(id=call_id, name=name, raw_arguments=raw,
                        arguments_error=f"the arguments are not a JSON object (got {type(value).__name__})")
    return ToolCall(id=call_id, name=name, arguments=value, raw_arguments=raw)


class SDKProvider:
    """What the SDK providers share: the secrets to hide and the mapping of SDK exceptions."""

    name: str
    model: str

    def __init__(self, model: str, base_url: str, timeout_s: float, secrets: Iterable[str]) -> None:
        self.model = model
        self.base_url = base_url
        self.timeout_s = timeout_s
        self._secrets = sorted(set(secrets), key=len, reverse=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, model={self.model!r}, base_url={self.base_url!r})"

    def _error(self, text: str, *, retryable: bool, status: int | None = None) -> ProviderError:
        # secrets are hidden before the line is cut short: a key cut in two would no longer match
        return ProviderError(one_line(f"{self.name}: {hide(text, self._secrets)}"), retryable=retryable, status=status)

    def _sdk_error(self, err: Exception, timeout: type[Exception], connection: type[Exception]) -> ProviderError:
        """One line naming the provider, the status and the server's message (keys hidden);
        ``timeout`` and ``connection`` are the SDK's exceptions for those failures."""
        request = getattr(err, "request", None)
        retries = request.headers.get("x-stainless-retry-count", "0") if request is not None else "0"
        after = {"": "", "0": "", "1": " after 1 retry"}.get(retries, f" after {retries} retries")
        status = getattr(err, "status_code", None)
        if isinstance(status, int):
            retryable = status in RETRYABLE_STATUS or status >= 500
            return self._error(f"HTTP {status}{after}: {_server_message(err)}", retryable=retryable, status=status)
        if isinstance(err, timeout):
            return self._error(f"no reply within {self.timeout_s:g} s{after}", retryable=True)
        if isinstance(err, connection):
            cause = f": {err.__cause__}" if err.__cause__ is not None else ""
            return self._error(f"cannot reach {self.base_url or 'the API'}{after}{cause}", retryable=True)
        return self._error(f"{type(err).__name__}: {err}", retryable=False)

    def _unexpected(self, err: Exception) -> ProviderError:
        return self._error(f"unexpected reply ({type(err).__name__}: {err})", retryable=False)


def _server_message(err: Exception) -> str:
    body = getattr(err, "body", None)
    inner = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(inner, dict) and isinstance(inner.get("message"), str):
        return str(inner["message"])
    if isinstance(body, str) and body:
        return body
    return str(getattr(err, "message", err))
