"""The agent transcript pane: the conversation that wrote the node (committed on its branch)."""

from __future__ import annotations

import json
from typing import Any

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from ...backend import NodeDetail


def render_entry(e: dict[str, Any]) -> Text:
    kind = str(e.get("type", "?"))
    step = e.get("step")
    head = f"[{step}] " if step is not None else ""
    if kind == "message":
        msg = e.get("message") or {}
        role = str(msg.get("role", "?"))
        body = str(msg.get("text", "") or "")
        calls = msg.get("tool_calls") or []
        if calls:
            body += ("\n" if body else "") + "\n".join(
                f"-> {c.get('name')}({json.dumps(c.get('arguments', {}))[:200]})" for c in calls)
        for res in msg.get("results") or []:
            body += ("\n" if body else "") + f"<- {res.get('name')}: {str(res.get('content', ''))[:400]}"
        return Text.assemble((f"{head}{role}: ", "bold cyan" if role == "assistant" else "bold"), body.strip())
    if kind == "query":
        return Text(f"{head}query {e.get('model', '')}: {e.get('input_tokens', 0)}+{e.get('output_tokens', 0)} tokens, "
                    f"${float(e.get('cost_usd', 0.0)):.4f}", style="dim")
    if kind == "tool":
        return Text(f"{head}tool {e.get('name')}: {str(e.get('result', e.get('content', '')))[:400]}", style="green")
    if kind == "end":
        return Text(f"{head}end: {e.get('reason', '')}", style="bold")
    rest = {k: v for k, v in e.items() if k not in ("type", "t", "step")}
    return Text(f"{head}{kind}: {json.dumps(rest, default=str)[:400]}")


class TranscriptView(VerticalScroll):
    DEFAULT_CSS = """
    TranscriptView { height: 1fr; padding: 0 1; }
    TranscriptView > Static { margin-bottom: 1; }
    """

    def show(self, detail: NodeDetail) -> None:
        self.remove_children()
        if not detail.transcript:
            self.mount(Static("no agent wrote this node (a template proposer, or the eager reference)"))
            return
        self.mount_all([Static(render_entry(e)) for e in detail.transcript[:400]])
        self.scroll_home(animate=False)
