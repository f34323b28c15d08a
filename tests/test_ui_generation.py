"""Tokens per second in the app, with Pilot on the fixture backend (tests/ui_fixtures.py): the last
``forge bench --generate`` stored in the workspace shown under the op table and on the end-to-end
screen (``3``), ``b`` measuring them on a workload that generates and not on one that does not, and
the stored result's file (``generation_result.py``). No figure here is measured."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from ui_fixtures import GENERATION, FixtureBackend, FixtureDescriber

from forge_tui.generation_result import GENERATE_FILE, load, save, summary_line, tokens_lines
from forge_tui.ui.app import ForgeApp
from forge_tui.ui.screens.fallback import FallbackScreen
from forge_tui.ui.screens.workload import WorkloadScreen

BATCH_1 = "batch 1: prefill 1200 → 1500 (1.25x), decode 300 → 600 (2.00x)"
BATCH_2 = "batch 2: prefill 2000 → 2100 (1.05x), decode 500 → 400 (0.80x)"
SUMMARY = "batch 1 prefill 1500 (1.25x), decode 600 (2.00x)"


def make_app(backend: FixtureBackend) -> ForgeApp:
    return ForgeApp(Path("fixture"), backend=backend, describer=FixtureDescriber(), live_refresh=False)


async def until(pilot, cond, what: str, timeout: float = 60.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if cond():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"timed out waiting for {what}; the log:\n" + "\n".join(pilot.app.log_lines[-10:]))


def shown(app, selector: str) -> str:
    return str(app.screen.query_one(selector).render())


def test_the_stored_result_reads_back_in_lines_and_a_damaged_one_is_none(tmp_path):
    assert load(tmp_path) is None
    path = save(tmp_path, GENERATION)
    assert path == tmp_path / GENERATE_FILE and load(tmp_path) == GENERATION
    assert tokens_lines(GENERATION) == [
        "tokens/s, eager → eager + forge (forge bench --generate 8, tiny_decoder on cpu, prompts of 16 tokens)",
        f"  {BATCH_1}", f"  {BATCH_2}"]
    assert summary_line(GENERATION) == ("tokens/s with forge (vs eager): batch 1 prefill 1500 (1.25x), decode 600 "
                                        "(2.00x); batch 2 prefill 2100 (1.05x), decode 400 (0.80x)")
    failed = dict(GENERATION, rows=[*GENERATION["rows"][:1], {"way": "eager+forge", "batch": 1, "error": "boom"}])
    assert tokens_lines(failed)[1] == "  batch 1: eager + forge failed: boom"
    path.write_text("{not json")
    assert load(tmp_path) is None


def test_the_op_table_and_the_end_to_end_screen_show_the_stored_tokens_per_second():
    backend = FixtureBackend()
    backend.stored_generation = GENERATION

    async def scenario():
        app = make_app(backend)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.cards and app.generation is not None, "the cards")
            await pilot.pause()
            assert isinstance(app.screen, WorkloadScreen)
            note = shown(app, "#table-note")
            assert summary_line(GENERATION) in note and SUMMARY in note
            await pilot.press("3")
            await until(pilot, lambda: isinstance(app.screen, FallbackScreen), "the end-to-end screen")
            await pilot.pause()
            text = shown(app, "#bench-text")
            assert "end to end: not run yet" in text and BATCH_1 in text and "forge bench --generate 8" in text

    asyncio.run(scenario())


def test_b_on_a_generating_workload_measures_tokens_per_second_after_the_forward():
    backend = FixtureBackend()
    backend.generating_workload = True

    async def scenario():
        app = make_app(backend)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.cards, "the cards")
            await pilot.press("3")
            await until(pilot, lambda: isinstance(app.screen, FallbackScreen), "the end-to-end screen")
            await pilot.pause()
            assert BATCH_1 not in shown(app, "#bench-text")
            await pilot.press("b")
            await until(pilot, lambda: app.generation is not None and not app.generating and not app.bench_running,
                        "the generation bench")
            await pilot.pause()
            text = shown(app, "#bench-text")
            assert "Amdahl bound 1.123x" in text and BATCH_1 in text and BATCH_2 in text
            assert backend.generation_runs == 1 and any(BATCH_1 in line for line in app.log_lines)
            await pilot.press("1")
            await until(pilot, lambda: isinstance(app.screen, WorkloadScreen), "the workload screen")
            await pilot.pause()
            assert SUMMARY in shown(app, "#table-note")

    asyncio.run(scenario())


def test_b_on_a_workload_that_does_not_generate_runs_the_forward_alone():
    backend = FixtureBackend()

    async def scenario():
        app = make_app(backend)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.cards, "the cards")
            await pilot.press("3", "b")
            await until(pilot, lambda: app.bench_outcome is not None and not app.bench_running, "the model run")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert backend.generation_runs == 0 and app.generation is None
            assert "tokens/s" not in shown(app, "#bench-text")

    asyncio.run(scenario())


async def _settled(pilot) -> None:
    """Until the cards, the offline kernels' lines and the stored tokens/s have arrived and drawn."""
    app = pilot.app
    for _ in range(400):
        if app.cards and app.offline and app.generation is not None:
            break
        await pilot.pause(0.05)
    assert app.cards and app.generation is not None, "the workspace never loaded"
    for _ in range(2):
        await pilot.pause()
        await app.workers.wait_for_complete()
    await pilot.pause()


def _after(*keys: str):
    async def run(pilot) -> None:
        await _settled(pilot)
        for key in keys:
            await pilot.press(key)
            await _settled(pilot)

    return run


@pytest.mark.parametrize("screen, keys", [("workload", ()), ("fallback", ("3",))])
def test_screens_with_tokens_per_second(snap_compare, screen, keys):
    """The op table's summary and the end-to-end screen with a stored generation bench, at 80x24
    (update with ``--snapshot-update`` after looking at the difference)."""
    backend = FixtureBackend()
    backend.stored_generation = GENERATION
    assert snap_compare(make_app(backend), terminal_size=(80, 24), run_before=_after(*keys))
