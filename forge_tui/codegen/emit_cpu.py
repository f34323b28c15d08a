"""C++ for the cpu backend: OpenMP over rows (or over column blocks of rows when a pointwise
program has few), one inner loop over the columns per phase, ``omp simd`` where asked.

Sums accumulate in double (more exact than eager's fp32 cascade; within its tolerance either
way), amax/amin in float with a NaN flag (eager's max propagates NaN).
"""

from __future__ import annotations

from ..kernels.common import CPU_COMMON, HELPERS
from ..kernels.source import KernelFile
from .emit_common import NodeWriter, check_inputs
from .ir import Kernel

PRELUDE = CPU_COMMON + KernelFile(__package__, "cpu_prelude.h").section("head") + HELPERS


def emit_cpu(kern: Kernel, params: dict, card) -> str:
    """The candidate's source (without its header line). params: chunk (rows an OpenMP chunk),
    cblock (columns a block, 0 for whole rows; pointwise programs only), simd (0/1). A program
    with outputs of different sizes (``kern.more``) runs one loop nest a size, in turn."""
    w = NodeWriter(kern, "cpu", params.get("math", "eager"))
    ptrs = []
    for leaf in kern.leaves:
        ptrs.append(f"    const {w.types[leaf.dtype]}* __restrict__ p{leaf.index} = "
                    f"(const {w.types[leaf.dtype]}*)in[{leaf.index}].data; (void)p{leaf.index};")
    for k in kern.domains:
        for o in k.outputs:
            ptrs.append(f"    {w.types[o.dtype]}* __restrict__ q{o.index} = ({w.types[o.dtype]}*)out[{o.index}].data;")
    nests = "\n".join(_nest(k, params) for k in kern.domains)
    return PRELUDE + f'''
/* {kern.summary} */

FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {{
    {check_inputs(kern, card.inputs, card.outputs)}
{chr(10).join(ptrs)}
{nests}
    return 0;
}}
'''


def _nest(kern: Kernel, params: dict) -> str:
    """One domain's loops over its rows (and column blocks), in a scope of its own."""
    w = NodeWriter(kern, "cpu", params.get("math", "eager"))
    simd = "#pragma omp simd" if params.get("simd", 1) else ""
    body: list[str] = []
    done: set[int] = set()
    ind = "        "

    def row_nodes(roots: list[int]) -> None:
        for n in kern.needed(roots):
            node = kern.nodes[n]
            if n in done or node.varying:
                continue
            body.append(ind + w.stmt(node))
            done.add(n)

    def loop_nodes(roots: list[int], out: list[str]) -> None:
        for n in kern.needed(roots):
            node = kern.nodes[n]
            if n in done or not node.varying:
                continue
            out.append(ind + "    " + w.stmt(node))

    cblock = params.get("cblock", 0) if not kern.reductions else 0
    c_lo, c_hi = ("c_lo", "c_hi") if cblock else ("0", "COLS")
    for level in range(kern.levels):
        reds = [(k, r) for k, r in enumerate(kern.reductions) if r.level == level]
        row_nodes([r.body for _, r in reds])
        inner: list[str] = []
        loop_nodes([r.body for _, r in reds], inner)
        clauses = []
        sums = [k for k, r in reds if r.kind == "sum"]
        maxes = [k for k, r in reds if r.kind == "amax"]
        mins = [k for k, r in reds if r.kind == "amin"]
        for k, r in reds:
            if r.kind == "sum":
                body.append(ind + f"double acc{k} = 0.0;")
                inner.append(ind + f"    acc{k} += (double)t{r.body};")
            else:
                init = "-INFINITY" if r.kind == "amax" else "INFINITY"
                cmp = ">" if r.kind == "amax" else "<"
                body.append(ind + f"float acc{k} = {init}; int nan{k} = 0;")
                inner.append(ind + f"    acc{k} = t{r.body} {cmp} acc{k} ? t{r.body} : acc{k}; nan{k} |= (t{r.body} != t{r.body});")
        if sums:
            clauses.append("reduction(+:" + ", ".join(f"acc{k}" for k in sums) + ")")
        if maxes:
            clauses.append("reduction(max:" + ", ".join(f"acc{k}" for k in maxes) + ")")
        if mins:
            clauses.append("reduction(min:" + ", ".join(f"acc{k}" for k in mins) + ")")
        if maxes or mins:
            clauses.append("reduction(|:" + ", ".join(f"nan{k}" for k in maxes + mins) + ")")
        if simd:
            body.append(ind + simd + " " + " ".join(clauses))
        body.append(ind + f"for (int64_t c = {c_lo}; c < {c_hi}; ++c) {{")
        body.extend(inner)
        body.append(ind + "}")
        for k, r in reds:
            if r.kind == "sum":
                body.append(ind + f"const float red{k} = (float)acc{k};")
            else:
                body.append(ind + f"const float red{k} = nan{k} ? NAN : acc{k};")
    # outputs
    roots = [o.node for o in kern.outputs]
    row_nodes(roots)
    for o in kern.outputs:
        if o.per_row:
            body.append(ind + w.store(o.dtype, f"q{o.index}[{w.offset(o.offset)}]", f"t{o.node}"))
    full = [o for o in kern.outputs if not o.per_row]
    if full:
        inner = []
        loop_nodes([o.node for o in full], inner)
        for o in full:
            inner.append(ind + "    " + w.store(o.dtype, f"q{o.index}[{w.offset(o.offset)}]", f"t{o.node}"))
        if simd:
            body.append(ind + simd)
        body.append(ind + f"for (int64_t c = {c_lo}; c < {c_hi}; ++c) {{")
        body.extend(inner)
        body.append(ind + "}")

    decls = [ind + d for d in w.row_decls()]
    chunk = params.get("chunk", 1)
    if cblock:
        loop = f'''    const int64_t CB = (COLS + {cblock} - 1) / {cblock};
#pragma omp parallel for schedule(static, {chunk}) if(ROWS * COLS >= PARALLEL_MIN)
    for (int64_t blk = 0; blk < ROWS * CB; ++blk) {{
        const int64_t r = blk / CB;
        const int64_t c_lo = (blk % CB) * {cblock}, c_hi = c_lo + {cblock} < COLS ? c_lo + {cblock} : COLS;'''
    else:
        loop = f'''#pragma omp parallel for schedule(static, {chunk}) if(ROWS * COLS >= PARALLEL_MIN)
    for (int64_t r = 0; r < ROWS; ++r) {{'''
    return f'''    {{
    const int64_t ROWS = {kern.rows}, COLS = {kern.cols};
{loop}
{chr(10).join(decls)}
{chr(10).join(body)}
    }}
    }}'''
