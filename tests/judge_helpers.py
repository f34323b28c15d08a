"""Small synthetic cards and workspaces for the judge's tests: built in code, no profile run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from forge_tui.cards import Card, TensorSpec


def softmax_card(rows: int = 16, cols: int = 512, dtype: str = "float32", time_us: float = 20.0) -> Card:
    """A row softmax card (``aten._softmax.default`` over the last dim), as the profiler writes one."""
    shape, stride = [rows, cols], [cols, 1]
    program = {"nodes": [{"op": "aten._softmax.default", "args": [{"$in": 0}, -1, False], "kwargs": {},
                          "out": [[shape, dtype]]}],
               "outputs": [{"$node": 0, "out": 0}]}
    item = {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]
    return Card(id="_softmax-synthetic", kind="op", target="aten._softmax.default", label="softmax",
                inputs=[TensorSpec(shape=shape, stride=stride, dtype=dtype, name="x")],
                outputs=[TensorSpec(shape=shape, stride=stride, dtype=dtype, role="output")],
                program=program, calls=1, time_us=time_us, bytes=2 * rows * cols * item, flops=4 * rows * cols,
                device="cpu", dtype=dtype)


def bare_workspace(root: Path, cards: list[Card]) -> Path:
    """A workspace folder as ``Workspace.open`` accepts it: a git repository with the marker file and
    the cards, nothing profiled."""
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "workspace.json").write_text(json.dumps({"tool": "forge-tui", "format": 1}))
    (root / "cards").mkdir()
    for card in cards:
        (root / "cards" / f"{card.id}.json").write_text(json.dumps(card.model_dump(mode="json")))
    return root
