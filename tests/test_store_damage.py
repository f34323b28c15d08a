"""The git-backed search store survives damage: a node commit that lost its trailers or had them cut
short, a branch whose name disagrees with its trailers, a missing parent, a truncated result.json,
bad JSON on the log, refs at missing objects. ``load()`` names each damaged item and skips it;
``forge replay`` and ``forge search --resume`` print one line per item and carry on; no branch is
ever overwritten and new node ids never collide with an existing one (damaged or not).

Every repository here is real: a small search runs, then the damage is done with git plumbing
(``commit-tree``, ``update-ref``, ``read-tree``/``write-tree``), the way a crash, a bad tool or a
person editing refs would leave it.
"""

import os
import subprocess
import threading

import pytest
from search_helpers import CountingProposer, FakePool, make_workspace, synthetic_card

from forge_tui.cli import main
from forge_tui.config import parse_config
from forge_tui.errors import WorkspaceError
from forge_tui.gitrepo import RefConflict
from forge_tui.search.events import EventBus, Recorder
from forge_tui.search.proposer import Proposal
from forge_tui.search.replay import load_events
from forge_tui.search.runner import Search
from forge_tui.search.store import LOG_REF, NodeRecord, SearchStore

ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@t"}


class ChainProposer:
    """Children only for a node without any, so the tree is a chain root -> n0001 -> n0002 -> ...
    (deterministic ids), and a resumed search goes on from the chain's end."""

    name = "chain"

    def __init__(self):
        self.n = 0
        self.served: set[str] = set()
        self.contexts = []
        self._lock = threading.Lock()

    def supports(self, card, backend):
        return None

    def propose(self, ctx):
        with self._lock:
            self.contexts.append(ctx)
            if ctx.children or (ctx.card.id, ctx.parent.id) in self.served:
                return None
            self.served.add((ctx.card.id, ctx.parent.id))
            self.n += 1
            n = self.n
        return Proposal(source=f"// kernel {n} for {ctx.card.id} from {ctx.parent.id}\n", move=f"k{n}")


def cfg(**search):
    return parse_config({"search": {"min_gain": 0.0, "parallel": 1, **search}})


def run_search(ws, max_evals, resume=False, proposer=None, **search):
    bus, rec = EventBus(), Recorder()
    bus.subscribe(rec)
    pool = FakePool(speedup=lambda card, src: 1.0 + int(src.split()[2]) / 10)  # later kernels are faster
    try:
        summary = Search(ws, cfg(max_evals=max_evals, **search), proposer or ChainProposer(), pool,
                         bus=bus).run(resume=resume)
    finally:
        pool.close()
    return summary, rec


def chain_workspace(tmp_path, evals=4, cards=("a",), per_card=True):
    """A search of ``evals`` evaluations per card (``per_card``: each card's budget, so each finishes)."""
    ws = make_workspace(tmp_path / "ws", [synthetic_card(c, share=0.4, time_us=100.0, floor_us=5.0) for c in cards])
    run_search(ws, max_evals=evals * len(cards), **({"evals_per_card": evals} if per_card else {}))
    return ws


def git(ws, *args, stdin=None) -> str:
    out = subprocess.run(["git", *args], cwd=ws.root, capture_output=True, text=True, env=ENV, input=stdin)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def head(ws, branch) -> str:
    return git(ws, "rev-parse", f"refs/heads/{branch}")


def message(ws, branch) -> str:
    return git(ws, "log", "-1", "--format=%B", f"refs/heads/{branch}")


def rewrite(ws, branch, msg=None, files=None) -> str:
    """Replace the tip of ``branch`` by a commit with the same parents and ``msg`` (default: the
    same message), ``files`` replaced under ``candidate/``; the branch is moved with update-ref."""
    ref = f"refs/heads/{branch}"
    tree = git(ws, "rev-parse", f"{ref}^{{tree}}")
    if files:
        env = {**ENV, "GIT_INDEX_FILE": str(ws.root / ".git" / "damage-index")}
        subprocess.run(["git", "read-tree", tree], cwd=ws.root, env=env, check=True)
        for name, data in files.items():
            blob = git(ws, "hash-object", "-w", "--stdin", stdin=data)
            subprocess.run(["git", "update-index", "--add", "--cacheinfo", f"100644,{blob},candidate/{name}"],
                           cwd=ws.root, env=env, check=True)
        tree = subprocess.run(["git", "write-tree"], cwd=ws.root, env=env, check=True, capture_output=True,
                              text=True).stdout.strip()
    parents = git(ws, "log", "-1", "--format=%P", ref).split()
    new = git(ws, "commit-tree", tree, *[a for p in parents for a in ("-p", p)], "-F", "-",
              stdin=message(ws, branch) if msg is None else msg)
    git(ws, "update-ref", ref, new)
    return new


def cut_at(msg: str, key: str) -> str:
    """The message with its trailer block cut just before the ``key`` line."""
    lines = msg.splitlines()
    return "\n".join(lines[:next(i for i, line in enumerate(lines) if line.startswith(key + ":"))]) + "\n"


def replace_line(msg: str, key: str, value: str | None) -> str:
    """The message with trailer ``key`` set to ``value`` (None: removed)."""
    out = [line for line in msg.splitlines() if not line.startswith(key + ":")] if value is None else \
        [f"{key}: {value}" if line.startswith(key + ":") else line for line in msg.splitlines()]
    return "\n".join(out) + "\n"


def load(ws):
    with ws.git() as repo:
        return SearchStore(repo).load()


def replay_cli(ws, capsys) -> tuple[str, str]:
    capsys.readouterr()
    assert main(["replay", str(ws.root)]) == 0
    out = capsys.readouterr()
    return out.out, out.err


def node_ids(ws, card="a") -> set[str]:
    return {r.node for r in load(ws).nodes if r.card == card}


def all_branches(ws) -> dict[str, str]:
    out = git(ws, "for-each-ref", "--format=%(refname:short) %(objectname)", "refs/heads/search/")
    return dict(line.split() for line in out.splitlines())


# ---- trailers lost or cut short ---------------------------------------------------------------------
DAMAGES = {
    "no trailers": (lambda m: m.split("\n\n")[0] + "\n", "no Forge trailers"),
    "no Forge-Seq": (lambda m: replace_line(m, "Forge-Seq", None), "no Forge-Seq trailer"),
    "Forge-Seq not a number": (lambda m: replace_line(m, "Forge-Seq", "x"), "Forge-Seq 'x' is not a number"),
    "cut before Forge-Card": (lambda m: cut_at(m, "Forge-Card"), "no Forge-Card trailer"),
    "cut before Forge-Speedup": (lambda m: cut_at(m, "Forge-Speedup"), "no Forge-Speedup trailer"),
    "Forge-Speedup not a number": (lambda m: replace_line(m, "Forge-Speedup", "fast"),
                                   "Forge-Speedup 'fast' is not a number"),
    "node disagrees with the branch": (lambda m: replace_line(m, "Forge-Node", "n0002"),
                                       "trailers say card a node n0002 but the branch is search/a/n0004"),
}


@pytest.mark.parametrize("kind", list(DAMAGES))
def test_damaged_leaf_is_reported_skipped_and_never_overwritten(tmp_path, capsys, kind):
    transform, reason = DAMAGES[kind]
    ws = chain_workspace(tmp_path, evals=4)
    assert node_ids(ws) == {"root", "n0001", "n0002", "n0003", "n0004"}
    bad = rewrite(ws, "search/a/n0004", transform(message(ws, "search/a/n0004")))

    loaded = load(ws)  # no exception, the damaged node left out, named with its branch and reason
    assert {r.node for r in loaded.nodes} == {"root", "n0001", "n0002", "n0003"}
    [d] = loaded.damaged
    assert d.ref == "search/a/n0004" and reason in d.what and d.commit == bad and d.skipped
    assert d.line == f"skipped search/a/n0004: {d.what}"

    out, err = replay_cli(ws, capsys)  # exits 0, one line on stderr, the rest replays
    assert f"skipped search/a/n0004: {d.what}" in err.splitlines()
    assert "n0003" in out and "n0004" not in out

    # the tree after load has 4 nodes, so the next id used to be n0004: the damaged branch
    summary, rec = run_search(ws, max_evals=6, resume=True)
    assert summary.evaluations == 6  # 3 sound nodes + 3 new ones
    assert head(ws, "search/a/n0004") == bad  # not overwritten
    assert node_ids(ws) == {"root", "n0001", "n0002", "n0003", "n0005", "n0006", "n0007"}
    assert [e.data["ref"] for e in rec.events if e.kind == "store_damaged"] == ["search/a/n0004"]
    assert [x.ref for x in summary.damaged] == ["search/a/n0004"]
    started = [e for e in rec.events if e.kind == "search_started"][-1]
    assert started.data["damaged"] == [d.line]  # recorded in the log for later readers


def test_middle_node_without_trailers_takes_its_subtree_out(tmp_path, capsys):
    ws = chain_workspace(tmp_path, evals=4)
    bad = rewrite(ws, "search/a/n0002", "a n0002: passed\n")
    loaded = load(ws)
    assert {r.node for r in loaded.nodes} == {"root", "n0001"}
    whats = {d.ref: d.what for d in loaded.damaged}
    assert whats["search/a/n0002"].startswith("no Forge trailers")
    assert whats["search/a/n0003"] == "parent n0002 is missing or damaged"
    assert whats["search/a/n0004"] == "parent n0003 is missing or damaged"
    _, err = replay_cli(ws, capsys)
    assert "skipped search/a/n0003: parent n0002 is missing or damaged" in err.splitlines()
    before = all_branches(ws)
    run_search(ws, max_evals=4, resume=True)
    after = all_branches(ws)
    assert head(ws, "search/a/n0002") == bad
    assert all(after[b] == sha for b, sha in before.items())  # no branch moved
    assert set(after) - set(before) == {"search/a/n0005", "search/a/n0006", "search/a/n0007"}


def test_branch_of_another_card_is_reported(tmp_path, capsys):
    ws = chain_workspace(tmp_path, evals=2, cards=("a", "b"))
    git(ws, "update-ref", "refs/heads/search/b/n0007", head(ws, "search/a/n0001"))
    [d] = load(ws).damaged
    assert d.line == "skipped search/b/n0007: trailers say card a node n0001 but the branch is search/b/n0007"
    _, err = replay_cli(ws, capsys)
    assert d.line in err.splitlines()


# ---- parents --------------------------------------------------------------------------------------
def test_orphan_is_skipped_and_its_missing_parent_id_never_reused(tmp_path, capsys):
    ws = chain_workspace(tmp_path, evals=3)  # root -> n0001 -> n0002 -> n0003
    git(ws, "update-ref", "-d", "refs/heads/search/a/n0002")
    loaded = load(ws)
    assert {r.node for r in loaded.nodes} == {"root", "n0001"}
    [d] = loaded.damaged
    assert d.line == "skipped search/a/n0003: parent n0002 is missing or damaged"
    _, err = replay_cli(ws, capsys)
    assert d.line in err.splitlines()
    orphan = head(ws, "search/a/n0003")
    run_search(ws, max_evals=3, resume=True)
    # n0002 is free as a branch name but n0003 names it as its parent: a new n0002 would adopt it
    assert node_ids(ws) == {"root", "n0001", "n0004", "n0005"}
    assert "search/a/n0002" not in all_branches(ws)
    assert head(ws, "search/a/n0003") == orphan
    assert "parent n0002 is missing or damaged" in [x.what for x in load(ws).damaged]


def test_child_recorded_before_its_parent_is_skipped(tmp_path):
    ws = chain_workspace(tmp_path, evals=3)
    rewrite(ws, "search/a/n0003", replace_line(message(ws, "search/a/n0003"), "Forge-Seq", "1"))
    [d] = load(ws).damaged
    assert d.ref == "search/a/n0003" and d.what.startswith("Forge-Seq 1 is not after its parent n0002's")


def test_damaged_root_skips_its_card_and_the_others_go_on(tmp_path, capsys):
    ws = chain_workspace(tmp_path, evals=2, cards=("a", "b"), per_card=False)
    a_branches = {b: sha for b, sha in all_branches(ws).items() if b.startswith("search/a/")}
    assert len(a_branches) > 1
    bad = rewrite(ws, "search/a/root", cut_at(message(ws, "search/a/root"), "Forge-Seq"))
    a_branches["search/a/root"] = bad
    whats = {d.ref: d.what for d in load(ws).damaged}
    assert set(whats) == set(a_branches)  # the root and every node below it
    assert whats["search/a/root"] == "no Forge-Seq trailer"
    assert whats["search/a/n0001"] == "parent root is missing or damaged"
    b_before = node_ids(ws, "b")
    summary, _ = run_search(ws, max_evals=len(b_before) - 1 + 2, resume=True)
    assert summary.skipped["a"] == "its root branch search/a/root is damaged or missing"
    after = all_branches(ws)
    assert {b: sha for b, sha in after.items() if b.startswith("search/a/")} == a_branches  # no new root over it
    assert len(node_ids(ws, "b")) == len(b_before) + 2  # the other card went on


# ---- result.json ----------------------------------------------------------------------------------
def test_truncated_result_json_reads_as_no_result(tmp_path):
    ws = chain_workspace(tmp_path, evals=3)
    full = git(ws, "show", "refs/heads/search/a/n0003:candidate/result.json")
    rewrite(ws, "search/a/n0003", files={"result.json": full[: len(full) // 2]})
    assert load(ws).damaged == []  # trailers are sound: the node stays in the tree
    proposer = ChainProposer()
    summary, rec = run_search(ws, max_evals=5, resume=True, proposer=proposer)
    assert summary.evaluations == 5
    ctx = next(c for c in proposer.contexts if c.parent.id == "n0003")  # the leaf gets expanded
    assert ctx.parent.result is None and ctx.parent.status == "passed" and ctx.parent.source.startswith("// kernel 3")
    [d] = summary.damaged
    assert d.ref == "search/a/n0003" and not d.skipped
    assert d.what.startswith("candidate/result.json is not a readable result") and d.what.endswith("read as no result")
    assert [e.data["what"] for e in rec.events if e.kind == "store_damaged"] == [d.what]


# ---- the log --------------------------------------------------------------------------------------
def rewrite_log(ws, index: int, transform) -> str:
    """Rewrite the ``index``-th event of forge/log (0: the oldest) and re-chain the newer ones onto it."""
    chain = git(ws, "rev-list", "--reverse", LOG_REF).split()
    parent, damaged = None, None
    for i, c in enumerate(chain):
        msg = git(ws, "log", "-1", "--format=%B", c)
        if i == index:
            msg = transform(msg)
        tree = git(ws, "rev-parse", f"{c}^{{tree}}")
        parent = git(ws, "commit-tree", tree, *(["-p", parent] if parent else []), "-F", "-", stdin=msg)
        if i == index:
            damaged = parent
    git(ws, "update-ref", LOG_REF, parent)
    return damaged


def test_truncated_forge_data_on_the_log_is_reported(tmp_path, capsys):
    ws = chain_workspace(tmp_path, evals=2)
    n_events = len(load(ws).log)
    truncate = lambda m: "\n".join(line[:30] if line.startswith("Forge-Data:") else line  # noqa: E731
                                   for line in m.splitlines()) + "\n"
    bad = rewrite_log(ws, 0, truncate)  # search_started, the oldest
    loaded = load(ws)
    [d] = loaded.damaged
    assert d.ref == "forge/log" and d.commit == bad and d.what.startswith("Forge-Data is not valid JSON (")
    assert d.line.startswith(f"skipped forge/log commit {bad[:12]}: Forge-Data is not valid JSON")
    assert len(loaded.log) == n_events - 1
    out, err = replay_cli(ws, capsys)
    assert d.line in err.splitlines()
    assert "search stopped" in out and "search started" not in out
    summary, _ = run_search(ws, max_evals=3, resume=True)
    assert summary.evaluations == 3
    # the new events chain onto the log as it was: the damaged commit stays in its history
    assert subprocess.run(["git", "merge-base", "--is-ancestor", bad, LOG_REF], cwd=ws.root).returncode == 0
    assert len(load(ws).log) > n_events


def test_log_commit_without_seq_is_reported(tmp_path):
    ws = chain_workspace(tmp_path, evals=1)
    bad = rewrite_log(ws, 1, lambda m: replace_line(m, "Forge-Seq", "x"))
    [d] = load(ws).damaged
    assert (d.ref, d.commit, d.what) == ("forge/log", bad, "Forge-Seq 'x' is not a number")


# ---- refs at missing or unreadable objects ----------------------------------------------------------
def test_refs_at_missing_objects_and_broken_refs(tmp_path, capsys):
    ws = chain_workspace(tmp_path, evals=3)
    leaf = head(ws, "search/a/n0003")
    (ws.root / ".git" / "objects" / leaf[:2] / leaf[2:]).unlink()  # the leaf's commit object is gone
    (ws.root / ".git" / "refs" / "heads" / "search" / "a" / "n0004").write_text("1" * 40 + "\n")
    (ws.root / ".git" / "refs" / "heads" / "search" / "a" / "n0005").write_text("garbage\n")
    blob = git(ws, "hash-object", "-w", "--stdin", stdin="not a commit")
    (ws.root / ".git" / "refs" / "heads" / "search" / "a" / "n0006").write_text(blob + "\n")
    whats = {d.ref: d.what for d in load(ws).damaged}
    assert whats == {"search/a/n0003": f"points at {leaf[:12]}, an object that is missing or unreadable",
                     "search/a/n0004": f"points at {'1' * 12}, an object that is missing or unreadable",
                     "search/a/n0005": "the ref is broken (its file holds no object id)",
                     "search/a/n0006": "points at a blob, not a commit"}
    out, err = replay_cli(ws, capsys)
    assert {line.split(":")[0] for line in err.splitlines()} == \
        {"skipped search/a/n0003", "skipped search/a/n0004", "skipped search/a/n0005", "skipped search/a/n0006"}
    assert "n0002" in out
    run_search(ws, max_evals=4, resume=True)
    assert node_ids(ws) == {"root", "n0001", "n0002", "n0007", "n0008"}
    assert (ws.root / ".git" / "refs" / "heads" / "search" / "a" / "n0005").read_text() == "garbage\n"
    assert head(ws, "search/a/n0004") == "1" * 40


def test_log_tip_missing_starts_a_new_log_and_keeps_the_old_tip(tmp_path, capsys):
    ws = chain_workspace(tmp_path, evals=2)
    tip = git(ws, "rev-parse", LOG_REF)
    (ws.root / ".git" / "objects" / tip[:2] / tip[2:]).unlink()
    loaded = load(ws)
    assert loaded.log == [] and len(loaded.nodes) == 3
    [d] = loaded.damaged
    assert d.ref == "forge/log" and d.commit == tip and "is missing or unreadable" in d.what
    assert main(["replay", str(ws.root)]) == 0
    summary, _ = run_search(ws, max_evals=3, resume=True)
    assert summary.evaluations == 3
    assert git(ws, "rev-parse", "refs/heads/forge/log-damaged-1") == tip  # kept, not lost
    assert "error" not in git(ws, "log", "--format=%H", LOG_REF).lower()  # a sound chain again
    assert [e.kind for e in load_events(ws) if e.kind.startswith("search_")] == ["search_started", "search_stopped"]


# ---- writes never replace a ref ---------------------------------------------------------------------
def test_store_refuses_to_overwrite_a_node_ref_loose_or_packed(tmp_path):
    ws = chain_workspace(tmp_path, evals=2)
    for packed in (False, True):
        if packed:
            git(ws, "pack-refs", "--all")
            assert not (ws.root / ".git" / "refs" / "heads" / "search" / "a" / "n0002").exists()
        before = head(ws, "search/a/n0002")
        with ws.git() as repo:
            store = SearchStore(repo)
            store.load()
            rec = NodeRecord(99, "a", "n0002", "n0001", "passed", 2.0, "again", "t", 0.0, "", "")
            with pytest.raises(RefConflict, match="refusing to overwrite search/a/n0002: it already exists"):
                store.write_node(rec, {"x": b"y"}, head(ws, "search/a/n0001"))
        assert head(ws, "search/a/n0002") == before


def test_log_moves_only_from_where_it_was_read(tmp_path):
    ws = chain_workspace(tmp_path, evals=1)
    from forge_tui.search.store import LogRecord

    with ws.git() as repo:
        fresh = SearchStore(repo)  # never loaded: it must not start a second log over the first
        with pytest.raises(RefConflict, match="refusing to overwrite forge/log: it already exists"):
            fresh.write_log(LogRecord(99, "search_stopped", None, None, {}, ""))
        a, b = SearchStore(repo), SearchStore(repo)
        a.load(), b.load()
        a.write_log(LogRecord(99, "search_stopped", None, None, {}, ""))
        with pytest.raises(RefConflict):  # b's view is stale: a moved the log meanwhile
            b.write_log(LogRecord(100, "search_stopped", None, None, {}, ""))
    assert [r.seq for r in load(ws).log][-1] == 99


def test_stale_lock_file_makes_the_search_take_the_next_id(tmp_path):
    ws = chain_workspace(tmp_path, evals=2)
    lock = ws.root / ".git" / "refs" / "heads" / "search" / "a" / "n0003.lock"
    lock.write_text("")  # left by a process killed while writing n0003
    summary, _ = run_search(ws, max_evals=3, resume=True)
    assert node_ids(ws) == {"root", "n0001", "n0002", "n0004"}
    assert any(d.ref == "search/a/n0003" and "lock exists" in d.what for d in summary.damaged)


def test_fresh_discards_a_damaged_search(tmp_path):
    ws = chain_workspace(tmp_path, evals=2)
    (ws.root / ".git" / "refs" / "heads" / "search" / "a" / "n0009").write_text("garbage\n")
    (ws.root / ".git" / "refs" / "heads" / "search" / "a" / "n0008").write_text("1" * 40 + "\n")
    with pytest.raises(Exception, match="--resume"):
        run_search(ws, max_evals=2)  # damaged records count as a recorded search
    with ws.git() as repo:
        assert SearchStore(repo).delete_all() == 2 + 3 + 1
    assert not load(ws).recorded


# ---- the CLI: forge search --resume ---------------------------------------------------------------
def test_cli_search_resume_prints_skips_and_goes_on(tmp_path, capsys, monkeypatch):
    from forge_tui.session import ProposerChoice, Session

    ws = chain_workspace(tmp_path, evals=3)
    bad = rewrite(ws, "search/a/n0003", replace_line(message(ws, "search/a/n0003"), "Forge-Seq", "3x"))
    monkeypatch.setattr(Session, "pool", lambda self, backend=None, **_: FakePool())
    monkeypatch.setattr(Session, "proposer", lambda self, spec="auto": ProposerChoice(ChainProposer(), "test"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "forge.toml").write_text("[search]\nmin_gain = 0.0\n")
    capsys.readouterr()
    args = ["--config", str(tmp_path / "forge.toml"), "search", str(ws.root), "--max-evals", "4", "--parallel", "1"]
    assert main(args + ["-q"]) == 2  # without --resume: refused, one line
    assert "--resume" in capsys.readouterr().err
    assert main(args + ["--resume", "-q"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == ["skipped search/a/n0003: Forge-Seq '3x' is not a number"]
    assert head(ws, "search/a/n0003") == bad
    assert node_ids(ws) == {"root", "n0001", "n0002", "n0004", "n0005"}


def test_node_whose_files_cannot_be_read_gets_no_children(tmp_path):
    ws = chain_workspace(tmp_path, evals=2, per_card=False)
    sub = git(ws, "rev-parse", "refs/heads/search/a/n0002:candidate")
    (ws.root / ".git" / "objects" / sub[:2] / sub[2:]).unlink()  # the leaf's candidate/ folder is gone
    with ws.git() as repo:
        with pytest.raises(WorkspaceError, match="cannot read candidate/result.json"):
            SearchStore(repo).read(head(ws, "search/a/n0002"), "result.json")
    leaf = head(ws, "search/a/n0002")
    proposer = CountingProposer()  # children for any node
    summary, _ = run_search(ws, max_evals=4, resume=True, proposer=proposer)
    assert {d.ref for d in summary.damaged} == {"search/a/n0002"}
    assert all(not d.skipped and "cannot be read" in d.what for d in summary.damaged)
    assert all(c.parent.id != "n0002" for c in proposer.contexts)  # never offered to the proposer
    assert head(ws, "search/a/n0002") == leaf and summary.evaluations == 4
    assert all(r.parent != "n0002" for r in load(ws).nodes)
