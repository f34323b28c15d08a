"""Piecewise CUDA graphs (forge_tui/runtime/pieces.py), on the CPU with a stand-in capture that
does what a graph does to a piece's static buffers: a replay recomputes the captured call on its
static inputs and writes the results into the outputs it returned at capture, and a call that
reads a tensor back to the host cannot be captured."""

import sys

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from forge_tui.runtime.pieces import capture_pieces


class _NoHostReads(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            raise RuntimeError("operation not permitted when stream is capturing")
        return func(*args, **(kwargs or {}))


class StandIn:
    def __init__(self):
        self.captures = []

    def capture(self, fn):
        fn()  # the warm-up
        with _NoHostReads():
            out = fn()
        self.captures.append(fn)

        def replay():
            with _NoHostReads():
                new = fn()
            for o, n in zip(tree_flatten(out)[0], tree_flatten(new)[0]):
                o.copy_(n)

        return replay, out


class Block(nn.Module):
    def __init__(self, n=8):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x, scale: float = 1.0):
        return torch.tanh(self.lin(x)) * scale


class Top(nn.Module):
    """Reads a value back to the host (as a mask check or an expert count does): not capturable
    whole, its blocks are."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])

    def forward(self, x):
        if x.sum().item() > 1e9:  # a host read: no capture can hold it
            x = x * 0
        for b in self.blocks:
            x = b(x) + x
        return x


def _model():
    torch.manual_seed(0)
    return Top().eval()


def test_a_model_that_cannot_be_captured_whole_is_captured_by_its_pieces():
    model = _model()
    x = torch.randn(4, 8)
    with torch.no_grad():
        expected = [model(x * k) for k in range(1, 5)]
        cap = StandIn()
        with capture_pieces(model, capturer=cap, device="cpu") as pieces:
            got = [model(x * k) for k in range(1, 5)]
            st = pieces.status()
    assert "host" in st[""]["refused"][0] or "not capturable" in st[""]["refused"][0], st
    assert st["blocks.0"]["graphs"] == 1 and st["blocks.1"]["graphs"] == 1, st
    # call 1 runs as written (and fails its capture), call 2 captures the blocks, 3 and 4 replay
    assert st["blocks.0"]["replays"] == 2 and st["blocks.1"]["replays"] == 2, st
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    assert "forward" not in model.__dict__ and "forward" not in model.blocks[0].__dict__  # undone


def test_each_call_signature_gets_its_graph_and_plain_arguments_are_part_of_it():
    model = _model()
    cap = StandIn()
    with torch.no_grad(), capture_pieces(model.blocks[0], capturer=cap, device="cpu", max_graphs=2) as pieces:
        b = model.blocks[0]
        x, y = torch.randn(4, 8), torch.randn(6, 8)
        outs = [b(x), b(x), b(y), b(y), b(x, 2.0), b(x, 2.0)]
        st = pieces.status()[""]
    assert st["graphs"] == 2 and st["replays"] == 2, st  # x and y captured; scale=2.0 is a third: over the limit
    assert st["fallbacks"] == {"more than 2 call signatures": 2}, st
    with torch.no_grad():
        torch.testing.assert_close(outs[1], b(x))
        torch.testing.assert_close(outs[3], b(y))
        torch.testing.assert_close(outs[5], b(x, 2.0))


class Counter(nn.Module):
    """Updates a buffer in place each call (a running statistic, a cache): a replay would not."""

    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x):
        self.seen += 1
        return x * self.seen


class Bumps(nn.Module):
    def forward(self, x):
        return x.add_(1)


class Same(nn.Module):
    def forward(self, x):
        return x[1:]


@pytest.mark.parametrize("module,why", [(Counter(), "changes its parameters, buffers or attributes"),
                                        (Bumps(), "changes its inputs in place"),
                                        (Same(), "returns a view of its inputs")])
def test_what_a_replay_would_not_repeat_is_never_captured(module, why):
    cap = StandIn()
    with torch.no_grad(), capture_pieces(module, capturer=cap, device="cpu") as pieces:
        outs = []
        for k in range(3):
            x = torch.full((4,), float(k))
            outs.append((module(x.clone()), x))
        st = pieces.status()[""]
    assert st["graphs"] == 0 and st["replays"] == 0 and why in st["refused"][0], st
    if isinstance(module, Counter):
        assert float(module.seen) == 3  # once a call, as written
        assert [float(o[0]) for o, _ in outs] == [0 * 1, 1 * 2, 2 * 3]


def test_a_replaced_parameter_or_a_training_flag_runs_the_forward_as_written():
    model = _model()
    b = model.blocks[0]
    x = torch.randn(4, 8)
    with torch.no_grad(), capture_pieces(b, capturer=StandIn(), device="cpu") as pieces:
        b(x), b(x)
        b.lin.weight = nn.Parameter(torch.zeros(8, 8))
        got = b(x)
        torch.testing.assert_close(got, torch.tanh(b.lin.bias.expand(4, 8)))
        b.train()
        b(x)
        b.eval()
        b.lin.in_features = 9  # a plain attribute the forward could read
        b(x)
        st = pieces.status()[""]
    assert st["fallbacks"] == {"its parameters, buffers or attributes changed since the capture": 3}, st
    assert st["replays"] == 1


def test_gradients_and_a_capture_running_already_run_the_forward_as_written():
    model = _model()
    b = model.blocks[0]
    x = torch.randn(4, 8, requires_grad=True)
    with capture_pieces(b, capturer=StandIn(), device="cpu") as pieces:
        y = b(x)
        y.sum().backward()
        assert x.grad is not None and pieces.status()[""]["graphs"] == 0


class _FailsInsideTracedCode(StandIn):
    """A capture that fails inside a torch.fx-generated forward (as the bundled decoder's
    ``torch.tensor(..., device=x.device)`` does under a CUDA capture): the traced code calls a C
    function that raises, where torch.fx prints a whole traceback to stderr before re-raising."""

    def capture(self, fn):
        import math
        from unittest import mock

        with mock.patch("torch.tanh", math.sqrt):  # a multi-element tensor is no real number
            return super().capture(fn)


class _FailsWhileAnotherThreadWrites(_FailsInsideTracedCode):
    """The same failure, while another thread (a UI worker, a logger) writes to stderr."""

    calls = 0

    def capture(self, fn):
        import threading

        self.calls += 1
        other = threading.Thread(target=lambda: print("another thread's words", file=sys.stderr))
        other.start()
        other.join()
        return super().capture(fn)


class _Talks(nn.Module):
    def forward(self, x):
        import sys

        print("the forward's own words", file=sys.stderr)
        return x * 2


class _Holds(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x) + 1


def test_a_failed_capture_says_why_in_its_status_and_prints_nothing(capsys):
    model = _Holds(torch.fx.symbolic_trace(Block()))  # the traced module called as a module
    x = torch.randn(4, 8)
    with torch.no_grad():
        expected = model(x)
        with capture_pieces(model, capturer=_FailsInsideTracedCode(), device="cpu") as pieces:
            got = [model(x), model(x)]
            st = pieces.status()[""]
    assert st["graphs"] == 0 and st["refused"] and st["refused"][0].startswith("not capturable: ValueError"), st
    for g in got:
        torch.testing.assert_close(g, expected)
    assert capsys.readouterr().err == ""
    # a capture that succeeds shows what its calls printed: it is the model's own output
    with torch.no_grad(), capture_pieces(_Talks(), capturer=StandIn(), device="cpu") as pieces:
        pieces.model(x)
        assert pieces.status()[""]["graphs"] == 1
    assert capsys.readouterr().err.count("the forward's own words") == 3  # as written, warm-up, capture
    # held back: the capturing thread's words alone, not what another thread writes meanwhile
    real = sys.stderr
    capturer = _FailsWhileAnotherThreadWrites()
    with torch.no_grad(), capture_pieces(model, capturer=capturer, device="cpu") as pieces:
        torch.testing.assert_close(model(x), expected)
        torch.testing.assert_close(model(x), expected)
        assert pieces.status()[""]["refused"][0].startswith("not capturable: ValueError")
    err = capsys.readouterr().err
    assert capturer.calls and err.count("another thread's words") == capturer.calls and "Traceback" not in err, err
    assert sys.stderr is real  # put back


def test_held_stderr_holds_this_threads_writes_alone_and_nests(capsys):
    from forge_tui.runtime.pieces import held_stderr

    real = sys.stderr
    with held_stderr() as outer:
        print("outer, before", file=sys.stderr)
        with held_stderr() as inner:
            print("inner", file=sys.stderr)
        print("outer, after", file=sys.stderr)
        import threading

        other = threading.Thread(target=lambda: print("another thread", file=sys.stderr))
        other.start()
        other.join()
    assert outer.getvalue() == "outer, before\nouter, after\n" and inner.getvalue() == "inner\n"
    assert capsys.readouterr().err == "another thread\n" and sys.stderr is real
