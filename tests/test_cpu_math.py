"""The cpu backend's exp and tanh (kernels/cpu_common.h): branch-free so that kernels' loops
vectorise, and within 1 ulp of PyTorch's on a dense sweep, with libm's infinities, NaN, overflow
and underflow. Built with the evaluator's own g++ flags."""

import ctypes
import shutil
import subprocess

import pytest
import torch

from forge_tui.evaluator.build import Builder
from forge_tui.kernels.common import CPU_COMMON as COMMON

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")

LOOPS = r'''
extern "C" void run_exp(const float* x, float* y, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = expf(x[i]);
}
extern "C" void run_tanh(const float* x, float* y, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = tanhf(x[i]);
}
'''


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cpu-math")
    src = tmp / "math.cpp"
    src.write_text(COMMON + LOOPS)
    flags = Builder("cpu", tmp).flags()
    subprocess.run(["g++", *flags, str(src), "-o", str(tmp / "math.so")], check=True, capture_output=True, timeout=120)
    asm = subprocess.run(["g++", *[f for f in flags if f not in ("-shared", "-fPIC")], "-S", "-o", "-", str(src)],
                         check=True, capture_output=True, text=True, timeout=120).stdout
    return ctypes.CDLL(str(tmp / "math.so")), asm


def _run(lib, name, x):
    y = torch.empty_like(x)
    getattr(lib, name)(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()), ctypes.c_int64(x.numel()))
    return y


SPECIAL = [float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 88.72, 88.73, 89.5, -87.3, -103.9, -104.5, -200.0,
           1e-30, -1e-30, 1e-8, 0.624, 0.625, 0.626, 9.0, -9.0, 20.0, -20.0]


@pytest.mark.parametrize("name,ref", [("run_exp", torch.exp), ("run_tanh", torch.tanh)])
def test_within_one_ulp_of_pytorch_with_its_special_values(lib, name, ref):
    x = torch.cat([torch.linspace(-120.0, 100.0, 400_001), torch.randn(100_000, generator=torch.Generator().manual_seed(0)),
                   torch.tensor(SPECIAL)]).float().contiguous()
    y, r = _run(lib[0], name, x), ref(x)
    normal = torch.isfinite(r) & (r.abs() > torch.finfo(torch.float32).tiny)
    ulp = (y.view(torch.int32).long() - r.view(torch.int32).long()).abs()[normal]
    assert ulp.max().item() <= 1, x[normal][ulp.argmax()].item()
    rest = ~normal  # infinities, NaN, zeros, denormals: as PyTorch
    torch.testing.assert_close(y[rest], r[rest], rtol=0, atol=1e-44, equal_nan=True)
    assert torch.equal(torch.signbit(y[rest & (r == 0)]), torch.signbit(r[rest & (r == 0)]))


def test_kernel_loops_calling_them_vectorise(lib):
    """No call to libm's scalar expf/tanhf is left in the loops: they are inlined and vectorised."""
    asm = lib[1]
    assert "expf@" not in asm and "tanhf@" not in asm and "call\texpf" not in asm and "call\ttanhf" not in asm


def test_each_reference_program_has_a_source_file_of_its_own():
    """torch.compile (torch 2.11) traces a function whose source file it cannot find through one
    shared wrapper with 8 cached variants: the 9th program compiled in a process ran eager's code.
    Each program's source is registered under its own name, so inspect finds it."""
    import inspect

    from forge_tui.program import compile_source

    progs = [{"nodes": [{"op": "aten.mul.Tensor", "args": [{"$in": 0}, float(k)]}], "outputs": [{"$node": 0}]}
             for k in range(3)]
    fns = [compile_source(p, 1) for p in progs]
    files = [inspect.getsourcefile(f) for f in fns]
    assert None not in files and len(set(files)) == 3 and len({f.__code__ for f in fns}) == 3
    assert "aten.mul.Tensor" in inspect.getsource(fns[1]) and "1.0" in inspect.getsource(fns[1])
    assert [float(f(torch.ones(1), device="cpu")[0]) for f in fns] == [0.0, 1.0, 2.0]


def test_a_compile_that_ran_eagers_code_is_told():
    """Past Dynamo's recompile limit torch.compile runs the function's own code with a warning
    alone: the first call of a baseline says so, so that it is never timed as torch.compile's."""
    import torch._dynamo

    from forge_tui.program import NO_GRAPH, compile_source, first_compiled_call

    prog = {"nodes": [{"op": "aten.mul.Tensor", "args": [{"$in": 0}, 2.0]}], "outputs": [{"$node": 0}]}
    compiled = torch.compile(compile_source(prog, 1), dynamic=False)
    assert first_compiled_call(compiled, torch.ones(8), device="cpu") is None
    with torch._dynamo.config.patch(recompile_limit=1):  # a new shape: a variant it may not compile
        assert first_compiled_call(compiled, torch.ones(16), device="cpu") == NO_GRAPH
