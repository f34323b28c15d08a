"""The rewrites' registry (``forge_tui.rewrites.REWRITES``) drives the CLI, the app's ``m`` path,
the search's replaced sites and the bench's switch-off units: every registered rewrite is a
``forge`` subcommand with its help, pairs with a runtime installer, and a rewrite registered in
the registry alone (a fake, here) is listed by the CLI, run by it and by the app's ``m``. Card
kinds are one ``StrEnum`` whose JSON is the plain strings it replaced."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest
from conftest import FAST_TOML

from forge_tui.cards import Card, CardKind
from forge_tui.cli import build_parser, main
from forge_tui.rewrites import REWRITES, Rewrite
from forge_tui.rewrites.base import RewriteCard

HERE = Path(__file__).parent
WORKLOAD = HERE / "data" / "workloads" / "rmsnorm.py"


def subcommands() -> dict[str, Any]:
    """``forge``'s subcommands: name -> (its parser, its help in ``forge --help``)."""
    import argparse

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    return {name: (p, helps.get(name)) for name, p in sub.choices.items()}


def test_every_registered_rewrite_is_a_subcommand_with_its_help():
    cmds = subcommands()
    assert list(REWRITES) == ["fold", "experts", "merge"]  # the order the app and the bench run them
    for name, rewrite in REWRITES.items():
        parser, help_text = cmds[name]
        assert help_text.startswith(rewrite.help) and f"promoted as {name} cards" in help_text
        assert rewrite.own in " ".join(parser.format_help().split())
        args = build_parser().parse_args([name, "example:tiny_mlp", "-w", "ws", "--dry-run"])
        assert args.rewrite == name and args.dry_run


def test_each_rewrite_pairs_with_its_runtime_installer_and_its_card_class():
    import importlib

    from forge_tui.runtime.apply import KINDS

    for rewrite in REWRITES.values():
        assert KINDS[rewrite.kind].__name__ == rewrite.installer
        mod = importlib.import_module(f"forge_tui.rewrites.{rewrite.name}")
        cards = [v for v in vars(mod).values() if isinstance(v, type) and issubclass(v, RewriteCard)
                 and v is not RewriteCard]
        assert [c.kind for c in cards] == [rewrite.kind] and cards[0].file == rewrite.file
        assert mod.REWRITE is rewrite and rewrite.installer in (mod.__doc__ or "").replace("/", ".")


@dataclass
class FakeCard:
    card: str
    refused: str = ""

    def line(self) -> str:
        return f"{self.card}: a fake rewrite's card"


@pytest.fixture
def registry():
    """The registry, given back as it was (its order too) after the test."""
    before = dict(REWRITES)
    yield REWRITES
    REWRITES.clear()
    REWRITES.update(before)


@pytest.fixture
def fake(registry):
    """A rewrite registered in the registry alone (``fake``), its calls recorded."""
    calls: list[dict[str, Any]] = []

    def run(spec: str, ws: Any, **kw: Any):
        calls.append({"spec": spec, "ws": Path(ws.root)} | kw)
        return [FakeCard("fake-1"), FakeCard("fake-2", refused="slower")], {"body.x": "not a fake site"}, []

    rewrite = Rewrite(name="fake", kind=CardKind.MERGE, installer="forge_tui.runtime.kinds.merge", file="fake.json",
                      run=run, help="rewrite nothing, for the test", own="the fake's own calls", unit="fakes",
                      not_served="not faked", doing="faking the rewrite", report_key="not_faked")
    registry["fake"] = rewrite
    return calls


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """The RMSNorm workload profiled on the CPU: a workspace the fake rewrite runs on (it writes nothing)."""
    from forge_tui.workspace import profile_into_workspace

    root = tmp_path_factory.mktemp("rewrites-ws")
    cfg = root / "forge.toml"
    cfg.write_text(FAST_TOML)
    ws, _ = profile_into_workspace(str(WORKLOAD), root / "ws", device="cpu", config_path=cfg)
    return ws


def test_a_registered_rewrite_is_listed_and_run_by_the_cli(fake, profiled, capsys):
    assert "rewrite nothing, for the test" in subcommands()["fake"][1]
    root = profiled.root
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "fake" in capsys.readouterr().out
    assert main(["fake", str(WORKLOAD), "-w", str(root), "--device", "cpu", "--dry-run", "--repeats", "3"]) == 0
    out = capsys.readouterr().out
    assert "fake-1: a fake rewrite's card" in out and "body.x: not faked: not a fake site" in out
    assert "dry run: 1 fake cards would be promoted" in out
    assert fake == [{"spec": str(WORKLOAD), "ws": Path(root), "device": "cpu", "dtype": None, "dry_run": True,
                     "repeats": 3, "min_speedup": None}]


def test_a_registered_rewrite_is_run_by_the_apps_m(fake, profiled):
    from forge_tui.ui.app import ForgeApp
    from forge_tui.ui.screens.fallback import FallbackScreen

    for name in ("fold", "experts", "merge"):  # the fake alone: the real ones are tested in test_ui
        del REWRITES[name]

    async def until(pilot, cond, what: str, timeout: float = 120.0) -> None:
        for _ in range(int(timeout / 0.05)):
            if cond():
                return
            await pilot.pause(0.05)
        raise AssertionError(f"timed out waiting for {what}: {pilot.app.log_lines[-8:]}")

    async def scenario():
        app = ForgeApp(profiled.root, autostart=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.cards, "the cards")
            await pilot.press("3")
            await until(pilot, lambda: isinstance(app.screen, FallbackScreen), "the fallback screen")
            await pilot.press("m")
            await until(pilot, lambda: app.rewritten, "the rewrites")
            assert not app.failures, [f.error for f in app.failures]
            assert "faking the rewrite (forge fake) ..." in app.log_lines
            assert "fake: fake-1: a fake rewrite's card" in app.log_lines
            assert "fake: body.x: not a fake site" in app.log_lines and "fake: promoted 0 card(s)" in app.log_lines

    asyncio.run(scenario())
    assert len(fake) == 1 and fake[0]["ws"] == Path(profiled.root) and fake[0]["device"] == "cpu"


def test_the_search_skips_cards_a_registered_rewrite_replaces(fake, monkeypatch):
    from forge_tui.search import runner

    entry = lambda kind, paths, enabled=True: NS(signature=NS(kind=kind, module_paths=paths), enabled=enabled)  # noqa: E731
    man = NS(entries={"k": entry("module", ["a.norm"]), "f": entry("fold", ["a.bn"]), "x": entry("merge", ["b.q"]),
                      "off": entry("experts", ["c"], enabled=False)})
    monkeypatch.setattr(runner, "manifest", lambda ws: man)
    assert runner.replaced_sites(NS()) == {"a.bn": "f", "b.q": "x"}
    del REWRITES["merge"], REWRITES["fake"]  # no rewrite left whose cards are merges: the search searches there
    assert runner.replaced_sites(NS()) == {"a.bn": "f"}


def test_the_bench_switches_off_a_rewrites_cards_together_as_its_entry_says(registry):
    from dataclasses import replace

    from forge_tui.e2e.switch_off import switch_off_units

    entry = lambda kind, paths=(): NS(signature=NS(kind=kind, module_paths=list(paths)))  # noqa: E731
    man = NS(entries={"f1": entry("fold"), "f2": entry("fold"), "e1": entry("experts"), "e2": entry("experts"),
                      "m1": entry("module", ["n"])})
    served = ["f1", "e1", "f2", "e2", "m1"]
    assert switch_off_units(man, served) == [["f1", "f2"], ["e1"], ["e2"], ["m1"]]
    registry["experts"] = replace(registry["experts"], switched_off_together=True)
    assert switch_off_units(man, served) == [["f1", "f2"], ["e1", "e2"], ["m1"]]


def test_card_kinds_read_and_write_the_strings_they_replaced():
    raw = {"id": "c1", "kind": "module", "target": "module:RMSNorm", "label": "", "inputs": [], "outputs": [],
           "program": {}}
    card = Card.model_validate_json(json.dumps(raw))
    assert card.kind is CardKind.MODULE and card.kind == "module" and f"{card.kind}" == "module"
    assert json.loads(card.model_dump_json())["kind"] == "module"
    assert json.dumps(card.model_dump(mode="json")["kind"]) == '"module"'
    with pytest.raises(ValueError):
        Card.model_validate(raw | {"kind": "fold"})  # a rewrite's kind is no profiled card's
