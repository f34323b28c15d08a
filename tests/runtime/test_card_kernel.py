"""A promoted kernel loaded and called by the runtime: its build for this machine, its workspace,
its outputs' layout."""

import pytest
import torch
from runtime_helpers import (
    load_workload,
    promoted_workspace,
    with_workspace_softmax,
)

from forge_tui.promotion import manifest
from forge_tui.runtime.apply import apply
from forge_tui.runtime.kernel import CardKernel


@pytest.fixture
def promoted(tmp_path_factory):
    return promoted_workspace(tmp_path_factory)


def test_a_build_for_another_arch_falls_back(promoted, tmp_path):
    ws, norm, sm = promoted
    man = manifest(ws)
    e = man.entries[norm.id]
    e.builds[0].arch = "some-other-cpu"
    folder = tmp_path / "kernels"
    import shutil

    shutil.copytree(ws.root / "kernels", folder)
    man.save(folder)
    shutil.copytree(folder, tmp_path / "ws2" / "kernels")
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad(), apply(model, tmp_path / "ws2", only_faster=False) as applied:
        torch.testing.assert_close(model(x), wl.get_model()(x))
        st = {c["card"]: c for c in applied.status()["cards"]}
    assert not st[norm.id]["active"] and "no build for cpu/" in st[norm.id]["disabled_reason"]
    assert st[sm.id]["served"] == 1


def test_a_kernel_asks_its_workspace_size_once(promoted, monkeypatch, tmp_path):
    """The guard fixes every shape, stride and scalar the size depends on, so the runtime asks
    once, and every call still gets a workspace of that size: one buffer, kept for the stream."""
    import forge_tui.runtime.kernel as kernel_mod
    from forge_tui.kernel_abi import Library

    ws, sm = with_workspace_softmax(promoted, tmp_path)
    asked, given = [], []
    real_size, real_call = Library.workspace_bytes, Library.call_raw

    def size(self, *a):
        asked.append(1)
        return real_size(self, *a)

    def call(self, *a):
        given.append(a[-1].numel())
        a[-1].zero_()  # the candidate refuses a workspace that still holds its last call's marker
        return real_call(self, *a)

    made, real_alloc = [], kernel_mod.alloc_workspace

    def alloc(*a):
        made.append(a)
        return real_alloc(*a)

    monkeypatch.setattr(Library, "workspace_bytes", size)
    monkeypatch.setattr(Library, "call_raw", call)
    monkeypatch.setattr(kernel_mod, "alloc_workspace", alloc)
    wl = load_workload()
    model, x = wl.get_model(), wl.get_inputs()[0]
    with torch.no_grad():
        expected = model(x)
        with apply(model, ws, cards=[sm.id], only_faster=False) as applied:
            outs = [model(x) for _ in range(4)]
            st = applied.status()["cards"][0]
    assert st["served"] == 4 and st["active"], st
    assert len(asked) == 1 and len(given) == 4 and len(set(given)) == 1 and given[0] > 0
    assert len(made) == 1, made  # the workspace of the first call, kept for the others
    for o in outs:
        torch.testing.assert_close(o, expected, rtol=1e-5, atol=1e-6)


def test_a_kernel_with_a_workspace_is_bound_like_a_plain_one(promoted, tmp_path):
    """``CardKernel.bind`` (the fast path of module cards and learned leaf sites) serves a kernel
    with a workspace too: its size asked once, one buffer kept per device and stream and handed to
    every call, the dropped outputs kept likewise, the output as eager's. (The candidate refuses a
    workspace that still holds its last call's marker: the test clears it between calls, as the
    evaluator's poison does.)"""
    import forge_tui.runtime.kernel as kernel_mod
    from forge_tui.kernel_abi import Library
    from forge_tui.promotion import kernels_dir, manifest
    from forge_tui.runtime.kernel import CardKernel

    ws, sm = with_workspace_softmax(promoted, tmp_path)
    entry = manifest(ws).entries[sm.id]
    k = CardKernel(entry, kernels_dir(ws), "cpu")
    assert k.lib.needs_workspace and k.lib.plain_launch is None
    asked, real_size = [], Library.workspace_bytes

    def size(self, *a):
        asked.append(1)
        return real_size(self, *a)

    made, real_alloc = [], kernel_mod.alloc_workspace

    def alloc(*a):
        made.append(a)
        return real_alloc(*a)

    call = k.bind(0)
    assert call is not None
    x = torch.randn(16, 256)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Library, "workspace_bytes", size)
        mp.setattr(kernel_mod, "alloc_workspace", alloc)
        for _ in range(3):
            for w in k._scratch.values():
                w.zero_()
            torch.testing.assert_close(call([x], 0), torch.softmax(x, -1), rtol=1e-5, atol=1e-6)
    assert len(asked) == 1 and len(made) == 1 and len(k._scratch) == 1
    (w,) = k._scratch.values()
    assert w.numel() == k._ws_bytes > 0
    with pytest.raises(kernel_mod.KernelError, match="returned 9"):
        call([x], 0)  # the marker left by the last call: the kept buffer was the one handed over


def test_outputs_are_allocated_with_the_cards_strides():
    """Like an input only where that input is dense (empty_like keeps its strides); contiguous,
    channels-last and a non-dense layout each come out with exactly the card's strides."""
    from forge_tui.cards import TensorSpec
    from forge_tui.runtime.kernel import _allocator

    x = torch.randn(2, 3, 4, 5)
    strided = x[:, :, :, ::2]
    cases = [  # (output spec, input specs, the inputs)
        ((2, 3, 4, 5), (60, 20, 5, 1), [x]),
        ((2, 3, 4, 5), (60, 1, 15, 3), [x]),  # channels-last from a contiguous input
        ((2, 3, 4, 3), tuple(strided.stride()), [strided]),  # matches the input, which is not dense
        ((2, 3, 4, 5), (60, 1, 15, 3), [x.contiguous(memory_format=torch.channels_last)]),
    ]
    for shape, stride, inputs in cases:
        out = TensorSpec(shape=list(shape), stride=list(stride), dtype="float32", role="output")
        ins = [TensorSpec(shape=list(t.shape), stride=list(t.stride()), dtype="float32") for t in inputs]
        k = CardKernel.__new__(CardKernel)
        k.device, k._empty, k._empty_like, k._empty_plain = "cpu", [_allocator(out, ins)], torch.empty_like, torch.empty
        (got,) = k._outputs(inputs)
        assert (tuple(got.shape), got.stride(), got.dtype) == (shape, stride, torch.float32)
    # the dense matches are allocated like their input
    assert _allocator(TensorSpec(shape=[2, 3, 4, 5], stride=[60, 20, 5, 1], dtype="float32"),
                      [TensorSpec(shape=[2, 3, 4, 5], stride=[60, 20, 5, 1], dtype="float32")])[0] == 0
