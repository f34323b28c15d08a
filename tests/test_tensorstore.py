import pytest
import torch

from forge_tui.tensorstore import TensorStore, pack, storage_extent, unpack


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool])
@pytest.mark.parametrize("make", [
    lambda t: t,                                  # contiguous
    lambda t: t.t(),                              # transposed
    lambda t: t[:, 1:3],                          # sliced, offset
    lambda t: t[:1].expand(5, 4),                 # overlapping (stride 0)
    lambda t: t[::2],                             # strided
])
def test_layout_roundtrip(tmp_path, dtype, make):
    base = (torch.randn(6, 4) * 10).to(dtype)
    t = make(base)
    store = TensorStore(tmp_path)
    key = store.put(t)
    back = store.get(key)
    assert back.shape == t.shape and back.stride() == t.stride() and back.dtype == t.dtype
    assert torch.equal(back, t)
    assert store.put(t) == key  # content addressed


def test_thin_slice_is_stored_dense():
    big = torch.randn(64, 1000)
    thin = big[:, :3]
    flat, shape, stride, mode = pack(thin)
    assert mode == "dense" and flat.numel() == thin.numel()
    back = unpack(flat, shape, stride, mode)
    assert back.stride() == thin.stride() and torch.equal(back, thin)


def test_extent():
    assert storage_extent((2, 3), (3, 1)) == 6
    assert storage_extent((5, 4), (0, 1)) == 4
    assert storage_extent((0, 4), (4, 1)) == 0
