"""``forge-tui``'s start-up and end: its command line, the demo it opens with no arguments, the
command textual-serve runs for each browser session, and the process's end once the app has
ended (``finish``)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import threading
from pathlib import Path
from typing import Any

from ..errors import ForgeError
from .app import ForgeApp

DEMO_WORKLOAD = "example:tiny_decoder"
DEMO_WORKSPACE = Path("workspaces") / "demo"
DEMO_SEARCH = {"max_evals": 12, "evals_per_card": 4, "parallel": 2, "top": 4}


def finish(app: ForgeApp) -> int:
    """The process's end once the app has ended: its exit status, without waiting for the work
    still running in threads (a search's evaluations, a model run). Every finished node is already
    committed to git; what was in flight is lost, as after ``kill -9``, which the store is made for."""
    code = 0
    if app.error:
        print(f"forge-tui: error: {app.error}", file=sys.stderr)
        code = 2
    app.release()
    if any(t.is_alive() for t in threading.enumerate() if t is not threading.main_thread()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # threads at work: the interpreter's exit would join them
    return code


def serve_command(argv: list[str]) -> str:
    """The command textual-serve runs for each browser session: this app, without --serve."""
    args, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--host", "--port"):
            skip = True
            continue
        if a == "--serve" or a.startswith(("--host=", "--port=")):
            continue
        args.append(a)
    return shlex.join([sys.executable, "-m", "forge_tui.ui.startup", *args])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="forge-tui", description="forge-tui: the terminal app. With no arguments, "
                                f"opens the demo workspace ({DEMO_WORKSPACE}), profiling {DEMO_WORKLOAD} first.")
    p.add_argument("workspace", nargs="?", type=Path, help="workspace to open")
    p.add_argument("--workload", help="profile this workload into the workspace first (if it is not one yet)")
    p.add_argument("--device", choices=["cuda", "cpu"])
    p.add_argument("--dtype")
    p.add_argument("--config", type=Path)
    p.add_argument("--proposer", default="auto", help="auto (default), agent, templates or scripted:PLAN.json")
    p.add_argument("--search", action="store_true", help="start a search once the workspace is loaded")
    p.add_argument("--serve", action="store_true", help="serve the app to a browser (textual-serve)")
    p.add_argument("--host", default="localhost")
    p.add_argument("--port", type=int, default=8000)
    args = p.parse_args(argv)
    if args.serve:
        from textual_serve.server import Server

        Server(serve_command(argv), host=args.host, port=args.port, title="forge-tui").serve()
        return 0
    workspace, workload = args.workspace, args.workload
    search: dict[str, Any] = {}
    if workspace is None:
        workspace = DEMO_WORKSPACE
        workload = workload or DEMO_WORKLOAD
        search = dict(DEMO_SEARCH)
    from ..workspace import Workspace, check_target

    try:
        if workload is None:
            Workspace.open(workspace)
        else:
            check_target(workspace)
    except ForgeError as err:
        print(f"forge-tui: error: {err}", file=sys.stderr)
        return err.exit_code
    app = ForgeApp(workspace, workload, args.device, args.dtype, args.config, search=search, autostart=args.search,
                   proposer=args.proposer)
    app.run()
    return finish(app)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
