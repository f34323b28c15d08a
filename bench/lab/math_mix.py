"""Asks: why does the generated bf16 NewGELU kernel reach only 45% of a copy on the H200 (36.8 µs
against torch.compile's 19.6, 2026-12-05), and what would the ``math`` axis buy? Renders the
generated kernel of a few half-precision pointwise modules in each ``math`` mode, compiles them
for sm_90 and counts the SASS instructions of the vectorised kernel by kind, per element.

    python bench/lab/math_mix.py [--nvdisasm PATH] [--arch sm_90]

Needs nvcc, and nvdisasm (or cuobjdump) on PATH or given: this machine's CUDA 13.0 has neither;
the ``nvidia-cuda-nvdisasm`` wheel holds one (``pip download --no-deps nvidia-cuda-nvdisasm``,
unzip, ``nvidia/cu13/bin/nvdisasm``).

Answer (2026-12-05, nvcc 13.0 and nvdisasm 13.5 on the development machine, NewGELU bf16
4x64x3072, VEC 8, instructions an element): eager's rounding at each of its eight ops cost 8 F2F
conversions and its ``tanhf`` 2 MUFU, 44.6 instructions in all; F2F and MUFU share the SM's
quarter-rate pipe (16 a clock), so 10 of them an element cap the kernel near 4 bytes x 132 x 16
x 1.98 GHz / 10 = 1.7 TB/s, about 40% of a copy, where it ran (45%). The output was rounded
twice (its op, then the store): since dropped, eager 42.6 (7 F2F); ``fp32`` (the output only,
as inductor; the cube's rounding is an op's, not the model's cast) 27.6 (no F2F, 2 MUFU); ``fast``
(also ``tanh.approx``) 13.4 (1 MUFU). QuickGELU eager / fp32 / fast: 42.1 / 38.6 / 14.4; the GELU
gate: 32.5 / 30.5 / 16.2.
"""

from __future__ import annotations

import argparse
import math
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

QUARTER = ("F2F", "MUFU")


def _cases():
    import torch
    import torch.nn.functional as F

    def new_gelu(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

    def quick_gelu(x):
        return x * torch.sigmoid(1.702 * x)

    def gelu_gate(a, b):
        return F.gelu(a, approximate="tanh") * b

    x = torch.randn(4, 64, 3072, dtype=torch.bfloat16)
    return [("NewGELU", new_gelu, (x,)), ("QuickGELU", quick_gelu, (x,)), ("GeluGate", gelu_gate, (x, x.clone()))]


def _card(fn, inputs, name):
    """The module card of ``fn`` (``funcards.reference_module``: a leaf module the profiler makes a
    card of), captured on ``inputs``."""
    import torch

    from forge_tui.cards import Card
    from forge_tui.config import ForgeConfig
    from forge_tui.funcards import reference_module
    from forge_tui.profiler.capture import CaptureOptions, Recorder

    model = reference_module(fn, name)
    rec = Recorder(model, CaptureOptions(ForgeConfig().profile))
    with torch.no_grad():
        rec.run(lambda: model(*inputs))
    b = next(b for b in rec.buckets.values() if b.kind == "module")
    return Card(id="c", kind="module", target=b.target, label="", inputs=b.inputs, outputs=b.outputs,
                program=b.program)


def _disassembler(given: str | None) -> list[str]:
    for tool in ([given] if given else []) + ["nvdisasm", "cuobjdump"]:
        path = shutil.which(tool) if tool and not Path(tool).exists() else tool
        if path:
            return [path] if Path(path).name.startswith("nvdisasm") else [path, "-sass"]
    raise SystemExit("math_mix: no nvdisasm or cuobjdump (see --nvdisasm)")


def opcode_counts(sass: str, vec: int) -> Counter | None:
    """Opcodes of the kernel the launcher runs on aligned tensors (``fg_kernel<VEC, ...>``) in a
    disassembly, nvdisasm's (from the kernel's ``<name>:`` label to the next section) or
    ``cuobjdump -sass``'s (a ``Function : <name>`` block), NOPs included; None where the kernel is
    not in it."""
    start = re.search(rf"Function : _Z\d+fg_kernelILi{vec}E\w*|_Z\d+fg_kernelILi{vec}E\w*:", sass)
    if start is None:
        return None
    body = re.split(r"\.section|\n\s*Function : ", sass[start.end():], maxsplit=1)[0]
    return Counter(re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", body))


def _mix(src: str, arch: str, dis: list[str], vec: int, tmp: Path) -> Counter:
    cu, cubin = tmp / "k.cu", tmp / "k.cubin"
    cu.write_text(src)
    subprocess.run(["nvcc", f"-arch={arch}", "-O3", "-cubin", "-I", str(ROOT / "forge_tui" / "abi"), "-o", str(cubin),
                    str(cu)], check=True, capture_output=True, text=True)
    ops = opcode_counts(subprocess.run([*dis, str(cubin)], check=True, capture_output=True, text=True).stdout, vec)
    assert ops is not None, f"no fg_kernel<{vec}> in the disassembly"
    return Counter({op: n for op, n in ops.items() if op != "NOP"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nvdisasm", help="nvdisasm or cuobjdump to use")
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()
    dis = _disassembler(args.nvdisasm)
    from forge_tui.codegen import Generated

    gen = Generated()
    print(f"{'module':10} {'math':6} {'instr/el':>8} {'F2F/el':>7} {'MUFU/el':>7}")
    with tempfile.TemporaryDirectory() as d:
        for name, fn, inputs in _cases():
            m = gen.match(_card(fn, inputs, name))
            assert m is not None, name
            first = gen.initial(m, "cuda")
            for mode in gen.axes(m, "cuda").get("math", ["eager"]):
                c = _mix(gen.render(m, {**first, "math": mode}, "cuda"), args.arch, dis, first["vec"], Path(d))
                per = first["vec"]
                print(f"{name:10} {mode:6} {sum(c.values()) / per:8.1f} {c['F2F'] / per:7.1f} {c['MUFU'] / per:7.1f}")


if __name__ == "__main__":
    main()
