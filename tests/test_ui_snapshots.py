"""Snapshots of every screen at 80x24 and at 120x40, on fixed data (tests/ui_fixtures.py), each
taken once the profile's rows (and what workers read with them) have arrived: no measured time,
time stamp or temporary path reaches a screen. Update them, after looking at the difference, with
``pytest tests/test_ui_snapshots.py --snapshot-update``."""

from __future__ import annotations

from pathlib import Path

import pytest
from ui_fixtures import FixtureBackend, FixtureDescriber

from forge_tui.ui.app import ForgeApp

SIZES = {"small": (80, 24), "wide": (120, 40)}


def make_app(theme: str = "textual-dark") -> ForgeApp:
    app = ForgeApp(Path("fixture"), backend=FixtureBackend(), describer=FixtureDescriber(), live_refresh=False)
    app.theme = theme
    return app


async def settle(pilot) -> None:
    """Until the workers have answered and the screen has drawn what they brought: the cards
    (the op table's rows, the card pane's offline-kernel line) first of all."""
    app = pilot.app
    for _ in range(400):
        if app.cards and app.offline:
            break
        await pilot.pause(0.05)
    assert app.cards and app.offline, "the profile's rows never arrived"
    for _ in range(2):
        await pilot.pause()
        await app.workers.wait_for_complete()
    await pilot.pause()


def steps(*keys: str):
    async def run(pilot) -> None:
        await settle(pilot)
        for key in keys:
            await pilot.press(key)
            await settle(pilot)

    return run


SCREENS = {
    "workload": steps(),
    # the best node of the RMSNorm card: its source, highlighted
    "search": steps("2", "down", "down", "down", "down", "down"),
    # the build failure: its diagnostics (Enter would jump to the line)
    "search_errors": steps("2", "down", "down", "down", "down", "e"),
    "fallback": steps("3"),
    "approvals": steps("4"),
    "replay": steps("5", "left", "left", "left"),
    "plots": steps("6"),
    # a draft to review: the reference and its inputs
    "describe": steps("7", "i", *"gelu over (64, 256) fp32", "enter", "escape"),
}


# the selected node's other panes, at 80x24
PANES = {
    "diff": steps("2", "down", "down", "down", "down", "down", "d"),
    "tests": steps("2", "down", "down", "down", "down", "down", "r"),
    "ncu": steps("2", "down", "down", "down", "down", "down", "n"),
    # the agent's node on the softmax card: its transcript
    "agent": steps("2", *["down"] * 9, "t"),
}


@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("screen", list(SCREENS))
def test_screen(snap_compare, screen, size):
    assert snap_compare(make_app(), terminal_size=SIZES[size], run_before=SCREENS[screen])


@pytest.mark.parametrize("pane", list(PANES))
def test_node_pane(snap_compare, pane):
    assert snap_compare(make_app(), terminal_size=SIZES["small"], run_before=PANES[pane])


def test_light_theme(snap_compare):
    assert snap_compare(make_app("textual-light"), terminal_size=SIZES["small"], run_before=SCREENS["search"])
