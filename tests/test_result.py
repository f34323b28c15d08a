"""The evaluator's typed result: an exact JSON round trip, results written before the schema
(version 1, kept in git by old searches) still read, and one formatter for all of them."""

import json
import math
from pathlib import Path

import pytest

from forge_tui.evaluator.report import format_result, summary_line
from forge_tui.evaluator.result import SCHEMA_VERSION, EvalResult, load_result

DATA = Path(__file__).parent / "data" / "results"
OLD = sorted(DATA.glob("v1_*.json"))


def test_there_are_old_results_to_read():
    assert {p.stem for p in OLD} == {"v1_passed", "v1_rejected", "v1_build_failed", "v1_static"}


@pytest.mark.parametrize("path", OLD, ids=lambda p: p.stem)
def test_a_result_written_before_the_schema_reads_and_round_trips(path):
    raw = path.read_text()
    r = load_result(raw)
    assert r is not None and r.schema_version == 1
    old = json.loads(raw)
    assert r.status == old["status"] and r.reason == old["reason"] and r.card == old["card"]
    again = EvalResult.from_json(r.to_json())
    assert again == r and again.to_json() == r.to_json()
    # nothing of the old result is lost
    new = json.loads(r.to_json())
    assert all(k in new for k in old)
    assert format_result(r).startswith(r.status.upper())


def test_old_timing_reads_into_fields():
    r = load_result((DATA / "v1_passed.json").read_text())
    t = r.timing
    assert t.candidate.median > 0 and t.eager.n == t.candidate.n
    assert r.speedup_vs_eager == t.speedup_vs_eager.median
    assert [s.name for s in r.correctness.sets] == ["captured-0", "random-0", "random-1", "random-2"]
    assert "speedup vs eager" in format_result(r)


def test_build_diagnostics_are_typed():
    r = load_result((DATA / "v1_build_failed.json").read_text())
    err = r.build.errors[0]
    assert err.severity == "error" and err.line and "undeclared_name" in err.message
    assert str(err) in format_result(r)


def test_infinities_and_unknown_keys_survive_the_round_trip():
    r = EvalResult(status="passed", card="c", backend="cpu", speedup_vs_eager=math.inf,
                   detail={"x": [1, 2]}, something_new={"kept": True})
    again = EvalResult.from_json(r.to_json())
    assert again.speedup_vs_eager == math.inf and again.model_extra == {"something_new": {"kept": True}}
    assert json.loads(r.to_json())["schema"] == SCHEMA_VERSION


def test_unreadable_results_are_none():
    assert load_result(None) is None and load_result("{not json") is None and load_result("[1, 2]") is None
    assert load_result('{"status": "exploded"}') is None  # not a status the evaluator gives


def test_summary_line():
    r = EvalResult(status="passed", card="c", backend="cuda", speedup_vs_eager=1.5)
    assert summary_line(r) == "PASSED: c on cuda: 1.500x eager"
    n = EvalResult(status="noisy", card="c", backend="cpu", reason="busy")
    assert summary_line(n) == "NOISY: c on cpu: busy"
