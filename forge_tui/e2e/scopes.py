"""The bench's notes on the compiled scopes the runtime installed."""

from __future__ import annotations

from typing import Any


def scope_notes(applied: Any) -> list[str]:
    """What each compiled scope ran as (Dynamo's torch-level graph or the aten graph, per graph
    compiled) and the sites a torch-level graph left unserved, with why."""
    out = []
    for path, scope in sorted(applied.scopes.items()):
        if scope.levels:
            if scope.direct is not None:
                how = f"; Dynamo's code called directly ({scope.direct.calls} of its {scope.calls} calls)"
            else:
                how = f"; Dynamo ran every call: {scope.direct_why}" if scope.direct_why else ""
            if scope.rehooks:
                how += f"; compiled again {scope.rehooks} time(s) for changed module hooks"
            if scope.failed:
                how += f"; runs as written since: {scope.failed}"
            if scope.stopped:
                how += f"; compiles no more variants ({scope.stopped})"
            if scope.uncovered:
                how += f"; {scope.uncovered} calls at shapes no served variant covers ran as written"
            out.append(f"compiled scope {path or 'the model'}: ran as {', '.join(scope.levels)} graph"
                       f"{'s' if len(scope.levels) > 1 else ''}{how}")
        out.extend(f"compiled scope {path or 'the model'}: {card} not served there: {why}"
                   for card, why in sorted(scope.unmapped.items()))
    return out
