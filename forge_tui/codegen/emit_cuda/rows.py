"""Programs with reductions, a block per RPB rows (or a persistent grid of waves, or a cluster a
row): one phase a reduction level, then the output phase."""

from __future__ import annotations

import re

from ...kernel_abi import ITEMSIZE
from ...kernels.device import DeviceProps
from ..emit_common import NodeWriter
from ..ir import Kernel
from .common import OPS, PRELUDE, aligned_check, cluster_launch, col0, kernel_args, launcher, resident_blocks, vec_ok
from .plan import cached_loads, carries, carry_plan, loop_nodes


def emit_rows(kern: Kernel, p: dict, card, device: DeviceProps) -> str:
    w = NodeWriter(kern, "cuda", p.get("math", "eager"))
    tpr, rpb, vec, cache = p["tpr"], p["rpb"], p["vec"], p["cache"]
    split = p.get("split", 1)
    assert split == 1 or (rpb == 1 and p.get("grid", "rows") == "rows" and cache != "smem"), p
    cols = kern.cols
    ind = "        "
    carry = carry_plan(kern) if carries(kern, cache) else None
    cached = carry.loads if carry else cached_loads(kern)
    if cache == "smem":
        cached = [n for n in cached if vec_ok(kern.nodes[n].attr[1], vec)]
    elif cache == "none":
        cached = []
    body: list[str] = []
    done: set[int] = set()
    filled: set[int] = set()
    smem_off: dict[int, int] = {}
    off = 0
    for n in cached:
        if cache == "smem":
            smem_off[n] = off
            off += -(-rpb * cols * ITEMSIZE[kern.nodes[n].dtype] // 16) * 16
    if cache == "regs":
        for n in cached:
            body.append(ind + f"float cache{n}[NV][VEC];")
        for n in sorted(n for ph in carry.keep for n in ph) if carry else []:
            body.append(ind + f"{w.vtype(kern.nodes[n])} keep{n}[NV][VEC];")
    for n in cached if cache == "smem" else []:
        t = w.types[kern.nodes[n].dtype]
        body.append(ind + f"{t}* sm{n} = ({t}*)(fg_smem + {smem_off[n]}) + (int64_t)slot * COLS;")
    cuts = [len(body)]  # where the body's stages end: each is written for every row of a thread in turn

    def row_nodes(roots: list[int]) -> None:
        for n in kern.needed(roots):
            if n in done or kern.nodes[n].varying:
                continue
            body.append(ind + w.stmt(kern.nodes[n]))
            done.add(n)

    def loop(phase: int, roots: list[int], tail: list[str], guard: str, head: list[str] | None = None,
             post: list[str] | None = None) -> list[str]:
        """Loop ``phase`` over this thread's columns, computing ``roots``, then ``tail`` per
        element; ``head`` and ``post`` go before and after the loop over a vector's elements."""
        need = carry.need[phase] if carry else loop_nodes(kern, roots)
        kept = {n for ph in carry.keep[:phase] for n in ph} if carry else set()
        keeps = set(carry.keep[phase]) if carry else set()
        out: list[str] = []
        if cache == "regs":
            out += [ind + "#pragma unroll", ind + "for (int k = 0; k < NV; ++k) {",
                    ind + "    const int c0 = ((k * SPLIT + rank) * TPR + t) * VEC;", ind + f"    if ({guard}c0 < COLS) {{"]
        else:
            out += [ind + "for (int c0 = (rank * TPR + t) * VEC; c0 < COLS; c0 += SPLIT * TPR * VEC) {",
                    ind + f"    if ({guard}true) {{"]
        pre, inner = [], []
        sub = {}
        for n in need:
            node = kern.nodes[n]
            if node.op != "load":
                continue
            k, offs = node.attr
            lt = w.types[kern.leaves[k].dtype]
            row, _ = offs.split("c")
            is_vec = node.kind == "f" and vec_ok(offs, vec)
            src = f"p{k} + {w.row_name(row)} + {col0(offs) if is_vec else 'c0'}"
            if n in cached and cache == "regs":
                if n not in filled:
                    if is_vec:
                        pre.append(f"load_vec<{lt}, VEC>({src}, cache{n}[k]);")
                    else:
                        pre.append("#pragma unroll")
                        pre.append(f"for (int j = 0; j < VEC; ++j) {{ const int64_t c = c0 + j; "
                                   f"cache{n}[k][j] = {w.load_expr(node)}; }}")
                sub[n] = f"cache{n}[k][j]"
            elif n in cached and cache == "smem":
                if n not in filled:
                    pre.append(f"Vec<{lt}, VEC> raw{n} = *reinterpret_cast<const Vec<{lt}, VEC>*>({src});")
                    pre.append(f"*reinterpret_cast<Vec<{lt}, VEC>*>(sm{n} + c0) = raw{n};")
                else:
                    pre.append(f"Vec<{lt}, VEC> raw{n} = *reinterpret_cast<const Vec<{lt}, VEC>*>(sm{n} + c0);")
                pre.append(f"float v{n}[VEC]; fg_vec_to_f<{lt}, VEC>(raw{n}, v{n});")
                sub[n] = f"v{n}[j]"
            elif is_vec:
                pre.append(f"float v{n}[VEC]; load_vec<{lt}, VEC>({src}, v{n});")
                sub[n] = f"v{n}[j]"
        filled.update(n for n in need if n in cached)
        for n in need:
            inner.append(w.stmt(kern.nodes[n], f"keep{n}[k][j]" if n in kept else sub.get(n)))
            if n in keeps:
                inner.append(f"keep{n}[k][j] = t{n};")
        inner += tail
        out += [ind + "        " + s for s in pre + (head or [])]
        out += [ind + "        #pragma unroll", ind + "        for (int j = 0; j < VEC; ++j) {",
                ind + "            const int64_t c = c0 + j;", ind + "            (void)c;"]
        out += [ind + "            " + s for s in inner]
        out += [ind + "        }"] + [ind + "        " + s for s in post or []] + [ind + "    }", ind + "}"]
        return out

    for level in range(kern.levels):
        reds = [(k, r) for k, r in enumerate(kern.reductions) if r.level == level]
        row_nodes([r.body for _, r in reds])
        tail = []
        for k, r in reds:
            body.append(ind + f"float acc{k} = fg_ident<{OPS[r.kind]}>();")
            tail.append(f"acc{k} = fg_comb<{OPS[r.kind]}>(acc{k}, t{r.body});")
        body += loop(level, [r.body for _, r in reds], tail, "")
        cuts.append(len(body))
        if split == 1:
            for k, r in reds:
                body.append(ind + f"const float red{k} = fg_row_reduce<TPR, {OPS[r.kind]}>(acc{k}, fg_scratch);")
            cuts.append(len(body))
            continue
        # the row's blocks: each one's partial result in its slot, then every slot in rank order
        for k, r in reds:
            body.append(ind + f"const float part{k} = fg_row_reduce<TPR, {OPS[r.kind]}>(acc{k}, fg_scratch);")
        body.append(ind + "if (threadIdx.x == 0) {")
        body += [ind + f"    fg_part[{k}] = part{k};" for k, _ in reds]
        body += [ind + "}", ind + "fg_cluster_sync();"]
        for k, r in reds:
            body.append(ind + f"const float red{k} = fg_cluster_comb<{OPS[r.kind]}>(&fg_part[{k}], SPLIT);")
    if split > 1:
        body.append(ind + "fg_cluster_sync();  // no block leaves while another still reads its slots")
    roots = [o.node for o in kern.outputs]
    row_nodes(roots)
    row_outs = [o for o in kern.outputs if o.per_row]
    if row_outs:
        body.append(ind + "if (live && t == 0 && rank == 0) {")
        for o in row_outs:
            body.append(ind + "    " + w.store(o.dtype, f"q{o.index}[{w.offset(o.offset)}]", f"t{o.node}"))
        body.append(ind + "}")
    full = [o for o in kern.outputs if not o.per_row]
    vouts = []
    if full:
        tail = []
        for o in full:
            if o.dtype in ("float32", "float16", "bfloat16") and vec_ok(o.offset, vec):
                vouts.append(o)
                tail.append(f"o{o.index}[j] = t{o.node};")
            else:
                tail.append(w.store(o.dtype, f"q{o.index}[{w.offset(o.offset)}]", f"t{o.node}"))
        # vector outputs: an array before the element loop, one store after it
        head = [f"float o{o.index}[VEC];" for o in vouts]
        stores = [f"store_vec<{w.types[o.dtype]}, VEC>(q{o.index} + {w.row_name(o.offset.split('c')[0])} + "
                  f"{col0(o.offset)}, o{o.index});"
                  for o in vouts]
        body += loop(kern.levels, [o.node for o in full], tail, "live && ", head, stores)
    rpt = p.get("rpt", 1)
    assert rpt == 1 or (split == 1 and cache != "smem"), p
    head = ["const int64_t rr = g * RPB + slot;" if rpt == 1 else "const int64_t rr = (g * RPT + I) * RPB + slot;"]
    if rpt == 1 or kern.rows % (rpb * rpt):
        head += ["const bool live = rr < ROWS;", "const int64_t r = live ? rr : ROWS - 1;", "(void)live;"]
    else:
        # several rows a thread, every group whole: every row is live, no row clamped, which
        # keeps ptxas's register count at several rows a thread near one row's (a per-row
        # liveness flag and clamp more than double it); at one row a thread the flag and clamp
        # cost few registers, so that case keeps them
        head += ["const bool live = ROWS > 0;  // every group is whole", "const int64_t r = rr;", "(void)live;"]
    stages = [[ind + x for x in head] + [ind + d for d in w.row_decls()] + body[:cuts[0]]]
    stages += [body[a:b] for a, b in zip(cuts, cuts[1:] + [len(body)])]
    body = [line for stage in stages for i in range(rpt) for line in _row_copy(stage, i, rpt)]
    params_c, args_c = kernel_args(kern, w)
    groups = -(-kern.rows // (rpb * rpt))
    cap = device.sms * resident_blocks(tpr * rpb, device)
    # the grid in C over GROUPS, which a range card's source takes at run time (codegen/ranged.py)
    grid = "(unsigned)GROUPS" if p.get("grid", "rows") == "rows" else f"(unsigned)(GROUPS < {cap} ? GROUPS : {cap})"
    nv = -(-cols // (tpr * vec * split))
    nv1 = -(-cols // (tpr * split))
    smem = off
    vec_loads = [kern.nodes[n] for n in set(loop_nodes(kern, [r.body for r in kern.reductions] + roots))
                 if kern.nodes[n].op == "load" and kern.nodes[n].kind == "f" and vec_ok(kern.nodes[n].attr[1], vec)]
    aligned = aligned_check(kern, vec, vec_loads, vouts)
    setattr_ = ""
    if smem > 48 * 1024:
        setattr_ = (f"    cudaFuncSetAttribute(fg_kernel<{vec}, {nv}>, cudaFuncAttributeMaxDynamicSharedMemorySize, {smem});\n"
                    f"    cudaFuncSetAttribute(fg_kernel<1, {nv1}>, cudaFuncAttributeMaxDynamicSharedMemorySize, {smem});\n")
    nl = "\n"
    extern = "    extern __shared__ __align__(16) unsigned char fg_smem[];\n" if cache == "smem" and smem else ""
    if split == 1:
        launches = f"""{setattr_}    if ({aligned}) fg_kernel<{vec}, {nv}><<<{grid}, TPR * RPB, {smem}, s>>>({args_c});
    else fg_kernel<1, {nv1}><<<{grid}, TPR * RPB, {smem}, s>>>({args_c});
"""
    else:
        launches = (f"    if ({aligned}) {{\n{cluster_launch(f'fg_kernel<{vec}, {nv}>', groups, split, args_c)}    }} else {{\n"
                    f"{cluster_launch(f'fg_kernel<1, {nv1}>', groups, split, args_c)}    }}\n")
    parts = f"    __shared__ float fg_part[{max(1, len(kern.reductions))}];\n" if split > 1 else ""
    rows_note = f", {rpt} rows a thread" if rpt > 1 else ""
    return PRELUDE + f'''
/* {kern.summary}; {tpr} threads a row, {rpb} rows a block, {split} blocks a row, cache {cache}{rows_note} */
static const int64_t ROWS = {kern.rows};
static const int64_t GROUPS = (ROWS + {rpb * rpt - 1}) / {rpb * rpt};
static const int COLS = {cols};
#define TPR {tpr}
#define RPB {rpb}
#define RPT {rpt}
#define SPLIT {split}

template <int VEC, int NV>
__global__ void __launch_bounds__(TPR * RPB) fg_kernel({params_c}) {{
    __shared__ float fg_scratch[RPB * (TPR > 32 ? TPR / 32 : 1)];
{parts}{extern}    const int t = threadIdx.x % TPR;
    const int slot = threadIdx.x / TPR;
    const int rank = SPLIT > 1 ? (int)(blockIdx.x % SPLIT) : 0;
    (void)rank;
    for (int64_t g = blockIdx.x / SPLIT; g < GROUPS; g += gridDim.x / SPLIT) {{
{nl.join(body)}
    }}
}}

{launcher(kern, card, launches)}
'''


_ROW_NAMES = re.compile(r"\b(I|r|rr|live|(?:ro|acc|red|part|keep|cache|t|v|o|raw|sm)\d+)\b")


def _row_copy(lines: list[str], i: int, rpt: int) -> list[str]:
    """A stage of the rows kernel's body for a thread's ``i``-th row of ``rpt``: the row's own
    names (its index, offsets, accumulators, values and register arrays) suffixed, so that the
    rows' copies of a stage sit side by side (all rows' loads before any row's reduction)."""
    if rpt == 1:
        return lines
    return [_ROW_NAMES.sub(lambda m: str(i) if m.group(1) == "I" else f"{m.group(1)}_{i}", x) for x in lines]

