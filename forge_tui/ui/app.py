"""``forge-tui``: the terminal app.

``forge-tui WORKSPACE`` opens a workspace; ``--workload FILE`` profiles first (in a worker
thread, with live progress); ``--search`` then runs a kernel search with the built-in template
proposer, its events streaming into the status pane. ``forge-tui`` alone is the demo: it
profiles the bundled CPU example into ``workspaces/demo`` the first time, then searches.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Footer, Header, Log

from ..errors import ForgeError

if TYPE_CHECKING:
    from ..search.runner import Search
from .messages import SearchEventPosted
from .widgets.card_detail import CardDetail
from .widgets.op_table import OpTable

DEMO_WORKLOAD = "example:tiny_decoder"
DEMO_WORKSPACE = Path("workspaces") / "demo"
DEMO_SEARCH = {"max_evals": 12, "evals_per_card": 4, "parallel": 2, "top": 4}


class ForgeApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "forge-tui"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("m", "filter('module')", "Modules"),
        Binding("o", "filter('op')", "Ops"),
        Binding("a", "filter(None)", "All"),
    ]

    def __init__(self, workspace: Path, workload: str | None = None, device: str | None = None,
                 dtype: str | None = None, config: Path | None = None, search: dict | None = None) -> None:
        super().__init__()
        self.search_settings = search
        self._search: Search | None = None
        self.workspace_path = Path(workspace)
        self.workload = workload
        self.device = device
        self.dtype = dtype
        self.config_path = config
        self.all_cards: list = []
        self.error: str | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="main"):
            yield OpTable(id="optable")
            yield CardDetail(id="detail")
        yield Log(id="status", auto_scroll=True)
        yield Footer()

    def on_mount(self) -> None:
        from ..workspace import is_workspace

        if self.workload is not None and not is_workspace(self.workspace_path):
            self.status(f"profiling {self.workload} into {self.workspace_path} ...")
            self.profile_worker()
        else:
            self.load_workspace()

    def status(self, line: str) -> None:
        self.query_one("#status", Log).write_line(line)

    def load_workspace(self) -> None:
        from ..workspace import Workspace

        try:
            ws = Workspace.open(self.workspace_path)
            self.all_cards = ws.cards()
        except ForgeError as err:
            self.error = str(err)
            self.status(f"error: {err}")
            return
        meta = ws.meta
        self.sub_title = f"{meta['workload']['name']} on {meta.get('device_name', '?')} - {ws.root}"
        table = self.query_one(OpTable)
        table.show_cards(self.all_cards)
        table.focus()
        self.status(f"{len(self.all_cards)} cards loaded from {ws.root}")
        if self.search_settings is not None and self._search is None:
            self.status("searching with the built-in template proposer (q stops it and quits) ...")
            self.search_worker()

    @work(thread=True, exclusive=True, group="search")
    def search_worker(self) -> None:
        """A search on the workspace (the session's proposer), resumed if one is recorded; every
        event reaches the app as a Textual message."""
        from ..search.events import EventBus
        from ..session import Session

        try:
            session = Session.open(self.workspace_path, self.config_path).with_search_settings(
                **(self.search_settings or {}))
            resume = session.has_search()  # damaged records too: never start over them
            bus = EventBus()
            bus.subscribe(lambda e: self.post_message(SearchEventPosted(e)))
            with session.search(proposer="auto", backend=session.profiled_backend(), bus=bus) as search:
                self._search = search
                self.call_from_thread(self.status, session.notes[-1])
                summary = search.run(resume=resume)
        except ForgeError as err:
            self.call_from_thread(self.status, f"search: {err}")
            return
        except Exception as exc:  # noqa: BLE001 - the app stays up whatever the search does
            self.call_from_thread(self.status, f"search failed: {type(exc).__name__}: {exc}")
            return
        best = ", ".join(f"{c[:24]} {b['speedup']:.2f}x" for c, b in summary.best.items() if b["node"] != "root")
        self.call_from_thread(self.status, f"search stopped: {summary.stopped}; best: {best or 'eager everywhere'}")

    def on_search_event_posted(self, message: "SearchEventPosted") -> None:
        if message.event.persistent:
            self.status(message.event.line())

    async def action_quit(self) -> None:
        if self._search is not None:
            self._search.request_stop("stopped from the app")
        self.exit()

    @work(thread=True, exclusive=True, group="profile")
    def profile_worker(self) -> None:
        from ..session import Session

        def progress(msg: str) -> None:
            self.call_from_thread(self.status, msg)

        if self.workload is None:
            return
        try:
            Session.profile(self.workload, self.workspace_path, device=self.device, dtype=self.dtype,
                            config=self.config_path, progress=progress)
        except ForgeError as err:
            self.call_from_thread(self._profile_failed, str(err))
            return
        except Exception as exc:  # noqa: BLE001 - the app never goes down with the worker
            self.call_from_thread(self._profile_failed, f"{type(exc).__name__}: {exc}")
            return
        self.call_from_thread(self.load_workspace)

    def _profile_failed(self, message: str) -> None:
        self.error = message
        self.status(f"profile failed: {message}")

    def on_op_table_card_highlighted(self, event: OpTable.CardHighlighted) -> None:
        for detail in self.query(CardDetail):  # absent while the app shuts down
            detail.show(event.card)

    def action_filter(self, kind: str | None) -> None:
        cards = self.all_cards if kind is None else [c for c in self.all_cards if c.kind == kind]
        self.query_one(OpTable).show_cards(cards)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="forge-tui", description="forge-tui: the terminal app. With no arguments, "
                                f"opens the demo workspace ({DEMO_WORKSPACE}), profiling {DEMO_WORKLOAD} first.")
    p.add_argument("workspace", nargs="?", type=Path, help="workspace to open")
    p.add_argument("--workload", help="profile this workload into the workspace first (if it is not one yet)")
    p.add_argument("--device", choices=["cuda", "cpu"])
    p.add_argument("--dtype")
    p.add_argument("--config", type=Path)
    p.add_argument("--search", action="store_true", help="run a template search once the workspace is loaded")
    args = p.parse_args(argv)
    workspace, workload = args.workspace, args.workload
    search: dict[str, Any] | None = {} if args.search else None
    if workspace is None:
        workspace = DEMO_WORKSPACE
        workload = workload or DEMO_WORKLOAD
        search = DEMO_SEARCH
    from ..workspace import Workspace, check_target

    try:
        if workload is None:
            Workspace.open(workspace)
        else:
            check_target(workspace)
    except ForgeError as err:
        print(f"forge-tui: error: {err}", file=sys.stderr)
        return err.exit_code
    app = ForgeApp(workspace, workload, args.device, args.dtype, args.config, search=search)
    app.run()
    if app.error:
        print(f"forge-tui: error: {app.error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
