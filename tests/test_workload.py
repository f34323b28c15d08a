import pytest
import torch

from forge_tui.errors import ForgeError, WorkloadError
from forge_tui.workload import load_workload, parse_dtype, resolve_device


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_forge_format_and_dtype_cast(tmp_path):
    p = write(tmp_path, "w.py", "import torch\n"
              "def get_model():\n    return torch.nn.Linear(4, 4)\n"
              "def get_inputs():\n    return [torch.randn(2, 4), torch.tensor([1, 2])]\n")
    w = load_workload(p)
    assert w.format == "forge"
    model, inputs = w.build("cpu", torch.bfloat16)
    assert model.weight.dtype == torch.bfloat16
    assert inputs[0].dtype == torch.bfloat16
    assert inputs[1].dtype == torch.int64  # integer inputs are never cast


def test_kernelbench_format_unchanged():
    w = load_workload("example:kb_softmax")
    assert w.format == "kernelbench"
    model, inputs = w.build("cpu")
    assert model.dim == -1
    out = w.run(model, inputs)
    torch.testing.assert_close(out, torch.softmax(inputs[0], -1))


def test_seeded_build_is_deterministic():
    w = load_workload("example:tiny_mlp")
    m1, i1 = w.build("cpu")
    m2, i2 = w.build("cpu")
    assert torch.equal(i1[0], i2[0])
    assert torch.equal(m1.fc1.weight, m2.fc1.weight)


@pytest.mark.parametrize("text, expected", [
    ("x = 1\n", "defines no model"),
    ("import torch\nraise RuntimeError('boom')\n", "failed to import: RuntimeError: boom (line 2)"),
    ("def get_model(:\n", "failed to import: SyntaxError"),
])
def test_bad_workload_files(tmp_path, text, expected):
    p = write(tmp_path, "bad.py", text)
    with pytest.raises(WorkloadError) as err:
        load_workload(p)
    assert expected in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(WorkloadError, match="workload file not found"):
        load_workload(tmp_path / "nope.py")


def test_unknown_example():
    with pytest.raises(WorkloadError, match="no bundled example named 'nope'"):
        load_workload("example:nope")


def test_model_that_raises(tmp_path):
    p = write(tmp_path, "raises.py", "import torch\n"
              "class M(torch.nn.Module):\n"
              "    def forward(self, x):\n"
              "        raise ValueError('bad shape')\n"
              "def get_model():\n    return M()\n"
              "def get_inputs():\n    return [torch.randn(2)]\n")
    w = load_workload(p)
    model, inputs = w.build("cpu")
    with pytest.raises(WorkloadError, match=r"the model raised ValueError: bad shape \(line 4\) during forward"):
        w.run(model, inputs)


def test_get_model_that_raises_and_non_module(tmp_path):
    p = write(tmp_path, "gm.py", "def get_model():\n    return 1 / 0\ndef get_inputs():\n    return []\n")
    with pytest.raises(WorkloadError, match="get_model\\(\\) raised ZeroDivisionError"):
        load_workload(p).build("cpu")
    p = write(tmp_path, "nm.py", "def get_model():\n    return 3\ndef get_inputs():\n    return []\n")
    with pytest.raises(WorkloadError, match="must be a torch.nn.Module, got int"):
        load_workload(p).build("cpu")


def test_dtype_names():
    assert parse_dtype("bf16") is torch.bfloat16
    assert parse_dtype("float16") is torch.float16
    assert parse_dtype(None) is None
    with pytest.raises(ForgeError, match="unsupported dtype 'int8'"):
        parse_dtype("int8")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_requested_without_cuda():
    with pytest.raises(ForgeError, match="--device cuda was asked for, but this machine has no usable CUDA device"):
        resolve_device("cuda")
    assert resolve_device(None) == "cpu"
