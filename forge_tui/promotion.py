"""Promotion (a workspace operation): a card's best kernel becomes a request with its evidence; approving it builds it
for this machine and commits it, with a manifest entry, to the workspace's ``main``.

A workspace operation: it reads the search from git (no search needs to be running) and writes
``kernels/`` on ``main``. ``forge approve`` / ``forge reject`` and the app's approvals screen call it.
"""

from __future__ import annotations

import getpass
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cards import Card, id_matches
from .errors import ForgeError
from .evaluator.result import EvalResult, load_result
from .kernel_abi import SOURCE_NAMES, current_arch
from .runtime.manifest import KERNELS_DIR, Build, Entry, Evidence, Manifest, Rejection, Signature, now, sha256_file
from .workspace import Workspace


@dataclass
class Request:
    """A card's best node, waiting for a decision."""

    card: Card
    node: str
    parent: str | None
    commit: str
    source: str
    backend: str
    result: EvalResult
    evidence: Evidence

    @property
    def speedup(self) -> float:
        return self.evidence.speedup_vs_eager or 0.0

    def line(self) -> str:
        ev = self.evidence
        q = (f" [{ev.speedup_vs_eager_q1:.2f}, {ev.speedup_vs_eager_q3:.2f}]"
             if ev.speedup_vs_eager_q1 is not None and ev.speedup_vs_eager_q3 is not None else "")
        comp = f", {ev.speedup_vs_compile:.2f}x torch.compile" if ev.speedup_vs_compile else ""
        return (f"{self.card.id}: {self.node} {self.speedup:.2f}x eager{q}{comp}, "
                f"correct on {len(ev.input_sets)} input sets ({self.backend})")


@dataclass(frozen=True)
class AutoRule:
    """``--auto``: approve only what clears these thresholds."""

    min_speedup: float = 1.05
    max_spread: float = 0.10

    def refuses(self, req: Request) -> str | None:
        if req.speedup < self.min_speedup:
            return f"{req.speedup:.3f}x is under the {self.min_speedup:.2f}x asked for"
        spread = req.evidence.spread
        if spread is not None and spread > self.max_spread:
            return f"its speedup spreads {100 * spread:.0f}%, over the {100 * self.max_spread:.0f}% allowed"
        return None


def kernels_dir(ws: Workspace) -> Path:
    return ws.root / KERNELS_DIR


def commit_manifest(ws: Workspace, man: Manifest, event: str, subject: str, lines: list[str], cards: list[str],
                    who: str | None = None) -> None:
    """Save the manifest and commit the workspace: one commit a decision, its subject, a line a
    card, and the trailers the history reads (Forge-Event, Forge-Cards, Forge-By)."""
    man.save(kernels_dir(ws))
    trailers = {"Forge-Event": event, "Forge-Cards": ",".join(cards)}
    if who is not None:
        trailers["Forge-By"] = who
    with ws.git() as repo:
        repo.commit_worktree(subject, "\n".join(lines), trailers)


@dataclass
class Rewrite:
    """A card that rewrites the model's own code rather than adding a kernel (a fold, grouped
    experts), ready to promote: its configuration file and what its approval rests on."""

    signature: Signature
    file: str
    """Its configuration's name in ``kernels/<card>/``."""
    config: dict[str, Any]
    speedup: Any
    """``timing.Stats`` of the paired ratio, the model's own calls over the rewrite."""
    eager_us: float
    time_us: float
    input_sets: list[str]
    line: str
    vs_compile: Any = None
    """``timing.Stats`` of the paired ratio of torch.compile's code for the card over the rewrite
    (its call's latency each), where it was timed."""
    compile_us: float | None = None


def promote_rewrites(ws: Workspace, rewrites: list[Rewrite], subject: str, *, by: str | None = None) -> list[Entry]:
    """``kernels/<card>/<file>`` and a manifest entry each (its evidence, who approved it), one
    commit on ``main`` with ``subject``; on a failure part way, nothing is left written. Returns
    the entries."""
    import json

    if not rewrites:
        return []
    man = manifest(ws)
    who = by or _user()
    root = kernels_dir(ws)
    entries, written = [], []
    try:
        for r in rewrites:
            sig, sp = r.signature, r.speedup
            folder = root / sig.card
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir(parents=True)
            written.append(folder)
            src = folder / r.file
            src.write_text(json.dumps(r.config, indent=1, sort_keys=True) + "\n")
            ev = Evidence(node=sig.kind, commit="", speedup_vs_eager=sp.median, speedup_vs_eager_q1=sp.q1,
                          speedup_vs_eager_q3=sp.q3, spread=sp.spread, time_us=r.time_us, eager_us=r.eager_us,
                          input_sets=r.input_sets, compile_us=r.compile_us,
                          speedup_vs_compile=r.vs_compile.median if r.vs_compile is not None else None,
                          compile_basis="latency" if r.vs_compile is not None else None)
            e = Entry(card=sig.card, signature=sig, source=str(src.relative_to(root)), source_sha256=sha256_file(src),
                      builds=[], evidence=ev, approved_by=who, approved_at=now())
            man.entries[sig.card] = e
            entries.append(e)
        commit_manifest(ws, man, "approve", subject, [r.line for r in rewrites], [r.signature.card for r in rewrites],
                        who)
    except BaseException:
        for f in written:
            shutil.rmtree(f, ignore_errors=True)
        raise
    return entries


def kernels(n: int) -> str:
    """'1 kernel', '2 kernels'."""
    return f"{n} kernel{'s' if n > 1 else ''}"


def manifest(ws: Workspace) -> Manifest:
    return Manifest.load(kernels_dir(ws))


def requests(ws: Workspace, cards: list[str] | None = None, *, faster_only: bool = True) -> list[Request]:
    """One request per card whose best node beats eager (``faster_than_eager``: the rule of the
    card's best), ranked against eager pooled over the card, and is neither promoted nor rejected
    (``faster_only=False``: its best passed node, even one slower than eager, for a caller whose
    own rule decides: ``forge_tui.generate``)."""
    from .search.store import NodeRecord, SearchStore
    from .search.tree import ROOT, faster_than_eager, pooled_speedups

    man = manifest(ws)
    out: list[Request] = []
    with ws.git() as repo:
        store = SearchStore(repo)
        loaded = store.load()
        by_card: dict[str, list[NodeRecord]] = {}
        for rec in loaded.nodes:
            by_card.setdefault(rec.card, []).append(rec)
        score: dict[tuple[str, str], float] = {}
        wins: set[tuple[str, str]] = set()
        for card_id, recs in by_card.items():  # ranked by their own times (see pooled_speedups)
            rows = [(r.node, r.status, r.speedup, r.time_us, r.eager_us) for r in recs]
            pooled = pooled_speedups(rows)
            score.update(((card_id, nid), sp) for nid, sp in pooled.items())
            wins.update((card_id, nid) for nid in faster_than_eager(rows, pooled))
        best: dict[str, tuple[float, int, NodeRecord]] = {}
        for rec in loaded.nodes:
            if rec.node == ROOT or rec.status != "passed" or not rec.speedup:
                continue
            if faster_only and (rec.card, rec.node) not in wins:  # the card's best's own rule
                continue
            ranked = score.get((rec.card, rec.node), rec.speedup)
            if cards and not any(id_matches(rec.card, c) for c in cards):
                continue
            if rec.node in man.rejected_nodes(rec.card):
                continue
            entry = man.entries.get(rec.card)
            if entry is not None and entry.evidence.node == rec.node:
                continue
            key = (ranked, -rec.seq)
            if rec.card not in best or key > best[rec.card][:2]:
                best[rec.card] = (*key, rec)
        for card_id, (_, _, rec) in sorted(best.items()):
            try:
                card = ws.card(card_id)
            except ForgeError:
                continue  # a card no longer in the workspace
            result = load_result(store.read(rec.commit, "result.json"))
            if result is None or not result.passed:
                continue
            src_name = SOURCE_NAMES.get(result.backend, SOURCE_NAMES["cuda"])
            raw = store.read(rec.commit, src_name)
            if raw is None:
                continue
            diff = ""
            parent = next((n for n in loaded.nodes if n.card == card_id and n.node == rec.parent), None)
            if parent is not None:
                try:
                    diff = repo.git("diff", parent.commit, rec.commit, "--", f"candidate/{src_name}")
                except ForgeError:
                    diff = ""
            out.append(Request(card, rec.node, rec.parent, rec.commit, raw.decode(errors="replace"),
                               result.backend, result, evidence_of(rec.node, rec.commit, rec.parent, result, diff)))
    return out


def unrequested(ws: Workspace, cards: list[str] | None = None, *,
                pending: list[Request] | None = None) -> list[tuple[str, str]]:
    """(card, why) for each searched card that has no promotion request and no promoted kernel:
    what its kernels came to, so that an empty approvals queue is never unexplained. A correct
    kernel timed while the machine was busy ("noisy") claims no speedup and is not offered; nor is
    one that ran no faster than eager. ``pending``: the requests, where the caller has read them."""
    from .search.events import shorten
    from .search.store import SearchStore
    from .search.tree import ROOT, faster_than_eager, pooled_speedups

    man = manifest(ws)
    offered = {r.card.id for r in (requests(ws, cards) if pending is None else pending)}
    by_card: dict[str, list[Any]] = {}
    with ws.git() as repo:
        for rec in SearchStore(repo).load().nodes:
            if rec.node == ROOT or (cards and not any(id_matches(rec.card, c) for c in cards)):
                continue
            by_card.setdefault(rec.card, []).append(rec)
    out = []
    for card_id, nodes in sorted(by_card.items()):
        if card_id in offered or card_id in man.entries:
            continue
        refused = man.rejected_nodes(card_id)
        left = [n for n in nodes if n.node not in refused]
        passed = [n for n in left if n.status == "passed" and n.speedup]
        noisy = [n for n in left if n.status == "noisy"]
        rows = [(n.node, n.status, n.speedup, n.time_us, n.eager_us) for n in nodes]
        ranked = pooled_speedups(rows)
        wins = faster_than_eager(rows, ranked)

        def sp(n: Any, ranked: dict[str, float] = ranked) -> float:
            return ranked.get(n.node, n.speedup)

        if not left:
            out.append((card_id, f"every kernel offered was rejected ({len(nodes)})"))
        elif any(n.node in wins for n in passed):
            continue  # a request once its node's result is readable again (requests() skipped it)
        elif noisy:
            # the record keeps 300 characters of it: cut at a word, never inside a parenthesis
            # (the whole reason is in the node's result: the app's tests pane, r)
            why = shorten(noisy[-1].reason.partition(": ")[2] or noisy[-1].reason or "no reason recorded", 200)
            others = f" (and {len(noisy) - 1} more)" if len(noisy) > 1 else ""
            best = max(passed, key=sp) if passed else None
            slower = f"; its fastest timed kernel, {best.node}, ran {sp(best):.2f}x eager" if best else ""
            out.append((card_id, f"{noisy[-1].node}{others} is correct, but the machine was too busy to trust its "
                                 f"timing ({why}){slower}: forge retime times it again, and a kernel is offered "
                                 "once it is timed faster than eager"))
        elif passed:
            best = max(passed, key=sp)
            beside = (f" against eager's median over the card, {best.speedup:.2f}x against eager timed beside it"
                      if sp(best) > 1.0 else "")
            out.append((card_id, f"its fastest correct kernel, {best.node}, ran {sp(best):.2f}x eager{beside}: "
                                 "nothing faster than eager to offer"))
        else:
            counts: dict[str, int] = {}
            for n in left:
                counts[n.status] = counts.get(n.status, 0) + 1
            tally = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            out.append((card_id, f"none of its {len(left)} kernels passed ({tally})"))
    return out


def evidence_of(node: str, commit: str, parent: str | None, r: EvalResult, diff: str) -> Evidence:
    t = r.timing
    sp = t.speedup_vs_eager if t else None
    return Evidence(
        node=node, commit=commit, parent=parent, speedup_vs_eager=r.speedup_vs_eager,
        speedup_vs_eager_q1=sp.q1 if sp else None, speedup_vs_eager_q3=sp.q3 if sp else None,
        speedup_vs_compile=r.speedup_vs_compile, compile_basis=t.compile_basis if t else None,
        spread=sp.spread if sp else None, time_us=r.time_us,
        eager_us=t.eager.median if t else None, compile_us=t.compile.median if t and t.compile else None,
        compile_device_us=t.compile_device.median if t and t.compile_device else None,
        input_sets=[s.name for s in r.correctness.sets] if r.correctness else [],
        fraction_of_floor=t.fraction_of_floor if t else None,
        profile=r.profile.model_dump(exclude={"raw_csv", "kernels"}) if r.profile and r.profile.available else None,
        diff=diff[:20000])


def build_for(ws: Workspace, backend: str, source: str, dest_dir: Path, arch: str | None = None) -> Build:
    """Compile the source for this machine and copy the library next to it."""
    from .evaluator.build import Builder

    arch = arch or current_arch(backend)
    b = Builder(backend, ws.cache, arch=arch if backend == "cuda" else None)
    res = b.build(source)
    b.close()
    if not res.ok or res.library is None:
        raise ForgeError(f"the kernel does not build here: {res.reason}")
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / f"{arch}.so"
    shutil.copyfile(res.library, dest)
    return Build(backend="cuda" if backend == "cuda" else "cpu", arch=arch,
                 path=str(dest.relative_to(dest_dir.parent)), sha256=sha256_file(dest))


def approve(ws: Workspace, cards: list[str] | None = None, *, by: str | None = None,
            auto: AutoRule | None = None, faster_only: bool = True) -> tuple[list[Entry], list[tuple[Request, str]]]:
    """Approve the pending requests (all, or those of ``cards``); with ``auto``, only those that
    clear its thresholds. Returns the new entries and the requests left, with why. ``faster_only``:
    as ``requests``."""
    pending = requests(ws, cards, faster_only=faster_only)
    if cards and not pending:
        raise ForgeError("no promotion request for " + ", ".join(cards) +
                         " (a card needs a passed node faster than eager, not yet promoted or rejected)")
    who = by or (f"auto (min {auto.min_speedup}x, max spread {auto.max_spread})" if auto else _user())
    man = manifest(ws)
    done: list[Entry] = []
    left: list[tuple[Request, str]] = []
    for req in pending:
        why = auto.refuses(req) if auto else None
        if why:
            left.append((req, why))
            continue
        try:
            done.append(_install(ws, man, req.card, req.source, req.backend, req.evidence, who))
        except ForgeError as err:
            left.append((req, str(err)))
    if done:
        commit_manifest(ws, man, "approve", f"approve {kernels(len(done))}",
                        [f"{e.card}: {e.evidence.node} {e.evidence.speedup_vs_eager:.3f}x eager" for e in done],
                        [e.card for e in done], who)
    return done, left


def _install(ws: Workspace, man: Manifest, card: Card, source: str, backend: str, evidence: Evidence,
             who: str) -> Entry:
    """Write one kernel (source, build for this machine, constants) under kernels/<card>/ and its
    manifest entry (not yet committed)."""
    folder = kernels_dir(ws) / card.id
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    ext = ".cu" if backend == "cuda" else ".cpp"
    src = folder / f"kernel{ext}"
    src.write_text(source)
    try:
        _save_consts(ws, card, folder)
        build = build_for(ws, backend, source, folder)
    except ForgeError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    entry = Entry(card=card.id, signature=Signature.of(card), source=str(src.relative_to(kernels_dir(ws))),
                  source_sha256=sha256_file(src), builds=[build], evidence=evidence, approved_by=who,
                  approved_at=now())
    man.entries[card.id] = entry
    return entry


def promote_kernel(ws: Workspace, card_id: str, source: str, result: EvalResult, *, by: str | None = None) -> Entry:
    """Promote a kernel the caller evaluated itself (``result`` must be a passed evaluation of this
    source on this card): what ``forge_tui.generate`` and scripted flows use instead of a search."""
    import hashlib

    card = ws.card(card_id)
    if result.status == "noisy":
        why = "; ".join(result.timing.noisy_reasons[:2]) if result.timing else result.reason
        raise ForgeError(f"the evaluation of this kernel on {card.id} is noisy: it is correct, but its timing was not "
                         f"trusted ({why or 'no reason recorded'}), so it claims no speedup; evaluate it again "
                         "and promote a passed result")
    if not result.passed or result.card != card.id:
        raise ForgeError(f"only a kernel that passed the evaluator on {card.id} can be promoted ({result.status})")
    if result.source_sha256 and result.source_sha256 != hashlib.sha256(source.encode()).hexdigest():
        raise ForgeError("the evaluation is of another source")
    man = manifest(ws)
    who = by or _user()
    entry = _install(ws, man, card, source, result.backend, evidence_of("direct", "", None, result, ""), who)
    commit_manifest(ws, man, "approve", f"approve {card.id}", [f"promoted directly by {who}"], [card.id], who)
    return entry


def reject(ws: Workspace, cards: list[str], *, by: str | None = None, reason: str = "") -> list[Rejection]:
    pending = requests(ws, cards)
    if not pending:
        raise ForgeError("no promotion request for " + ", ".join(cards))
    man = manifest(ws)
    who = by or _user()
    out = [Rejection(card=r.card.id, node=r.node, by=who, at=now(), reason=reason) for r in pending]
    man.rejected.extend(out)
    commit_manifest(ws, man, "reject", f"reject {kernels(len(out))}",
                    [f"{r.card}: {r.node}" + (f" ({reason})" if reason else "") for r in out], [r.card for r in out], who)
    return out


def _save_consts(ws: Workspace, card: Card, folder: Path) -> None:
    """A card's constant inputs (tensors its program uses that are neither arguments nor
    parameters), as captured, beside its kernel: the runtime passes them on every call."""
    idx = [i for i, s in enumerate(card.inputs) if s.role == "const"]
    if not idx:
        return
    import torch

    from .inputs import sample_inputs

    if not card.samples:
        raise ForgeError(f"{card.id} has constant inputs but no captured sample to take them from")
    ins = sample_inputs(card, ws.store, 0, "cpu")
    torch.save([ins[i].contiguous() if ins[i].is_contiguous() else ins[i] for i in idx], folder / "consts.pt")


def _user() -> str:
    try:
        return f"user {getpass.getuser()}"
    except Exception:  # noqa: BLE001 - no login name (containers): say so
        return "user (unknown name)"
