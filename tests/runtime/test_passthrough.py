"""``Passthrough`` (``runtime/passthrough.py``): a model's calls that forge's forwards serve nothing in
run as written once two in a row with the same lead served nothing and counted the same, each
still counted as the learned call counted it; a recheck that serves, another lead, grad enabled
or a trace ends that."""

import torch
from torch import nn

from forge_tui.runtime.forwards import ReplacedForwards
from forge_tui.runtime.passthrough import Passthrough
from forge_tui.runtime.status import StatusBoard


class _Child(nn.Module):
    def forward(self, x):
        return x + 1


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = _Child(), _Child()

    def forward(self, x, scale=1.0):
        return self.b(self.a(x)) * scale


def _served_model(serves):
    """A model whose children carry forward's like forge's module cards': each call serves its
    card where ``serves(x)`` says so, else falls back ("shape"), counted on the board, the first
    time a shape is refused one by one, later by the tally the forward remembers for it. ->
    (model, board, the forwards, the calls that reached forge's forwards, Passthrough)."""
    model, board, forwards = _Model(), StatusBoard(), ReplacedForwards()
    reached = []
    for name in ("a", "b"):
        child = getattr(model, name)
        st = board.card(f"card-{name}", "module", "module:_Child")
        remembered = {}

        def forge_forward(x, child=child, st=st, remembered=remembered):
            reached.append(st.card)
            if serves(x):
                board.served(st)
            elif x.shape in remembered:
                remembered[x.shape].n += 1
            else:
                board.fell_back(st, "shape")
                remembered[x.shape] = board.tally([st], "shape")
            return type(child).forward(child, x)

        forwards.replace(child, forge_forward)
    through = Passthrough(model, board, forwards.suspend, forwards.resume)
    forwards.replace(model, through.call)
    return model, board, forwards, reached, through


def test_two_alike_calls_that_serve_nothing_make_the_rest_of_the_run_pass_through_counted():
    model, board, forwards, reached, through = _served_model(lambda x: x.shape[1] == 16)
    prompt, step = torch.ones(2, 16), torch.ones(2, 1)
    with torch.no_grad():
        model(prompt)
        assert board.served_total == 2 and through.plan is None
        model(step)  # the shape refused the first time: judged, not remembered yet
        assert through.plan is None
        for _ in range(2):  # learned from these two
            model(step)
        assert through.plan is not None and len(reached) == 8
        for _ in range(5):
            y = model(step)
            assert torch.equal(y, step + 2)
        assert len(reached) == 8 and through.passed_calls == 5  # forge's forwards not called
        assert "forward" not in model.a.__dict__ and model.__dict__["forward"] == through.call
        counts = {c["card"]: c["fallbacks"] for c in board.snapshot()["cards"]}
        assert counts == {"card-a": {"shape": 8}, "card-b": {"shape": 8}}  # every step counted
        model(prompt)  # another lead ends the run: forge's forwards again, served
        assert board.served_total == 4 and model.a.__dict__["forward"] is not None and through.plan is None
        model(prompt)  # a lead that served: watched by the served count alone
        assert board.served_total == 6 and through.serving == through.lead
        model(step)  # the next generation's steps are learned again
        assert len(reached) == 14 and through.plan is None and not through.suspended
        model(step)
        assert through.plan is not None and through.suspended and len(reached) == 16
        tallies = len(board._tallies)
        for _ in range(3):  # more generations count through the same tallies
            model(prompt)
            for _ in range(4):
                model(step)
        assert len(board._tallies) == tallies and through.runs == 5
    forwards.restore()
    assert "forward" not in model.__dict__ and "forward" not in model.a.__dict__


def test_a_recheck_that_serves_ends_the_pass_through_run():
    serving = [False]
    model, board, _, reached, through = _served_model(lambda x: serving[0])
    step = torch.ones(2, 1)
    with torch.no_grad():
        for _ in range(3):
            model(step)
        assert through.plan is not None
        serving[0] = True  # the step's shapes came into a card's range
        for _ in range(Passthrough.RECHECK - 1):
            model(step)
        assert len(reached) == 6 and board.served_total == 0  # passed through: not seen yet
        model(step)  # the recheck
        assert board.served_total == 2 and through.plan is None and not through.suspended
        model(step)
        assert board.served_total == 4  # served from then on


def test_grad_enabled_and_calls_counted_otherwise_keep_the_forwards():
    model, board, _, reached, through = _served_model(lambda x: False)
    step = torch.ones(2, 1)
    for _ in range(4):  # grad enabled: every call through forge's forwards
        model(step)
    assert through.plan is None and len(reached) == 8
    with torch.no_grad():
        extra = board.tally([board.cards["card-a"]], "other")
        model.b.__dict__["forward"] = _counting(model.b.__dict__["forward"], extra)
        for _ in range(6):  # the same lead, counted once two fallbacks and once three
            model(step)
        assert through.plan is None and len(reached) == 20
        model.b.__dict__["forward"].every = 1  # now alike at every call
        model(step)
        model(step)
        assert through.plan is not None


def _counting(forward, tally):
    """``forward`` that also counts ``tally`` at every ``every``-th call (every second at first)."""

    def counted(x):
        counted.calls += 1
        if counted.calls % counted.every == 0:
            tally.n += 1
        return forward(x)

    counted.calls, counted.every = 0, 2
    return counted


def test_while_dynamo_traces_the_forwards_are_never_swapped(monkeypatch):
    model, board, _, reached, through = _served_model(lambda x: False)
    step, other = torch.ones(2, 1), torch.ones(2, 3)
    with torch.no_grad():
        for _ in range(3):
            model(step)
        assert through.suspended and len(reached) == 6
        monkeypatch.setattr(through, "_compiling", lambda: True)
        model(other)  # another lead while traced: as written, nothing swapped back
        assert through.suspended and len(reached) == 6
        monkeypatch.undo()
        model(other)
        assert not through.suspended and len(reached) == 8


def test_a_model_compiled_after_apply_is_traced_through_as_written():
    """Dynamo traces the model's forward straight to the model's own: nothing of the learned state
    is read or changed (each read a guard, its counts changing at every call: a recompile a
    step), and forge's forwards stay as they are."""
    model, board, _, reached, through = _served_model(lambda x: False)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend="eager")
        with torch.no_grad():
            for _ in range(12):
                assert torch.equal(compiled(torch.ones(2, 1)), torch.full((2, 1), 3.0))
    finally:
        torch._dynamo.reset()
    assert through.lead is None and through.plan is None and through.passed_calls == 0 and not through.suspended
    assert len(reached) == 24  # forge's forwards ran at every call


def test_calls_refused_one_by_one_never_make_a_pass_through_run():
    """Fallbacks counted one by one are a guard still judging, learning or holding calls back (a
    module card's dispatch check runs eager's own call instead of its kernel for a few calls):
    however alike such calls are, they keep going through forge's forwards."""
    model, board, _, reached, through = _served_model(lambda x: False)
    held = board.cards["card-a"]

    def holding_back(x, forward=model.a.__dict__["forward"]):
        board.fell_back(held, "eager's own call, timed for the dispatch check")
        return forward(x)

    model.a.__dict__["forward"] = holding_back
    with torch.no_grad():
        for _ in range(Passthrough.RECHECK + 4):
            model(torch.ones(2, 1))
    assert through.plan is None and through.passed_calls == 0 and len(reached) == 2 * (Passthrough.RECHECK + 4)


def test_undone_while_passing_through_leaves_every_module_as_it_was():
    model, _, forwards, reached, through = _served_model(lambda x: False)
    with torch.no_grad():
        for _ in range(4):
            model(torch.ones(2, 1))
    assert through.suspended and through.passed_calls == 1
    forwards.restore()
    assert all("forward" not in m.__dict__ for m in (model, model.a, model.b))
    assert torch.equal(model(torch.ones(2, 1)), torch.full((2, 1), 3.0)) and len(reached) == 6
