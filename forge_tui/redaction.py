"""Secrets: which values are secret, hiding them from text, finding them in a file.

A secret is the value of an environment variable whose name says it is one (it contains KEY, TOKEN,
SECRET, PASSWORD, PASSWD or CREDENTIAL; 8+ characters, as shorter ones cannot be told from
ordinary text), the value of a variable named as an API key (every registered LLM provider's key
variable, such as ``ANTHROPIC_API_KEY``, and ``[agent] api_key_env``; 4+ characters), or any text
shaped like a known kind of key (``sk-ant-...``, ``sk-...``, GitHub's ``ghp_...``, AWS's
``AKIA...``, a PEM private key ...), whichever variable holds it or none.

``redact`` replaces them with "[redacted]" in any text that may reach the model, a user, a log, a
transcript or git; ``find_secrets`` names the ones a file holds (the variable's name or the kind
of key, never the value), for the git wrapper to refuse the commit. No LLM SDK is imported: the
git wrapper and the tools use this module, and the providers' key variables come from the
provider registry (``forge_tui.agent.providers.registry``, which imports no SDK), read when first
needed.
"""

from __future__ import annotations

import os
import re
from typing import Iterable, Mapping

REDACTED = "[redacted]"
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
MIN_NAMED = 4
MIN_SECRET = 8

_NAMED: set[str] = set()
"""Variables named as API keys by the configuration (``treat_as_secret``), for this process."""

_EDGE = r"(?<![A-Za-z0-9_])"
KEY_SHAPES: dict[str, re.Pattern[str]] = {
    "an Anthropic API key (sk-ant-...)": re.compile(_EDGE + r"sk-ant-[A-Za-z0-9_\-]{8,}"),
    "an OpenAI API key (sk-...)": re.compile(_EDGE + r"sk-(?!ant-)[A-Za-z0-9_\-]{20,}"),
    "a GitHub token (gh?_...)": re.compile(_EDGE + r"(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"),
    "an AWS access key id (AKIA...)": re.compile(_EDGE + r"(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Z])"),
    "a Google API key (AIza...)": re.compile(_EDGE + r"AIza[0-9A-Za-z_\-]{35}"),
    "a Slack token (xox?-...)": re.compile(_EDGE + r"xox[abeprs]-[A-Za-z0-9\-]{10,}"),
    "a Hugging Face token (hf_...)": re.compile(_EDGE + r"hf_[A-Za-z0-9]{30,}"),
    "a private key (-----BEGIN ... PRIVATE KEY-----)": re.compile(
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?:.*?-----END [A-Z0-9 ]*PRIVATE KEY-----)?", re.DOTALL),
}
"""Text that is a key whichever variable holds it: by the kind of key it is."""


def key_variables() -> tuple[str, ...]:
    """Variables that hold an API key whatever their value looks like: the registered providers'."""
    from .agent.providers.registry import key_variables as provider_keys  # the registry imports this module

    return provider_keys()


def treat_as_secret(*names: str) -> None:
    """Count these variables' values as secrets (4+ characters) from now on, everywhere in this
    process (the configured ``[agent] api_key_env``: the git wrapper refuses a file holding it)."""
    _NAMED.update(n for n in names if n)


def secret_variables(environ: Mapping[str, str] = os.environ, names: Iterable[str] = ()) -> dict[str, str]:
    """{value: the variable's name} of every secret of the environment (see the module's text)."""
    named = {*key_variables(), *_NAMED, *(n for n in names if n)}
    out: dict[str, str] = {}
    for name, value in environ.items():
        if name in named:
            if len(value) >= MIN_NAMED:
                out.setdefault(value, name)
        elif SECRET_NAME.search(name) and len(value) >= MIN_SECRET:
            out.setdefault(value, name)
    return out


def secret_values(environ: Mapping[str, str] = os.environ, names: Iterable[str] = ()) -> list[str]:
    """The values ``redact`` hides, longest first (a value that holds another is hidden whole)."""
    return sorted(secret_variables(environ, names), key=len, reverse=True)


def hide(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` (longest first) and every key-shaped piece replaced."""
    for value in secrets:
        text = text.replace(value, REDACTED)
    for pattern in KEY_SHAPES.values():
        text = pattern.sub(REDACTED, text)
    return text


def redact(text: str, environ: Mapping[str, str] = os.environ, names: Iterable[str] = ()) -> str:
    """``text`` with the environment's secrets and every key-shaped piece replaced by "[redacted]";
    for any text that may reach the model, a user, a log or a transcript."""
    return hide(text, secret_values(environ, names))


def find_secrets(data: bytes | str, environ: Mapping[str, str] = os.environ, names: Iterable[str] = ()) -> list[str]:
    """What secrets ``data`` holds, each named by its variable (``the value of $ANTHROPIC_API_KEY``)
    or by its kind (``an AWS access key id (AKIA...)``); never the value itself."""
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    found: list[str] = []
    for value, name in sorted(secret_variables(environ, names).items(), key=lambda kv: -len(kv[0])):
        if value in text:
            found.append(f"the value of ${name}")
            text = text.replace(value, REDACTED)
    for what, pattern in KEY_SHAPES.items():
        if pattern.search(text):
            found.append(what)
    return found
