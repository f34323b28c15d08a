"""Guards compare a served module's attributes with the card's: in every serving path, an eps,
the training flag, the model's softmax dim or a weight changed before ``apply``, between ``apply``
and the first call, or after the first calls, gives eager's output (the kernels compile in the
profiled eps and compute the profiled mode's values)."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from forge_tui.config import parse_config
from forge_tui.evaluator import Evaluator
from forge_tui.promotion import promote_kernel
from forge_tui.runtime.apply import Mode, apply
from forge_tui.runtime.pieces import capture_pieces
from forge_tui.workspace import profile_into_workspace

HERE = Path(__file__).resolve().parent.parent
WORKLOAD = HERE / "data" / "workloads" / "attr_model.py"
CPU = HERE / "candidates" / "cpu"
CFG = parse_config({"timing": {"warmup": 1, "repeats": 3, "threads": 1, "max_spread": 10.0, "max_slowdown": 100.0}})


def _workload():
    spec = importlib.util.spec_from_file_location("attr_model", WORKLOAD)
    wl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wl)
    return wl


@pytest.fixture(scope="module")
def attr_ws(tmp_path_factory):
    """attr_model.py profiled on the cpu, its RMSNorm (a module card) and its softmax (an op card)
    promoted after a real evaluation of a real kernel each."""
    root = tmp_path_factory.mktemp("attrs")
    cfg = root / "forge.toml"
    cfg.write_text("[timing]\nwarmup = 1\nrepeats = 3\nthreads = 1\nmax_spread = 10.0\nmax_slowdown = 100.0\n")
    ws, _ = profile_into_workspace(WORKLOAD, root / "ws", device="cpu", config_path=cfg)
    norm = next(c for c in ws.cards() if c.kind == "module")
    sm = next(c for c in ws.cards() if c.target == "aten._softmax.default")
    with Evaluator(ws.store, ws.cache, CFG, backend="cpu") as ev:
        for card, name in ((norm, "rmsnorm_good.cpp"), (sm, "softmax_good.cpp")):
            src = (CPU / name).read_text()
            r = ev.evaluate(card, src)
            assert r.correct, r.reason
            promote_kernel(ws, card.id, src, r, by="test")
    return ws, norm, sm


CHANGES = {
    "eps": lambda m: setattr(m.norm, "variance_epsilon", 0.5),
    "training": lambda m: m.train(),
    "dim": lambda m: setattr(m, "dim", 0),
    "weight": lambda m: setattr(m.norm, "weight", nn.Parameter(torch.full((256,), 2.0))),
    "weight shape": lambda m: setattr(m.norm, "weight", nn.Parameter(torch.full((1,), 2.0))),
}
"""What changes in the model: the norm's eps (a constant of its kernel), the training flag (the
norm's forward halves its output in training), the softmax's dim (an argument of the op card's
call), the norm's weight replaced by another of its shape (an input of its kernel, read at each
call) or of another shape (which eager broadcasts)."""

MOMENTS = ("before apply", "before the first call", "after the first calls")


class _StandIn:
    """A CUDA graph capture on the CPU: the capture runs the call, a replay runs it again."""

    def capture(self, fn):
        out = fn()

        def replay():
            out.copy_(fn())

        return replay, out


def _serve(model, ws, cards, path: str):
    """(the applied handle, what runs the model, what undoes the path's own wrapping)."""
    if path == "module forward":
        applied = apply(model, ws, cards=cards[:1], only_faster=False, trial_calls=0, compiled_scopes=False)
        return applied, model, None
    if path == "compiled scope":
        applied = apply(model, ws, cards=cards, only_faster=False, trial_calls=0)
        assert "" in applied.scopes, applied.skipped  # the model's forward, compiled around the norm
        return applied, model, None
    if path == "interceptor":
        applied = apply(model, ws, cards=cards, only_faster=False, trial_calls=0, compiled_scopes=False)
        return applied, model, None
    if path == "torch_compile custom op":
        applied = apply(model, ws, cards=cards, mode=Mode.TORCH_COMPILE, only_faster=False)
        return applied, torch.compile(model, backend=applied.backend("aot_eager")), None
    if path == "cuda graph pieces":
        applied = apply(model, ws, cards=cards[:1], mode=Mode.CUDA_GRAPH, only_faster=False)
        pieces = capture_pieces(model, capturer=_StandIn(), device="cpu")
        return applied, model, pieces
    raise AssertionError(path)


PATHS = ("module forward", "compiled scope", "interceptor", "torch_compile custom op", "cuda graph pieces")


def _served(applied) -> int:
    return sum(c["served"] for c in applied.status()["cards"])


@pytest.mark.parametrize("path", PATHS)
def test_a_changed_attribute_gives_eager_s_output_in_every_serving_path(attr_ws, path):
    """Each attribute changed before ``apply``, between ``apply`` and the first call, and after the
    first calls: every call gives what eager's model with the same change gives. Unchanged, the
    path serves the kernels (so the change, not the path, decides). Every change is tried at every
    moment; the failure lists those that gave another output."""
    ws, norm, sm = attr_ws
    wl = _workload()
    x = wl.get_inputs()[0]
    wrong = []
    for change in CHANGES:
        for moment in MOMENTS:
            torch._dynamo.reset()
            model, eager = wl.get_model(), wl.get_model()
            CHANGES[change](eager)
            with torch.no_grad():
                expected = eager(x)
                if moment == "before apply":
                    CHANGES[change](model)
                applied, run, pieces = _serve(model, ws, [norm.id, sm.id], path)
                try:
                    assert norm.id in applied.guards, applied.skipped
                    if moment == "before the first call":
                        CHANGES[change](model)
                    elif moment == "after the first calls":
                        before = _served(applied)
                        for _ in range(3):
                            torch.testing.assert_close(run(x), wl.get_model()(x), rtol=1e-4, atol=1e-6)
                        assert _served(applied) > before, f"{path}: nothing served before the change"
                        CHANGES[change](model)
                    for _ in range(3):
                        got = run(x)
                        if not torch.allclose(got, expected, rtol=1e-4, atol=1e-6):
                            wrong.append(f"{change} changed {moment}: max abs error "
                                         f"{(got - expected).abs().max().item():.3g}")
                            break
                finally:
                    if pieces is not None:
                        pieces.undo()
                    applied.undo()
    torch._dynamo.reset()
    assert not wrong, f"{path}: " + "; ".join(wrong)


def test_the_profile_records_each_module_card_s_attributes(attr_ws):
    """The module card carries its module's plain attributes as the profiled call found them (the
    eps its kernel compiles in, the training flag), and so does the manifest the runtime reads."""
    from forge_tui.promotion import manifest

    ws, norm, _ = attr_ws
    recorded = norm.module_attrs["norm"]
    assert recorded["variance_epsilon"] == 1e-6 and recorded["training"] is False
    assert manifest(ws).entries[norm.id].signature.module_attrs == norm.module_attrs


def test_a_module_card_whose_profile_recorded_no_attributes_is_not_served(attr_ws, tmp_path):
    """A manifest entry whose profile recorded no attributes for a module (a workspace profiled
    before they were recorded) leaves that module's own forward in place and says why: nothing
    tells whether its eps is the one the kernel compiled in."""
    import shutil

    from forge_tui.runtime.manifest import Manifest

    ws, norm, _ = attr_ws
    shutil.copytree(ws.root / "kernels", tmp_path / "ws" / "kernels")
    man = Manifest.load(tmp_path / "ws" / "kernels")
    man.entries[norm.id].signature.module_attrs = {}
    man.save(tmp_path / "ws" / "kernels")
    wl = _workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad(), apply(model, tmp_path / "ws", cards=[norm.id], only_faster=False) as applied:
        assert norm.id not in applied.guards
        assert "recorded none of the module's attributes" in applied.skipped[norm.id]
        assert "forward" not in model.norm.__dict__
        torch.testing.assert_close(model(x), wl.get_model()(x))


def test_a_module_s_attributes_are_compared_with_the_card_s_values():
    """``card_check`` holds a module whose plain attributes equal the card's (a tuple recorded as
    a list, an infinite float recorded as text) and refuses one where any differs, is missing, is
    no longer plain, or was not recorded; ``difference`` names it; the traced check agrees."""
    from forge_tui.runtime.attrs import card_check, card_values, difference, recorded_attrs, traced_check

    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.eps, self.shape, self.clip = 1e-6, (4, 8), float("inf")

    m = Norm().eval()
    recorded = json.loads(json.dumps(recorded_attrs(m)))  # as the manifest stores it
    assert recorded["shape"] == [4, 8] and recorded["clip"] == {"$float": "inf"}
    card = card_values(recorded)
    assert card_check(m, card)(m.__dict__) and traced_check(card)(m.__dict__)
    for change, named in ((lambda n: setattr(n, "eps", 1e-2), "eps is 0.01"), (lambda n: n.train(), "training is True"),
                          (lambda n: setattr(n, "shape", (4, 9)), "shape is (4, 9)"),
                          (lambda n: setattr(n, "eps", torch.tensor(1e-6)), "eps is a Tensor"),
                          (lambda n: delattr(n, "clip"), "clip is gone"),
                          (lambda n: setattr(n, "scale", 2.0), "scale was not recorded")):
        n = Norm().eval()
        change(n)
        assert not card_check(n, card)(n.__dict__), named
        assert named in difference(n.__dict__, card)
        assert not traced_check(card)(n.__dict__) or named.endswith("not recorded"), named
    n = Norm().eval()
    check = card_check(n, card)
    n.eps = 1e-2  # changed after the check was made: still the card's values it compares with
    assert not check(n.__dict__)
    n.eps = 1e-6
    assert check(n.__dict__)
