"""What the generated CUDA kernels share: the prelude every kernel starts with, the vector-access
test, the kernel's parameters and pointer arguments, the alignment check and the entry point."""

from __future__ import annotations

from ...kernel_abi import ITEMSIZE
from ...kernels.common import CUDA_COMMON, FAST_HELPERS, HELPERS
from ...kernels.device import DeviceProps
from ...kernels.launch import cluster_config
from ...kernels.source import KernelFile
from ..emit_common import NodeWriter, check_inputs
from ..index import Atom, Index, to_c
from ..ir import Kernel

CUH = KernelFile(__package__, "prelude.cuh")
PRELUDE = CUDA_COMMON + CUH.section("head") + HELPERS + FAST_HELPERS + CUH.section("tail")
OPS = {"sum": 0, "amax": 1, "amin": 2}


def vec_ok(off: Index, vec: int) -> bool:
    """A contiguous run of ``vec`` elements along the row, starting on a multiple of ``vec``: the
    column part is ``c``, or ``c % m`` (m a multiple of vec) plus terms that do not change within
    an aligned run of vec columns (``(c / d) ...`` with d a multiple of vec, coefficients too: the
    channels-last group norm's ``c % 16 + 512 * (c / 16)``)."""
    row, col = off.split("c")
    if col.is_var("c"):
        return row.coefs_divisible(vec)
    inner = [(k, a) for k, a in col.terms if isinstance(a, Atom) and a.div == 1]
    if len(inner) != 1 or inner[0][0] != 1 or inner[0][1].mod is None or inner[0][1].mod % vec:
        return False
    rest = [t for t in col.terms if t != inner[0]]
    return row.coefs_divisible(vec) and all(isinstance(a, Atom) and a.div % vec == 0 and k % vec == 0
                                            for k, a in rest)


def col0(off: Index) -> str:
    """The column part of a ``vec_ok`` offset at the run's first column ``c0``."""
    _, col = off.split("c")
    if col.is_var("c"):
        return "c0"
    terms = [(k, a) for k, a in col.terms if isinstance(a, Atom)]
    assert len(terms) == len(col.terms), "vec_ok offsets are atoms of c"
    return to_c(Index(col.const, tuple((k, Atom("c0", a.div, a.mod)) for k, a in terms)))


def kernel_args(kern: Kernel, w: NodeWriter) -> tuple[str, str]:
    params, args = [], []
    for leaf in kern.leaves:
        t = w.types[leaf.dtype]
        params.append(f"const {t}* __restrict__ p{leaf.index}")
        args.append(f"(const {t}*)in[{leaf.index}].data")
    for o in sorted((o for d in kern.domains for o in d.outputs), key=lambda o: o.index):
        t = w.types[o.dtype]
        params.append(f"{t}* __restrict__ q{o.index}")
        args.append(f"({t}*)out[{o.index}].data")
    return ", ".join(params), ", ".join(args)


def aligned_check(kern: Kernel, vec: int, vec_loads: list, vec_outs: list) -> str:
    conds = []
    for n in vec_loads:
        k = n.attr[0]
        conds.append(f"forge_aligned(in[{k}].data, {vec * ITEMSIZE[kern.leaves[k].dtype]})")
    for o in vec_outs:
        conds.append(f"forge_aligned(out[{o.index}].data, {vec * ITEMSIZE[o.dtype]})")
    return " && ".join(sorted(set(conds))) or "true"


def launcher(kern: Kernel, card, launches: str) -> str:
    """forge_launch: the inputs checked against the card, then ``launches`` on the caller's stream
    (``s``), then the launch error, if any."""
    return f"""FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {{
    {check_inputs(kern, card.inputs, card.outputs)}
    cudaStream_t s = (cudaStream_t)stream;
{launches}    return (int)cudaGetLastError();
}}"""


def cluster_launch(kernel: str, rows: int, split: int, args: str) -> str:
    """Host code launching ``kernel`` on stream ``s`` as one cluster of ``split`` blocks a row."""
    return (cluster_config(kernel, split, str(rows * split), "TPR * RPB", 0) +
            f"        cudaError_t e = cudaLaunchKernelEx(&cfg, {kernel}, {args});\n"
            "        if (e != cudaSuccess) return (int)e;\n")


def resident_blocks(threads: int, device: DeviceProps) -> int:
    """Blocks of ``threads`` an SM holds at once, as the "waves" grid counts them (at most 32,
    the hardware's limit of resident blocks)."""
    return max(1, min(32, device.max_threads_per_sm // threads))

