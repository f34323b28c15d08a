"""What the runtime says and ships: the status file ``forge status`` reads, a damaged manifest,
an export loaded in a fresh process, and approval from a search."""

import json
import subprocess
import sys
import time
from typing import Any

import pytest
import torch
from conftest import timed_win, won_request
from runtime_helpers import (
    CPU,
    WORKLOAD,
    load_workload,
    promoted_workspace,
)

from forge_tui.cli import main
from forge_tui.errors import ForgeError
from forge_tui.promotion import approve, manifest, reject, requests
from forge_tui.runtime.apply import apply
from forge_tui.runtime.status import read_status
from forge_tui.workspace import profile_into_workspace


@pytest.fixture
def promoted(tmp_path_factory):
    return promoted_workspace(tmp_path_factory)


def test_status_is_written_for_forge_status(promoted, capsys):
    ws, norm, sm = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad(), apply(model, ws, only_faster=False):
        model(x)
    live = read_status(ws.root)
    assert {c["card"] for c in live["cards"]} == {norm.id, sm.id}
    assert main(["status", str(ws.root)]) == 0
    out = capsys.readouterr().out
    assert f"{norm.id}: direct" in out and "served 1" in out and "active" in out


def test_served_calls_leave_the_status_file_to_a_thread_of_its_own(promoted, monkeypatch):
    """A served call never writes the status file itself (its JSON and the file system's latency
    were a stall inside the user's forward, once a second): the board's own thread writes the
    counts while calls happen, and undoing the model writes them as they stand."""
    import threading

    from forge_tui.runtime.status import StatusBoard

    ws, norm, sm = promoted
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    writers: list[str] = []
    real_write = StatusBoard.write

    def write(self):
        writers.append(threading.current_thread().name)
        return real_write(self)

    monkeypatch.setattr(StatusBoard, "write", write)
    with torch.no_grad(), apply(model, ws, only_faster=False, trial_calls=0) as applied:
        applied.board.min_interval_s = 0.05
        n = len(writers)  # the install's own write
        served = 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            model(x)
            served += 1
            live = read_status(ws.root)
            if live and any(c["served"] >= 1 for c in live["cards"]) and len(writers) > n:
                break
            time.sleep(0.01)
        assert writers[n:] and set(writers[n:]) == {"forge-status"}, writers
        assert live is not None and {c["card"]: c["served"] for c in live["cards"]}[norm.id] >= 1
    assert writers[-1] == threading.current_thread().name  # the undo's own write
    final = {c["card"]: c["served"] for c in read_status(ws.root)["cards"]}
    assert final[norm.id] == served


def test_a_damaged_manifest_is_one_clear_error(promoted, tmp_path, capsys):
    """forge status and apply on a manifest a hand edit broke: one line naming the file and the
    field, exit 1, no traceback, nothing written."""
    import shutil

    ws, norm, _ = promoted
    root = tmp_path / "ws"
    shutil.copytree(ws.root, root)
    path = root / "kernels" / "manifest.json"
    data = json.loads(path.read_text())
    data["entries"][norm.id]["disabled_reason"] = None
    path.write_text(json.dumps(data))
    assert main(["status", str(root)]) == 2  # the CLI's exit for bad input
    err = capsys.readouterr().err
    assert "manifest.json is damaged" in err and f"entries.{norm.id}.disabled_reason" in err and "Traceback" not in err
    with pytest.raises(ForgeError, match="damaged"):
        apply(load_workload().get_model(), root)
    assert json.loads(path.read_text()) == data


def test_export_loads_in_a_fresh_process_and_checks_itself(promoted, tmp_path):
    ws, norm, sm = promoted
    out = tmp_path / "export"
    assert main(["export", str(ws.root), str(out)]) == 0
    script = f"""
import importlib.util, json, torch
from forge_tui.runtime.apply import apply
spec = importlib.util.spec_from_file_location("m", {str(WORKLOAD)!r}); m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
model, x = m.get_model(), m.get_inputs()[0]
with torch.no_grad():
    ref = model(x)
    with apply(model, {str(out)!r}, only_faster=False) as a:
        y = model(x)
        print(json.dumps({{"ok": bool(torch.allclose(y, ref, atol=1e-6)), "served": {{c["card"]: c["served"] for c in a.status()["cards"]}}}}))
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["ok"] and got["served"] == {norm.id: 1, sm.id: 1}
    # a damaged export is refused, with the file named
    so = next(out.glob(f"{norm.id}/*.so"))
    so.write_bytes(so.read_bytes()[:-16] + b"\0" * 16)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "does not match its checksum" in r.stderr and so.name in r.stderr


def test_approval_from_a_search(tmp_path, capsys):
    """A search finds a kernel faster than eager; it is a pending request with its evidence;
    --auto approves only what clears its thresholds; a rejection is recorded and not asked again."""
    from forge_tui.errors import ForgeError
    from forge_tui.session import Session

    def search(attempt: int) -> tuple[Any, bool]:
        root = tmp_path / f"try{attempt}"
        root.mkdir()
        cfg = root / "forge.toml"
        cfg.write_text("[timing]\nwarmup = 1\nrepeats = 3\nthreads = 1\nmax_spread = 10.0\nmax_slowdown = 100.0\n"
                       "[search]\nmin_gain = 0.0\n")
        ws, _ = profile_into_workspace(WORKLOAD, root / "ws", device="cpu", config_path=cfg)
        norm = next(c for c in ws.cards() if c.kind == "module")
        plan = root / "plan.json"
        plan.write_text(json.dumps({"cards": {norm.id: [str(CPU / "rmsnorm_good.cpp")]}}))
        session = Session.open(ws.root, cfg).with_search_settings(max_evals=1)
        with session.search(proposer=f"scripted:{plan}", backend="cpu", cards=[norm.id]) as s:
            s.run()
        return (ws, norm), won_request(ws.root)

    ws, norm = timed_win(search)
    pending = requests(ws)
    assert [r.card.id for r in pending] == [norm.id]
    req = pending[0]
    assert req.speedup > 1 and "adversarial-zeros" in req.evidence.input_sets and req.evidence.diff
    # --auto with a bar the kernel does not clear leaves it pending, saying why
    done, left = approve(ws, auto=__import__("forge_tui.promotion", fromlist=["AutoRule"]).AutoRule(min_speedup=1e6))
    assert not done and "under the" in left[0][1]
    assert main(["approve", str(ws.root), "--auto", "--max-spread", "100"]) == 0
    assert f"approved {norm.id}: {req.node}" in capsys.readouterr().out
    entry = manifest(ws).entries[norm.id]
    assert entry.approved_by.startswith("auto") and entry.builds[0].sha256 and entry.evidence.node == req.node
    assert (ws.root / entry.source).is_file() or (ws.root / "kernels" / entry.source).is_file()
    with ws.git() as repo:
        assert "approve" in repo.git("log", "-1", "--format=%s", "main")
    assert requests(ws) == []  # promoted: no longer pending
    with pytest.raises(ForgeError, match="no promotion request"):
        reject(ws, [norm.id])  # nothing pending to reject
