"""What forge costs a generation loop's decode steps that no kernel serves: the tiny decoder with its
RMSNorm (module card) and attention softmax (op card, a compiled or intercepted scope) promoted at
the prompt's shapes, its decode steps at others. Counted, paired with eager's own loop: the
Python-level calls (``sys.setprofile``'s call and C-call events) of each step, never a time;
eager's step makes 315."""

import copy
import sys
from collections import Counter

import pytest
import torch
from runtime_helpers import CFG, CPU, measured_speedups, shared

from forge_tui.evaluator import Evaluator
from forge_tui.examples import tiny_decoder
from forge_tui.generation.adapters import adapter_for
from forge_tui.generation.cache import DynamicKV
from forge_tui.promotion import promote_kernel
from forge_tui.runtime.apply import apply
from forge_tui.runtime.status import CardStatus, StatusBoard
from forge_tui.workspace import profile_into_workspace

STEPS = 36


@pytest.fixture(scope="module")
def decoder_ws(tmp_path_factory):
    """The tiny decoder profiled at its inputs (batch 2, 16 tokens), its RMSNorm and the softmax
    cards whose kernel evaluates correct promoted, recorded at 2x eager."""

    def build():
        root = tmp_path_factory.mktemp("decode_cost")
        cfg = root / "forge.toml"
        cfg.write_text("[timing]\nwarmup = 1\nrepeats = 3\nthreads = 1\nmax_spread = 10.0\nmax_slowdown = 100.0\n")
        ws, _ = profile_into_workspace("example:tiny_decoder", root / "ws", device="cpu", config_path=cfg)
        promoted = {}
        with Evaluator(ws.store, ws.cache, CFG, backend="cpu") as ev:
            for card in ws.cards():
                name = "rmsnorm_good.cpp" if card.target == "module:RMSNorm" else \
                    "softmax_good.cpp" if card.target == "aten._softmax.default" else None
                if name is None:
                    continue
                src = (CPU / name).read_text()
                r = ev.evaluate(card, src)
                if r.correct:
                    promote_kernel(ws, card.id, src, r, by="test")
                    promoted[card.id] = card.target
        assert sorted(promoted.values()) == ["aten._softmax.default", "module:RMSNorm"], promoted
        measured_speedups(ws.root, dict.fromkeys(promoted, 2.0))
        return ws, promoted

    return shared("tiny_decoder_norm_softmax", build)


def _decode_counts(model, ids):
    """(the Python-level calls of each decode step, the greedy tokens): the prompt's prefill, then
    ``STEPS`` steps of one token over a cache that grows, as the example's own loop runs them."""
    ad = adapter_for(model)
    counts = []
    with torch.no_grad():
        cache = DynamicKV(ad.cfg.layers)
        n = ids.shape[1]
        nxt = ad.call(ids, past_key_values=cache, cache_position=torch.arange(n))[:, -1, :].argmax(-1, keepdim=True)
        tokens = [nxt]
        for t in range(1, STEPS + 1):
            events = Counter()

            def count(frame, event, arg, events=events):
                events[event] += 1

            pos = torch.arange(n + t - 1, n + t)
            sys.setprofile(count)
            try:
                logits = ad.call(nxt, past_key_values=cache, cache_position=pos)
            finally:
                sys.setprofile(None)
            nxt = logits[:, -1, :].argmax(-1, keepdim=True)
            tokens.append(nxt)
            counts.append(events["call"] + events["c_call"])
    return counts, torch.cat(tokens, 1)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled-scope", "intercepted-scope"])
def test_decode_steps_no_kernel_serves_run_as_written_after_three(decoder_ws, compiled):
    """The prefill is served; every decode step is refused (other shapes). The first three steps go
    through forge's forwards (a compile that finds nothing to serve, the refusals judged, then two
    steps alike whose refusals were remembered); from the fourth on, a step runs the modules' own
    forwards, and what forge adds to its Python-level calls, paired with eager's same step, is the
    model's one forward of forge's and three flags (``runtime/passthrough.py``), whatever the model's
    size. Every ``RECHECK``-th such step goes through forge's forwards again: a few calls a forward
    it replaced, and the swaps'. Over a run that is 5.3 calls a step, 1.7% of eager's 315, where
    it was 24. Every refused call is still counted, as the status names it."""
    from forge_tui.runtime.passthrough import Passthrough

    ws, promoted = decoder_ws
    torch.manual_seed(0)
    base = tiny_decoder.get_model().eval()
    ids = tiny_decoder.get_inputs()[0]
    eager, tokens = _decode_counts(copy.deepcopy(base), ids)
    model = copy.deepcopy(base)
    with apply(model, ws, only_faster=False, compiled_scopes=compiled) as applied:
        forge, forge_tokens = _decode_counts(model, ids)
        replaced = len(applied.forwards.modules()) - 1  # the model's own forward aside
        cards = {c["card"]: c for c in applied.status()["cards"]}
        through = applied.passthrough
    assert torch.equal(forge_tokens, tokens)
    assert (len(applied.scopes) == 2) == compiled
    assert all(cards[c]["served"] > 0 for c in promoted), cards  # the prefill's calls
    added = [f - e for f, e in zip(forge, eager)]
    recheck = 3 + Passthrough.RECHECK  # the step whose call is the pass-through run's RECHECK-th
    assert STEPS >= recheck
    passed = [a for step, a in enumerate(added, 1) if step > 3 and step != recheck]
    # Passthrough.forward, torch.compiler.is_compiling, torch.jit.is_scripting, is_grad_enabled
    assert passed == [4] * (STEPS - 4), added
    assert through.passed_calls == STEPS - 4 and through.runs == 1
    # two attention scopes and five norms; an intercepted scope's children leave its
    # interception through a forward of forge's each
    assert replaced == 7 if compiled else replaced > 7
    # the recheck: forge's forwards, their two swaps (no call an entry) and the counts compared
    assert 4 * replaced < added[recheck - 1] <= 4 * replaced + 20, added
    # every refused call is still counted, as the status names it: five norms and two
    # attentions a step (the prefill's final norm, at the sampled positions, refused too)
    norm = next(c for c, t in promoted.items() if t == "module:RMSNorm")
    assert 5 * STEPS <= sum(cards[norm]["fallbacks"].values()) <= 5 * STEPS + 1
    softmax = [c for c, t in promoted.items() if t != "module:RMSNorm"]
    assert 2 * STEPS <= sum(sum(cards[c]["fallbacks"].values()) for c in softmax) <= 2 * STEPS + 2


def test_with_nothing_installed_a_decode_step_costs_what_eagers_does(decoder_ws):
    """With no card installed (``cards`` names none of the workspace's), a step's calls are
    eager's, from the first."""
    ws, _ = decoder_ws
    torch.manual_seed(0)
    base = tiny_decoder.get_model().eval()
    ids = tiny_decoder.get_inputs()[0]
    eager, _ = _decode_counts(copy.deepcopy(base), ids)
    model = copy.deepcopy(base)
    with apply(model, ws, cards=["no-such-card"]):
        forge, _ = _decode_counts(model, ids)
    assert forge == eager


def test_a_tally_counts_into_active_cards_only_and_loses_nothing_to_a_fold():
    """``StatusBoard.tally``: the caller's own increments reach the status when it is read, for the
    cards active then; a card switched off keeps what was counted while it was on; folds between
    increments neither lose nor repeat a count."""
    board = StatusBoard()
    on, off = board.card("a", "op", "x"), board.card("b", "op", "y")
    tally = board.tally([on, off], "why")
    for _ in range(3):
        tally.n += 1
    board.disable(off, "test")
    for _ in range(2):
        tally.n += 1
        board.settle()
    tally.n += 1  # read by the snapshot alone
    snap = {c["card"]: c["fallbacks"] for c in board.snapshot()["cards"]}
    assert snap == {"a": {"why": 6}, "b": {"why": 3}}
    assert isinstance(on, CardStatus) and on.fallbacks["why"] == 6
