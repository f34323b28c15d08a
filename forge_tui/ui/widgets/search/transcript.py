"""The agent transcript pane: the conversation that wrote the node (committed on its branch)."""

from __future__ import annotations

import json
from typing import Any

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from ...backend import NodeDetail


def usage_of(e: dict[str, Any]) -> dict[str, int]:
    """A query's tokens: under ``usage`` as the agent records them (input, output, cache read and
    written), or at the entry's top level as older transcripts have them."""
    usage = e.get("usage")
    u: dict[str, Any] = usage if isinstance(usage, dict) else e
    return {k: int(u.get(k) or 0) for k in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")}


def tokens_text(u: dict[str, int]) -> str:
    cached = [f"{u['cache_read_tokens']:,} read" if u["cache_read_tokens"] else "",
              f"{u['cache_write_tokens']:,} written" if u["cache_write_tokens"] else ""]
    cache = f", cached {' and '.join(c for c in cached if c)}" if any(cached) else ", none cached"
    return f"{u['input_tokens']:,} in + {u['output_tokens']:,} out tokens{cache}"


def summary(entries: list[dict[str, Any]]) -> Text:
    """The conversation in one line: queries, tokens (cached ones apart) and money."""
    queries = [e for e in entries if e.get("type") == "query"]
    total = {k: sum(usage_of(q)[k] for q in queries) for k in usage_of({})}
    cost = sum(float(q.get("cost_usd") or 0.0) for q in queries)
    return Text(f"{len(queries)} queries: {tokens_text(total)}; ${cost:.4f}", style="bold")


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
        secs = f", {float(e['seconds']):.1f} s" if e.get("seconds") is not None else ""
        return Text(f"{head}query {e.get('model', '')}: {tokens_text(usage_of(e))}, "
                    f"${float(e.get('cost_usd') or 0.0):.4f}{secs}", style="dim")
    if kind == "query_failed":
        return Text(f"{head}query failed: {e.get('error', '')}", style="red")
    if kind == "tool":
        if "result" in e or "content" in e:
            return Text(f"{head}tool {e.get('name')}: {str(e.get('result', e.get('content', '')))[:400]}", style="green")
        how = "error" if e.get("is_error") else "ok"
        secs = f" in {float(e['seconds']):.1f} s" if e.get("seconds") is not None else ""
        return Text(f"{head}tool {e.get('name')}: {how}{secs}", style="red" if e.get("is_error") else "green")
    if kind == "start":
        lim = e.get("limits") or {}
        limits = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in lim.items()) if isinstance(lim, dict) else ""
        return Text.assemble(("conversation ", "bold"), f"{e.get('conversation', '')} on {e.get('card', '')} from "
                             f"{e.get('parent', '')} ({e.get('backend', '')} backend), {e.get('provider', '')} "
                             f"{e.get('model', '')}" + (f"; limits: {limits}" if limits else ""))
    if kind == "system":
        text = str(e.get("text", ""))
        first = next((line for line in text.splitlines() if line.strip()), "")
        return Text(f"{head}system prompt, {len(text):,} characters: {first[:160]}", style="dim")
    if kind == "end":
        u = usage_of(e) if "usage" in e else None
        spent = f"; {e.get('queries', '?')} queries, {tokens_text(u)}, ${float(e.get('cost_usd') or 0.0):.4f}" if u else ""
        return Text(f"{head}end: {e.get('reason', '')}{spent}", style="bold")
    rest = {k: v for k, v in e.items() if k not in ("type", "t", "step")}
    return Text(f"{head}{kind}: " + ", ".join(f"{k} {v}" for k, v in rest.items())[:400])


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
        self.mount_all([Static(summary(detail.transcript)), *(Static(render_entry(e)) for e in detail.transcript[:400])])
        self.scroll_home(animate=False)
