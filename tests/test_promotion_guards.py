"""What is promoted and shown: a noisy result is never promoted, and ``forge status`` prints every
manifest entry, whatever its evidence holds."""

from __future__ import annotations

import pytest
from judge_helpers import bare_workspace, softmax_card

from forge_tui.cli import main
from forge_tui.errors import ForgeError
from forge_tui.evaluator.result import EvalResult
from forge_tui.promotion import manifest, promote_kernel
from forge_tui.runtime.manifest import Entry, Evidence, Manifest, Signature
from forge_tui.workspace import Workspace


def test_a_noisy_result_is_refused_with_its_reason(tmp_path):
    card = softmax_card()
    ws = Workspace.open(bare_workspace(tmp_path / "ws", [card]))
    noisy = EvalResult.from_dict({
        "status": "noisy", "card": card.id, "backend": "cpu", "reason": "correct, but the machine was too busy",
        "timing": None, "schema": 2})
    with pytest.raises(ForgeError) as err:
        promote_kernel(ws, card.id, "// any source", noisy, by="test")
    assert "noisy" in str(err.value) and "claims no speedup" in str(err.value)
    assert not (ws.root / "kernels").exists()  # nothing written
    assert manifest(ws).entries == {}


def test_status_prints_an_entry_without_a_measured_speedup(tmp_path, capsys):
    card = softmax_card()
    root = bare_workspace(tmp_path / "ws", [card])
    entry = Entry(card=card.id, signature=Signature.of(card), source=f"{card.id}/kernel.cpp", source_sha256="0" * 64,
                  evidence=Evidence(node="n3", commit="", speedup_vs_eager=None), approved_by="user test",
                  approved_at="2026-01-01T00:00:00", enabled=False)
    Manifest(entries={card.id: entry}).save(root / "kernels")
    assert main(["status", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"{card.id}: n3 no measured speedup, approved by user test" in out
    assert "switched off: no reason recorded" in out
