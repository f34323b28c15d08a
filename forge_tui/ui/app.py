"""``forge-tui``: the terminal app.

``forge-tui WORKSPACE`` opens a workspace; ``forge-tui --workload FILE -w WS`` profiles first
(in a worker thread, with live progress); ``forge-tui`` alone opens the demo workspace,
profiling the bundled CPU example into ``workspaces/demo`` the first time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Footer, Header, Log

from ..errors import ForgeError
from .widgets.card_detail import CardDetail
from .widgets.op_table import OpTable

DEMO_WORKLOAD = "example:tiny_decoder"
DEMO_WORKSPACE = Path("workspaces") / "demo"


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
                 dtype: str | None = None, config: Path | None = None) -> None:
        super().__init__()
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

    @work(thread=True, exclusive=True, group="profile")
    def profile_worker(self) -> None:
        from ..profiler.run import profile_into_workspace

        def progress(msg: str) -> None:
            self.call_from_thread(self.status, msg)

        try:
            profile_into_workspace(self.workload, self.workspace_path, device=self.device, dtype=self.dtype,
                                   config_path=self.config_path, progress=progress)
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
    args = p.parse_args(argv)
    workspace, workload = args.workspace, args.workload
    if workspace is None:
        workspace = DEMO_WORKSPACE
        workload = workload or DEMO_WORKLOAD
    from ..workspace import Workspace, check_target

    try:
        if workload is None:
            Workspace.open(workspace)
        else:
            check_target(workspace)
    except ForgeError as err:
        print(f"forge-tui: error: {err}", file=sys.stderr)
        return err.exit_code
    app = ForgeApp(workspace, workload, args.device, args.dtype, args.config)
    app.run()
    if app.error:
        print(f"forge-tui: error: {app.error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
