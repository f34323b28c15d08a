"""The Textual app on a real workspace (Pilot)."""

import asyncio

from forge_tui.ui.app import ForgeApp
from forge_tui.ui.widgets.card_detail import CardDetail
from forge_tui.ui.widgets.op_table import OpTable


def test_op_table_screen(decoder_workspace):
    async def scenario():
        app = ForgeApp(decoder_workspace.root)
        async with app.run_test(size=(160, 50)) as pilot:
            await pilot.pause()
            table = app.query_one(OpTable)
            cards = decoder_workspace.cards()
            assert table.row_count == len(cards)
            detail = app.query_one(CardDetail)
            assert cards[0].label in str(detail.render())
            await pilot.press("down")
            await pilot.pause()
            assert cards[1].id in str(detail.render())
            await pilot.press("m")
            await pilot.pause()
            assert table.row_count == sum(c.kind == "module" for c in cards) > 0
            await pilot.press("a")
            await pilot.pause()
            assert table.row_count == len(cards)

    asyncio.run(scenario())


def test_profiles_in_a_worker_then_shows_table(tmp_path, fast_config):
    async def scenario():
        app = ForgeApp(tmp_path / "fresh", workload="example:kb_softmax", device="cpu")
        async with app.run_test() as pilot:
            for _ in range(400):
                await pilot.pause(0.05)
                if app.query_one(OpTable).row_count:
                    break
            assert app.query_one(OpTable).row_count >= 1
            assert app.error is None

    asyncio.run(scenario())


def test_bad_workspace_shows_error_without_crashing(tmp_path):
    async def scenario():
        app = ForgeApp(tmp_path / "nothing")
        async with app.run_test() as pilot:
            await pilot.pause()
            assert app.error and "no workspace at" in app.error

    asyncio.run(scenario())


def test_search_runs_in_a_worker_and_streams_events(tmp_path, fast_config):
    """The demo flow: profile, then a template search off the UI thread; the app stays responsive."""
    from textual.widgets import Log

    async def scenario():
        app = ForgeApp(tmp_path / "demo", workload="example:kb_softmax", device="cpu",
                       search={"max_evals": 2, "parallel": 1, "min_gain": 0.0})
        async with app.run_test() as pilot:
            log = app.query_one("#status", Log)
            for _ in range(6000):  # up to 5 minutes on a loaded machine; a quiet one takes seconds
                await pilot.pause(0.05)
                if any("search stopped" in line for line in log.lines):
                    break
            text = "\n".join(log.lines)
            assert "search started" in text and "node_added" not in text
            assert "root: eager reference" in text and "search stopped" in text, text
            await pilot.press("down")  # still answering keys

    asyncio.run(scenario())
