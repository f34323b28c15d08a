"""Which kernels ``forge retime`` times again: each correct kernel that a busy machine left
untimed (``noisy``), once per call, until a retime gives it a verdict.

A retime is a child node of the kernel it times again, with the same source and the move
``retime <node>``. A retime that comes back noisy again (or that timed out, or whose harness
failed) is no verdict: the kernel is timed again by the next call, as one kernel, not once for each
earlier retime of it. Plain functions over (node id, status, move), shared by the search and the app.
"""

from __future__ import annotations

from typing import Any, Iterable

RETIME = "retime "
"""A retimed node's move: ``retime <the node it times again>``."""
NO_VERDICT = ("noisy", "timeout", "error")
"""Outcomes of a retime that say nothing about the kernel: it is timed again."""


def retimed_node(move: str) -> str | None:
    """The node a retime's move names, or None for a move that is not a retime."""
    return move[len(RETIME):] if move.startswith(RETIME) else None


def original(node: str, moves: dict[str, str]) -> str:
    """The kernel a node times: itself, or, for a retime (of a retime ...), the first node of the
    chain. ``moves``: node id -> move, for one card."""
    seen = {node}
    while (target := retimed_node(moves.get(node, ""))) is not None and target in moves and target not in seen:
        seen.add(target)
        node = target
    return node


def untimed(nodes: Iterable[tuple[str, str, str]]) -> list[str]:
    """One card's kernels to time again, in the order given: each noisy kernel (its first node,
    ``original``) that no retime has given a verdict yet. ``nodes``: (id, status, move)."""
    rows = list(nodes)
    moves = {nid: move for nid, _, move in rows}
    judged = {original(nid, moves) for nid, status, move in rows if retimed_node(move) is not None
              and status not in NO_VERDICT}
    out: list[str] = []
    for nid, status, move in rows:
        if status == "noisy" and retimed_node(move) is None and nid not in judged and nid not in out:
            out.append(nid)
    return out


def noisy_cards(ws: Any, cards: list[str]) -> list[str]:
    """Those of ``cards`` with a correct kernel timed while the machine was busy ("noisy") in the
    workspace's search history."""
    from .store import SearchStore

    with ws.git() as repo:
        noisy = {r.card for r in SearchStore(repo).load().nodes if r.status == "noisy"}
    return [c for c in cards if c in noisy]
