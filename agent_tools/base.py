"""What a tool is, what it runs against, and the one way a tool call is run.

A tool is data (``Tool``): a name, a description, a pydantic model of its arguments and a
function. ``Tool.spec()`` gives the provider-neutral ``ToolSpec`` (a JSON Schema of the arguments)
that renders to Anthropic's and OpenAI's formats alike. Tools act on a ``ToolEnv`` (the node's
working directory, the card, the evaluator pool) and never on anything else. ``run_tool`` runs one
model's call and always answers with a ``ToolResult``: a refusal (``ToolError``), bad arguments or
a bug in a tool come back to the model as an error result it can act on, never as an exception.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, AbstractSet, Any, Callable, Generic, Iterable, Mapping, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from forge_tui.agent.messages import ToolCall, ToolResult, ToolSpec
from forge_tui.kernel_abi import SOURCE_NAMES

if TYPE_CHECKING:
    from forge_tui.cards import Card
    from forge_tui.evaluator.result import EvalResult
    from forge_tui.search.pool import EvalPool

MAX_RESULT_CHARS = 30_000
"""A tool's answer is cut to this many characters (with a note) before the model sees it."""


class ToolError(Exception):
    """A refusal or a failure the model should read: the message says what and why."""


class Params(BaseModel):
    """Base of every tool's arguments: unknown arguments are refused, not ignored."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Submission:
    """What the submit tool hands back to the caller: the kernel and what it changes."""

    source: str
    move: str
    """One line: what this kernel changes (its edge in the search tree)."""
    file: str
    notes: str = ""


@dataclass
class ToolEnv:
    """Everything a tool may touch. File tools stay inside ``workdir``; the evaluator tools use
    ``pool`` and ``card``; ``submission`` and ``last_result`` are what the caller reads back."""

    workdir: Path
    card: "Card | None" = None
    backend: str = "cpu"
    """"cuda" or "cpu"."""
    pool: "EvalPool | None" = None
    source_name: str = ""
    """The candidate's file in ``workdir`` (default: candidate.cu on cuda, candidate.cpp on cpu)."""
    read_only: AbstractSet[str] = frozenset()
    """Paths relative to ``workdir`` the model may read but not write (card.json, reference.py,
    forge_kernel.h, the parents' sources)."""
    max_read_bytes: int = 256 * 1024
    max_write_bytes: int = 256 * 1024
    timeout_s: float = 600.0
    """How long an evaluator tool waits for the pool before it gives up."""
    submission: Submission | None = None
    last_result: "EvalResult | None" = None
    """The last run_tests or profile result."""

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        if not self.source_name:
            self.source_name = SOURCE_NAMES.get(self.backend, SOURCE_NAMES["cpu"])
        self.read_only = frozenset(_norm(p) for p in self.read_only)


def _norm(path: str) -> str:
    return "/".join(p for p in str(path).split("/") if p not in ("", "."))


P = TypeVar("P", bound=BaseModel)


@dataclass(frozen=True)
class Tool(Generic[P]):
    name: str
    description: str
    params: type[P]
    fn: Callable[[ToolEnv, P], str]

    def __post_init__(self) -> None:
        if self.params.model_config.get("extra") != "forbid":
            raise ValueError(f"tool {self.name}: its params model must forbid extra arguments (extra='forbid')")

    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description, parameters=schema_of(self.params))


# ---- JSON Schema ------------------------------------------------------------------------------
_NOISE = ("title",)


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    """The arguments' JSON Schema as both providers take it: an object with ``properties``,
    ``required`` and ``additionalProperties: false``; no titles; references inlined; an optional
    argument (``X | None = None``) shown as a plain X that is not required."""
    raw = model.model_json_schema()
    defs = raw.pop("$defs", {})
    out = _clean(raw, defs)
    out.setdefault("properties", {})
    out["type"] = "object"
    out.setdefault("required", [])
    out["additionalProperties"] = False
    return out


def _clean(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_clean(x, defs) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**copy.deepcopy(target), **{k: v for k, v in node.items() if k != "$ref"}}
        return _clean(merged, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _NOISE:
            continue
        if key == "properties" and isinstance(value, dict):
            out[key] = {name: _clean(sub, defs) for name, sub in value.items()}  # names kept, even "title"
        else:
            out[key] = _clean(value, defs)
    variants = out.get("anyOf")
    if isinstance(variants, list) and out.get("default", 0) is None:
        rest = [v for v in variants if v != {"type": "null"}]
        if len(rest) == 1 and len(rest) < len(variants):
            out.pop("anyOf")
            out.pop("default")
            out = {**rest[0], **out}
    return out


# ---- running one call -------------------------------------------------------------------------
def _short(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[:n] + "…"


def validation_message(tool: str, exc: ValidationError) -> str:
    lines = [f"invalid arguments for {tool}:"]
    for err in exc.errors(include_url=False)[:10]:
        where = ".".join(str(x) for x in err.get("loc", ())) or "(arguments)"
        msg = err.get("msg", "invalid")
        if err.get("type") == "extra_forbidden":
            msg = "unknown argument"
        lines.append(f"- {where}: {msg}")
    return "\n".join(lines)


def truncate(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... truncated: showing {limit} of {len(text)} characters ...]"


def run_tool(tools: Mapping[str, Tool[Any]] | Iterable[Tool[Any]], env: ToolEnv, call: ToolCall) -> ToolResult:
    """Run one call of the model (``tools``: by name, or a list); never raises (but for
    KeyboardInterrupt and the like)."""
    if not isinstance(tools, Mapping):
        tools = {t.name: t for t in tools}

    def err(text: str) -> ToolResult:
        return ToolResult(call_id=call.id, name=call.name, content=truncate(text), is_error=True)

    tool = tools.get(call.name)
    if tool is None:
        return err(f"unknown tool {_short(call.name, 80)!r}; the tools are: {', '.join(tools)}")
    if call.arguments_error is not None:
        return err(f"the arguments of {tool.name} were not a JSON object ({_short(call.arguments_error)}): "
                   f"{_short(call.raw_arguments)!r}; call {tool.name} again with a JSON object of its parameters")
    try:
        params = tool.params.model_validate(call.arguments)
    except ValidationError as exc:
        return err(validation_message(tool.name, exc))
    try:
        out = tool.fn(env, params)
    except ToolError as exc:
        return err(str(exc) or f"{tool.name} failed")
    except Exception as exc:  # noqa: BLE001 - a bug in a tool is the model's error result, not a crash
        return err(f"internal error in tool {tool.name}: {type(exc).__name__}: {_short(str(exc), 500)}")
    return ToolResult(call_id=call.id, name=call.name, content=truncate(str(out)))
