"""``forge``: every capability headless, for scripts and CI.

Bad input ends with one line on stderr naming the cause and a non-zero exit status.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import ForgeError


def _progress(quiet: bool):
    """Progress lines on stderr, for people: shown only on a terminal, so that a script reading
    stderr sees just the one error line when something is wrong."""
    show = not quiet and sys.stderr.isatty()

    def emit(msg: str) -> None:
        if show:
            print(f"forge: {msg}", file=sys.stderr, flush=True)

    return emit


def cmd_profile(args) -> int:
    from .profiler.run import profile_into_workspace
    from .table import render
    from .workload import resolve_path

    ws_path = args.workspace or Path("workspaces") / resolve_path(args.workload).stem
    ws, result = profile_into_workspace(args.workload, ws_path, device=args.device, dtype=args.dtype,
                                        config_path=args.config, progress=_progress(args.quiet))
    title = f"{ws.meta['workload']['name']} on {result.device_name}: forward {result.forward.median:.1f} µs " \
            f"(spread {100 * result.forward.spread:.1f}%)"
    print(render(result.cards, title=title, limit=args.limit), end="")
    cov = result.coverage
    print(f"{len(result.cards)} cards ({sum(c.kind == 'op' for c in result.cards)} op, "
          f"{sum(c.kind == 'module' for c in result.cards)} module); op cards cover {100 * cov['op']:.0f}% "
          f"of the forward; skipped calls: " + ", ".join(f"{k} {v}" for k, v in result.skipped.items() if v))
    for w in result.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"workspace: {ws.root}")
    return 0


def cmd_cards(args) -> int:
    from .table import render
    from .workspace import Workspace

    ws = Workspace.open(args.workspace)
    cards = ws.cards()
    if args.kind:
        cards = [c for c in cards if c.kind == args.kind]
    summary = ws.profile_summary()
    title = f"{ws.meta['workload']['name']} on {ws.meta.get('device_name', '?')}"
    if summary:
        title += f": forward {summary['forward_us']['median']:.1f} µs"
    print(render(cards, title=title, limit=args.limit), end="")
    return 0


def cmd_examples(args) -> int:
    from .examples import EXAMPLES

    for name, desc in EXAMPLES.items():
        print(f"example:{name:16s} {desc}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(prog="forge", description="forge-tui, headless: profile a PyTorch workload into "
                                "operator cards, search for faster kernels, evaluate and promote them.")
    p.add_argument("--version", action="version", version=f"forge-tui {__version__}")
    p.add_argument("--config", type=Path, help="forge.toml to use (default: ./forge.toml, then the workspace's)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sp = sub.add_parser("profile", help="profile a workload into operator cards in a workspace")
    sp.add_argument("workload", help="a workload .py file, or example:NAME (see 'forge examples')")
    sp.add_argument("-w", "--workspace", type=Path, help="workspace folder (default: workspaces/<workload name>)")
    sp.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda when available, else cpu")
    sp.add_argument("--dtype", help="cast the model and floating inputs: fp32, fp16 or bf16 (default: the workload's)")
    sp.add_argument("--limit", type=int, default=None, help="print only the first N rows of the table")
    sp.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    sp.set_defaults(func=cmd_profile)

    sp = sub.add_parser("cards", help="print a workspace's op table")
    sp.add_argument("workspace", type=Path)
    sp.add_argument("--kind", choices=["op", "module"])
    sp.add_argument("--limit", type=int, default=None)
    sp.set_defaults(func=cmd_cards)

    sp = sub.add_parser("examples", help="list the bundled example workloads")
    sp.set_defaults(func=cmd_examples)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ForgeError as err:
        print(f"forge: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("forge: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
