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
    from .cards import KERNEL_KINDS
    from .session import Session
    from .table import render
    from .workload import resolve_path

    ws_path = args.workspace or Path("workspaces") / resolve_path(args.workload).stem
    session, result = Session.profile(args.workload, ws_path, device=args.device, dtype=args.dtype,
                                      config=args.config, progress=_progress(args.quiet), generate=args.generate)
    ws = session.workspace
    what = "forward" if args.generate is None else f"generation of {args.generate} tokens"
    title = f"{ws.meta['workload']['name']} on {result.device_name}: {what} {result.forward.median:.1f} µs " \
            f"(spread {100 * result.forward.spread:.1f}%" + \
            (", NOT TRUSTWORTHY: the machine was busy)" if result.forward_noisy else ")")
    print(render(result.cards, title=title, limit=args.limit), end="")
    cov = result.coverage
    kinds = {k: sum(c.kind == k for c in result.cards) for k in KERNEL_KINDS}
    print(f"{len(result.cards)} cards (" + ", ".join(f"{n} {k}" for k, n in kinds.items()) + "); "
          f"op cards cover {100 * cov['op']:.0f}% "
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


def _load_card(spec: str, workspace: Path | None):
    """A card id (or unique prefix) in the workspace, or a path to a card's JSON file."""
    from .cards import Card
    from .workspace import Workspace

    path = Path(spec)
    if path.suffix == ".json" and path.is_file():
        card = Card.model_validate_json(path.read_text())
        ws = Workspace.open(workspace or path.resolve().parent.parent)
        return ws, card
    ws = Workspace.open(workspace or Path("."))
    return ws, ws.card(spec)


def cmd_eval(args) -> int:

    from .evaluator import EvalOptions
    from .evaluator.report import format_result
    from .session import Session

    src_path = Path(args.source)
    if not src_path.is_file():
        raise ForgeError(f"candidate source not found: {src_path}")
    ws, card = _load_card(args.card, args.workspace)
    session = Session.open(ws.root, args.config)
    opts = EvalOptions(static_checks=not args.no_static, profile=args.profile, seed=args.seed,
                       allow_libraries=args.allow_libraries)
    with session.evaluator(args.backend) as ev:
        result = ev.evaluate(card, src_path.read_text(), opts)
    if args.json:
        print(result.to_json())
    else:
        print(format_result(result))
    return 0 if result.passed else 1


def cmd_search(args) -> int:
    from .search.events import AgentStep, EventBus, StoreDamaged
    from .session import Session

    session = Session.open(args.workspace, args.config).with_search_settings(
        max_evals=args.max_evals, evals_per_card=args.evals_per_card, parallel=args.parallel,
        max_wall_s=args.max_wall_s)
    if args.fresh:
        print(f"removed {session.discard_search()} search refs", file=sys.stderr)
    bus = EventBus()
    if not args.quiet:
        bus.subscribe(lambda e: (e.persistent or isinstance(e, AgentStep)) and print(e.line(), flush=True))
    # damaged records: one line each on stderr (quiet or not), and the search goes on without them
    bus.subscribe(lambda e: isinstance(e, StoreDamaged) and print(e.line(), file=sys.stderr, flush=True))
    cluster = _ClusterLines(args.quiet)
    bus.subscribe(cluster)
    with session.search(proposer=args.proposer, backend=args.backend, cards=args.cards, bus=bus,
                        cluster=args.cluster) as search:
        if not args.quiet:
            for note in session.notes:
                print(note, flush=True)
        summary = search.run(resume=args.resume or args.fresh)
    for cid, why in summary.skipped.items():
        print(f"skipped {cid}: {why}")
    for cid, b in summary.best.items():
        print(f"best {cid}: {b['node']} {b['speedup']:.3f}x ({b['move']})")
    for line in cluster.summary():
        print(line)
    print(f"stopped: {summary.stopped}; {summary.evaluations} evaluations, {summary.wall_s:.1f} s, "
          f"git {summary.git_s:.2f} s ({100 * summary.git_s / max(summary.wall_s, 1e-9):.1f}%), ${summary.cost_usd:.2f}")
    for failure in (summary.git_failure, summary.pool_failure):
        if failure:
            print(f"forge: error: {failure}", file=sys.stderr)
            return 1
    return 0


class _ClusterLines:
    """The cluster pool's events for ``forge search``: workers joining, leaving or refused (always),
    the workers and evaluations in flight as they change (unless quiet), and each worker's share."""

    def __init__(self, quiet: bool) -> None:
        from .cluster.events import ClusterStatus

        self.quiet = quiet
        self.last: ClusterStatus | None = None

    def __call__(self, e) -> None:
        from .cluster.events import ClusterStatus, WorkerChanged

        if isinstance(e, WorkerChanged):
            print(e.line(), file=sys.stderr if e.change == "refused" else sys.stdout, flush=True)
        elif isinstance(e, ClusterStatus):
            self.last = e
            if not self.quiet:
                print(e.line(), flush=True)

    def summary(self) -> list[str]:
        if self.last is None:
            return []
        lines = [f"worker {w.address} on {w.host} ({w.device}): {w.state}, {w.done} evaluations"
                 + (f" ({w.reason})" if w.reason else "") for w in self.last.workers]
        lines += [f"card {card} timed on {device}" for card, device in sorted(self.last.pinned.items())]
        return lines


def cmd_retime(args) -> int:
    from .search.events import EventBus
    from .session import Session

    session = Session.open(args.workspace, args.config)
    bus = EventBus()
    cluster = _ClusterLines(quiet=True)
    bus.subscribe(cluster)
    with session.search(proposer="templates", backend=args.backend, cards=args.cards, bus=bus,
                        cluster=args.cluster) as search:
        summary = search.retime()
    for line in search.retime_lines():
        print(line)
    for line in cluster.summary():
        print(line)
    print(f"{summary.evaluations} evaluations, {summary.wall_s:.1f} s; {summary.stopped}")
    if summary.pool_failure:
        print(f"forge: error: {summary.pool_failure}", file=sys.stderr)
        return 1
    return 0


def cmd_replay(args) -> int:
    import json

    from .cards import id_matches
    from .search.replay import format_event, format_trees, load_replay
    from .workspace import Workspace

    ws = Workspace.open(args.workspace)
    events, damaged = load_replay(ws)
    if args.card:
        events = [e for e in events if e.card is None or id_matches(e.card, args.card)]
        damaged = [d for d in damaged if d.card is None or id_matches(d.card, args.card)]
    for d in damaged:  # left out of the replay, each named on stderr; the rest replays as usual
        print(d.line, file=sys.stderr)
    if args.json:
        print(json.dumps([e.to_json() for e in events], indent=1))
        return 0
    if not events:
        print(f"no search recorded in {ws.root}" if not damaged else
              f"nothing in {ws.root} can be replayed: every recorded item is damaged")
        return 0
    for e in events:
        print(format_event(e))
    print()
    print(format_trees(events))
    return 0


def cmd_new(args) -> int:
    import shutil
    import tempfile

    from .config import discover_config
    from .describe import accept, check_agent, default_workspace, draft_reference
    from .table import render
    from .workspace import check_target

    description = " ".join(args.description.split())
    ws_path = args.workspace or default_workspace(description)
    if check_target(ws_path) != "new":
        raise ForgeError(f"{ws_path} is already a workspace: forge new makes a new one (choose another path with -w)")
    cfg, _ = discover_config(args.config, None)
    check_agent(cfg)  # no agent: one line naming why, before anything else
    if not args.yes and not sys.stdin.isatty():
        raise ForgeError("forge new asks you to approve the reference, and stdin is not a terminal: "
                         "pass --yes to accept it without asking")
    progress = _progress(False)
    workdir = Path(tempfile.mkdtemp(prefix="forge-new-"))
    keep = False
    try:
        progress("the LLM agent is writing the reference")
        draft = draft_reference(description, cfg, workdir=workdir, on_step=lambda info: progress(
            f"step {info['step']} (${info['conversation_cost_usd']:.4f}): {info['summary'] or 'no tool called'}"))
        print(draft.text(), flush=True)
        if not draft.ok:
            keep = True
            raise ForgeError(f"no card: {draft.why_not} (the conversation is in {workdir})", exit_code=1)
        if not args.yes:
            try:
                answer = input("Use this as the card? [y/N] ")
            except EOFError:
                answer = ""
            if answer.strip().lower() not in ("y", "yes"):
                print("not used: no workspace was made")
                return 1
        made = accept(draft, ws_path, device=args.device, config_path=args.config, reuse=False,
                      approved_by="forge new --yes" if args.yes else "", progress=progress)
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    ws, card = made.workspace, made.card
    print(f"\ncard {card.id}, the reference {draft.name} wrapped and profiled:")
    print(render([card], title=f"{draft.name} on {ws.meta.get('device_name', '?')}"), end="")
    print(f"workspace: {ws.root}")
    print(f"next: forge search {ws.root}")
    return 0


def cmd_examples(args) -> int:
    from .examples import EXAMPLES

    for name, desc in EXAMPLES.items():
        print(f"example:{name:16s} {desc}")
    return 0


def cmd_approve(args) -> int:
    from .promotion import AutoRule, approve, requests, unrequested
    from .workspace import Workspace

    ws = Workspace.open(args.workspace)

    def not_offered(pending: list | None = None) -> None:
        for card, why in unrequested(ws, args.cards or None, pending=pending):
            print(f"not offered {card}: {why}")

    if args.list:
        pending = requests(ws, args.cards or None)
        for r in pending:
            print(r.line())
        if not pending:
            print("no pending promotion request")
        not_offered(pending)
        return 0
    auto = AutoRule(args.min_speedup, args.max_spread) if args.auto else None
    done, left = approve(ws, args.cards or None, auto=auto)
    for e in done:
        b = ", ".join(f"{x.backend}/{x.arch}" for x in e.builds)
        print(f"approved {e.card}: {e.evidence.node} {e.evidence.speedup_vs_eager:.3f}x eager (built for {b})")
    for r, why in left:
        print(f"left {r.card.id}: {why}")
    if not done and not left:
        print("no pending promotion request")
        not_offered([])
    return 0


def cmd_reject(args) -> int:
    from .promotion import reject
    from .workspace import Workspace

    for r in reject(Workspace.open(args.workspace), args.cards, reason=args.reason):
        print(f"rejected {r.card}: {r.node}")
    return 0


def _status_line(card: str, e) -> str:
    """One promoted kernel's line: whatever its evidence holds (an entry promoted without a
    measured speedup says so instead of failing to format it)."""
    state = "on" if e.enabled else f"switched off: {e.disabled_reason or 'no reason recorded'}"
    if e.compile_disabled_reason:
        state += f"; under torch.compile off: {e.compile_disabled_reason}"
    if e.graph_disabled_reason:
        state += f"; in CUDA graphs off: {e.graph_disabled_reason}"
    sp = e.evidence.speedup_vs_eager
    speed = f"{sp:.3f}x eager" if isinstance(sp, (int, float)) else "no measured speedup"
    return f"{card}: {e.evidence.node} {speed}, approved by {e.approved_by} at {e.approved_at}; {state}"


def cmd_status(args) -> int:
    from .promotion import manifest
    from .runtime.status import format_status, read_status
    from .workspace import Workspace

    ws = Workspace.open(args.workspace)
    man = manifest(ws)
    if not man.entries:
        print(f"no promoted kernels in {ws.root} (forge approve promotes them)")
    for card, e in sorted(man.entries.items()):
        print(_status_line(card, e))
    live = read_status(ws.root)
    if live is not None:
        print(format_status(live))
    return 0


def cmd_bench(args) -> int:
    import json

    from .workload import parse_dtype

    if args.generate is not None:
        from .generation.bench import generate_bench

        g = generate_bench(args.workload, args.workspace, args.generate, batches=tuple(args.batch) if args.batch else None,
                           device=args.device, dtype=parse_dtype(args.dtype), repeats=args.gen_repeats,
                           with_compile=not args.no_compile, compile_mode=args.compile_mode,
                           switch_off=not args.keep_slower)
        from .generation_result import save

        save(args.workspace, g.to_json())  # the app's screens show it (``generation_result.py``)
        print(json.dumps(g.to_json(), indent=1) if args.json else g.table())
        for what in g.mismatches():
            print(f"forge: error: tokens of {what}", file=sys.stderr)
        return 1 if g.mismatches() else 0
    from .e2e import BenchOptions, bench
    from .e2e.accuracy import CHECKED_AGAINST

    options = BenchOptions(device=args.device, dtype=parse_dtype(args.dtype), repeats=args.repeats,
                           with_compile=not args.no_compile, switch_off=not args.keep_slower,
                           only_faster=not args.all_kernels, graphs=args.graphs)
    r = bench(args.workload, args.workspace, options)
    print(json.dumps(r.to_json(), indent=1) if args.json else r.table())

    bad = r.forge_mismatches()
    for k, v in bad.items():
        print(f"forge: error: {k} does not match {CHECKED_AGAINST.get(k, 'eager')}: {v}", file=sys.stderr)
    return 1 if bad else 0


def cmd_rewrite(args) -> int:
    """``forge NAME`` for each rewrite in the registry (``forge fold``, ``forge experts``, ``forge merge``):
    propose the workload's cards of that rewrite, print them and why the look-alikes are not
    served, and promote them unless ``--dry-run``."""
    from .rewrites import REWRITES
    from .workload import parse_dtype
    from .workspace import Workspace

    if args.min_speedup is not None and not args.min_speedup >= 0:
        raise ForgeError(f"--min-speedup must be 0 or more, not {args.min_speedup}")
    rewrite = REWRITES[args.rewrite]
    name, unit, no = rewrite.name, rewrite.unit, rewrite.not_served
    ws = Workspace.open(args.workspace)
    cards, why, entries = rewrite.run(args.workload, ws, device=args.device, dtype=parse_dtype(args.dtype),
                                      dry_run=args.dry_run, repeats=args.repeats, min_speedup=args.min_speedup)
    for c in cards:
        print(c.line())
    for path, reason in sorted(why.items()):
        print(f"{path or 'the model'}: {no}: {reason}")
    if args.dry_run:
        print(f"dry run: {sum(not c.refused for c in cards)} {name} cards would be promoted")
    else:
        print(f"promoted {len(entries)} {name} cards ({sum(len(e.signature.module_paths) for e in entries)} {unit}) "
              f"to {ws.root}" if entries else "nothing promoted")
    return 0


def cmd_export(args) -> int:
    from .promotion import kernels_dir
    from .runtime.export import export
    from .workspace import Workspace

    out = export(kernels_dir(Workspace.open(args.workspace)), args.out)
    print(f"exported to {out}: load it with forge_tui.runtime.apply(model, {str(out)!r})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .cards import KERNEL_KINDS

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
    sp.add_argument("--generate", type=int, metavar="N", help="profile a generation of N new tokens (the workload's "
                    "generate(model, inputs), else a Hugging Face model's greedy generate): its prefill and decode "
                    "steps, calls that differ only in a size that varies by step as one range card")
    sp.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    sp.set_defaults(func=cmd_profile)

    sp = sub.add_parser("cards", help="print a workspace's op table")
    sp.add_argument("workspace", type=Path)
    sp.add_argument("--kind", choices=[str(k) for k in KERNEL_KINDS])
    sp.add_argument("--limit", type=int, default=None)
    sp.set_defaults(func=cmd_cards)

    sp = sub.add_parser("eval", help="evaluate one candidate kernel against a card (exit 1 when rejected)")
    sp.add_argument("card", help="card id or unique prefix (in the workspace), or a card .json file")
    sp.add_argument("source", help="candidate source: .cu for the cuda backend, .cpp for the cpu backend")
    sp.add_argument("-w", "--workspace", type=Path, help="workspace (default: the current folder)")
    sp.add_argument("--backend", choices=["auto", "cuda", "cpu"], default=None)
    sp.add_argument("--profile", action="store_true", help="also run Nsight Compute on one launch")
    sp.add_argument("--no-static", action="store_true", help="skip the static checks (the runtime checks stay)")
    sp.add_argument("--allow-libraries", action="store_true", help="allow vendor library calls (labelled)")
    sp.add_argument("--seed", type=int, help="seed of the random input sets (default: fresh each run)")
    sp.add_argument("--json", action="store_true", help="print the whole result as JSON")
    sp.set_defaults(func=cmd_eval)

    sp = sub.add_parser("search", help="search for faster kernels for a workspace's cards (MCTS, in git)")
    sp.add_argument("workspace", type=Path)
    sp.add_argument("--resume", action="store_true", help="continue the search recorded in the workspace")
    sp.add_argument("--fresh", action="store_true", help="discard the recorded search and start again")
    sp.add_argument("--cards", nargs="+", metavar="ID", help="only these cards (ids or prefixes)")
    sp.add_argument("--proposer", default="auto", help="auto (the LLM agent where a provider or API key is set, "
                    "else the templates), agent, templates, or scripted:PLAN.json")
    sp.add_argument("--backend", choices=["auto", "cuda", "cpu"], default=None)
    sp.add_argument("--max-evals", type=int)
    sp.add_argument("--evals-per-card", type=int)
    sp.add_argument("--parallel", type=int)
    sp.add_argument("--max-wall-s", type=float)
    sp.add_argument("--cluster", metavar="tcp://HOST:8786", help="evaluate on the workers of this Dask scheduler "
                    "(one per GPU: dask worker ADDRESS --resources GPU=1; default: [pool] scheduler, else this machine)")
    sp.add_argument("-q", "--quiet", action="store_true")
    sp.set_defaults(func=cmd_search)

    sp = sub.add_parser("retime", help="time again the correct kernels a busy machine left untimed (noisy), "
                        "each as a child of its node")
    sp.add_argument("workspace", type=Path)
    sp.add_argument("cards", nargs="*", metavar="CARD", help="only these cards (ids or prefixes)")
    sp.add_argument("--backend", choices=["auto", "cuda", "cpu"], default=None)
    sp.add_argument("--cluster", metavar="tcp://HOST:8786", help="time them on the workers of this Dask scheduler "
                    "(default: [pool] scheduler, else this machine)")
    sp.set_defaults(func=cmd_retime)

    sp = sub.add_parser("replay", help="rebuild a search from git history and print it in the order it grew")
    sp.add_argument("workspace", type=Path)
    sp.add_argument("--card", help="only this card (id or prefix)")
    sp.add_argument("--json", action="store_true", help="the events as JSON")
    sp.set_defaults(func=cmd_replay)

    sp = sub.add_parser("approve", help="promote cards' best kernels into the workspace (kernels/, on main)")
    sp.add_argument("workspace", type=Path)
    sp.add_argument("cards", nargs="*", metavar="CARD", help="only these cards (ids or prefixes; default: every request)")
    sp.add_argument("--auto", action="store_true", help="approve only what clears --min-speedup and --max-spread")
    sp.add_argument("--min-speedup", type=float, default=1.05)
    sp.add_argument("--max-spread", type=float, default=0.10)
    sp.add_argument("--list", action="store_true", help="only list the pending promotion requests")
    sp.set_defaults(func=cmd_approve)

    sp = sub.add_parser("reject", help="refuse cards' pending promotion requests (recorded in the manifest)")
    sp.add_argument("workspace", type=Path)
    sp.add_argument("cards", nargs="+", metavar="CARD")
    sp.add_argument("--reason", default="")
    sp.set_defaults(func=cmd_reject)

    sp = sub.add_parser("status", help="the promoted kernels, and the runtime's live fallback status")
    sp.add_argument("workspace", type=Path)
    sp.set_defaults(func=cmd_status)

    sp = sub.add_parser("bench", help="time the whole forward: eager, eager + forge, torch.compile, torch.compile + forge")
    sp.add_argument("workload", help="a workload .py file, or example:NAME")
    sp.add_argument("-w", "--workspace", type=Path, required=True)
    sp.add_argument("--device", choices=["cuda", "cpu"])
    sp.add_argument("--dtype")
    sp.add_argument("--repeats", type=int, default=20)
    sp.add_argument("--no-compile", action="store_true", help="skip the two torch.compile variants")
    sp.add_argument("--keep-slower", action="store_true",
                    help="do not switch off kernels that slow the forward (or, with --generate, a compiled generation)")
    sp.add_argument("--all-kernels", action="store_true",
                    help="use every promoted kernel, also those measured slower or whose dispatch eats their gain")
    sp.add_argument("--graphs", action="store_true", help="cuda: also eager and eager + forge each captured in a "
                    "CUDA graph, which takes the host's launch cost out of both; kernels that slow the graphed "
                    "forward are switched off for mode='cuda_graph' only")
    sp.add_argument("--generate", type=int, metavar="N", help="time greedy generation of N new tokens instead of the "
                    "forward: prefill and decode tokens/s four ways (forge's decode steps from CUDA graphs)")
    sp.add_argument("--batch", type=int, nargs="+", metavar="B", help="with --generate: batch sizes (default: the "
                    "workload's BATCHES, else 1 8)")
    sp.add_argument("--gen-repeats", type=int, default=5, help="with --generate: interleaved rounds (default 5)")
    sp.add_argument("--compile-mode", default="default", help="with --generate: torch.compile's mode for the compile "
                    "way (default: 'default'; 'reduce-overhead' adds CUDA graphs)")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_bench)

    from .rewrites import REWRITES

    for name, rewrite in REWRITES.items():
        sp = sub.add_parser(name, help=f"{rewrite.help} (checked, timed, promoted as {name} cards: running it "
                            "approves them)")
        sp.add_argument("workload", help="a workload .py file, or example:NAME")
        sp.add_argument("-w", "--workspace", type=Path, required=True)
        sp.add_argument("--device", choices=["cuda", "cpu"])
        sp.add_argument("--dtype")
        sp.add_argument("--repeats", type=int, default=20)
        sp.add_argument("--min-speedup", type=float, help=f"promote cards at least this much faster than {rewrite.own}, "
                        "alone (default: any faster; 0: every card that matches)")
        sp.add_argument("--dry-run", action="store_true", help="check and time them, promote nothing")
        sp.set_defaults(func=cmd_rewrite, rewrite=name)

    sp = sub.add_parser("export", help="write the promoted kernels as a self-contained, checksummed folder")
    sp.add_argument("workspace", type=Path)
    sp.add_argument("out", type=Path)
    sp.set_defaults(func=cmd_export)

    sp = sub.add_parser("new", help="a card from a description: the LLM agent writes a PyTorch reference and "
                        "example inputs; once you approve them, they become a new workspace's card")
    sp.add_argument("description", help='the operation, e.g. "fused LayerNorm + GELU for (8192, 4096) bf16"')
    sp.add_argument("-w", "--workspace", type=Path, help="workspace folder (default: workspaces/<description>)")
    sp.add_argument("--yes", action="store_true", help="accept the reference without asking (scripts)")
    sp.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto",
                    help="where the card is profiled (default: cuda when available, else cpu)")
    sp.add_argument("--config", type=Path, default=argparse.SUPPRESS, help="forge.toml to use")
    sp.set_defaults(func=cmd_new)

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
