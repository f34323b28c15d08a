"""Rows interleaved in memory (a channels-last group norm's groups), walked in memory order by a
cooperative grid: the layout, the steps and shared memory of a tiles grid, and its kernel."""

from __future__ import annotations

from dataclasses import dataclass

from ...kernel_abi import ITEMSIZE
from ...kernels.device import DeviceProps
from ...kernels.launch import workspace_entry
from ..emit_common import NodeWriter, check_inputs
from ..index import Atom, Index, Space
from ..ir import FLOATS, Kernel
from .common import CUH, OPS, PRELUDE, aligned_check, col0, kernel_args
from .plan import cached_loads, loop_nodes

TILE_HELPERS = CUH.section("tiles")



@dataclass(frozen=True)
class TileLayout:
    """Rows interleaved in memory: row ``r``'s column ``c`` at ``RL * r + c % RL + PER * (c / RL)``
    (runs of RL elements, the rows' runs side by side, PER = RL x rows elements a period): a
    channels-last group norm's groups (RL channels a group, a period a pixel, PER channels). Walked
    in memory order, flat position ``m`` is row ``(m / RL) % rows``, column ``m % RL + RL * (m / PER)``.
    Outputs either follow the same layout or are its transpose, row-major in (row, c % RL, c / RL)
    (``trans``: the channels-last input's group norm written in NCHW)."""

    rl: int
    per: int
    ref: Index
    """The offset of the accesses that follow the layout."""
    trans: Index
    """The offset, in the same (r, c), of the transposed layout."""
    transposed: bool
    """Whether some full output is written in the transposed layout."""


def tile_layout(kern: Kernel) -> TileLayout | None:
    """The interleaved layout of the kernel's full outputs or, failing that, of a varying float
    load, with every full output in it or in its transpose (see TileLayout); None otherwise."""
    hit = kern.memo.get("tiles", False)
    if hit is False:
        hit = kern.memo["tiles"] = _tile_layout(kern)
    return hit


def _parse_interleaved(kern: Kernel, off: Index) -> int | None:
    """RL where ``off`` is ``RL * r + c % RL + RL * rows * (c / RL)``."""
    row, col = off.split("c")
    if row.const or col.const or len(row.terms) != 1:
        return None
    rl, a = row.terms[0]
    if not (isinstance(a, Atom) and a == Atom("r")):
        return None
    per = rl * kern.rows
    want = {(per, Atom("c", rl, None))} | ({(1, Atom("c", 1, rl))} if rl > 1 else set())
    if set(col.terms) != want or kern.cols % rl or kern.cols // rl < 2:
        return None
    return rl


def _tile_layout(kern: Kernel) -> TileLayout | None:
    full = [o for o in kern.outputs if not o.per_row]
    if not full or not kern.reductions or kern.rows < 2:
        return None
    cands = [o.offset for o in full] + [n.attr[1] for n in kern.loads() if n.varying and n.kind == "f"]
    for ref in cands:
        rl = _parse_interleaved(kern, ref)
        if rl is None:
            continue
        sp = Space({"r": kern.rows, "c": kern.cols})
        r, c = sp.var("r"), sp.var("c")
        trans = sp.add(sp.scale(r, kern.cols), sp.scale(sp.mod(c, rl), kern.cols // rl), sp.floordiv(c, rl))
        if trans == ref or not all(o.offset in (ref, trans) for o in full):
            return None
        return TileLayout(rl, rl * kern.rows, ref, trans, any(o.offset == trans for o in full))
    return None


def tile_steps(kern: Kernel, threads: int, vec: int, blocks: int) -> int:
    """Runs of ``threads x vec`` elements each block of a tiles grid of ``blocks`` walks."""
    return -(-kern.rows * kern.cols // (blocks * threads * vec))


def tile_cached(kern: Kernel, cache: str) -> list[int]:
    """The loads a tiles kernel keeps between its phases: those read in more than one phase that
    follow the layout (the others are read where they are used)."""
    lay = tile_layout(kern)
    if cache == "none" or lay is None:
        return []
    return [n for n in cached_loads(kern) if kern.nodes[n].attr[1] == lay.ref]


def tile_smem(kern: Kernel, cache: str, threads: int, vec: int, blocks: int) -> dict[int, int]:
    """Where a tiles kernel keeps each cached load's chunk in dynamic shared memory (cache
    ``smem``: byte offsets, each region rounded to 16 bytes); the total under key -1."""
    out: dict[int, int] = {}
    off = 0
    if cache == "smem":
        nstep = tile_steps(kern, threads, vec, blocks)
        for n in tile_cached(kern, cache):
            out[n] = off
            off += -(-nstep * threads * vec * ITEMSIZE[kern.nodes[n].dtype] // 16) * 16
    out[-1] = off
    return out


def emit_tiles(kern: Kernel, p: dict, card, device: DeviceProps) -> str:
    """A cooperative grid of ``bps`` blocks an SM, each block a contiguous chunk of NSTEP runs of
    ``tpr x vec`` elements in memory order, each run whole periods, so that every thread's
    elements are of one row. A reduction level sums each thread's share, then the block's share
    of every row (shared memory, in thread order), then every block's (partial results in a
    stream-ordered workspace, a grid barrier, summed in block order by every block alike).
    Outputs in the layout are written where the elements were read; transposed outputs from the
    block's chunk in shared memory (or re-read), a thread a channel's run of pixels."""
    lay = tile_layout(kern)
    assert lay is not None and p.get("split", 1) == 1 and p.get("rpb", 1) == 1, p
    w = NodeWriter(kern, "cuda", p.get("math", "eager"))
    threads, vec, cache = p["tpr"], p["vec"], p["cache"]
    blocks = device.sms * p.get("bps", 1)
    nstep = tile_steps(kern, threads, vec, blocks)
    nred = len(kern.reductions)
    cached = tile_cached(kern, cache)
    ind = "    "
    body: list[str] = []
    done: set[int] = set()
    filled: set[int] = set()
    smem_of = tile_smem(kern, cache, threads, vec, blocks)
    for n in cached:
        t_ = w.types[kern.nodes[n].dtype]
        if cache == "regs":
            body.append(ind + f"float cache{n}[NSTEP][VEC];")
        else:
            body.append(ind + f"{t_}* sm{n} = ({t_}*)(fg_smem + {smem_of[n]});")

    def row_nodes(roots: list[int], out: list[str], seen: set[int]) -> None:
        for n in kern.needed(roots):
            if n in seen or kern.nodes[n].varying:
                continue
            out.append(ind + w.stmt(kern.nodes[n]))
            seen.add(n)

    def is_ref_load(node) -> bool:
        return node.op == "load" and node.kind == "f" and node.attr[1] == lay.ref

    def loop(roots: list[int], tail: list[str], head: list[str], post: list[str]) -> list[str]:
        need = loop_nodes(kern, roots)
        out = [ind + ("#pragma unroll" if cache == "regs" else "#pragma unroll 8"), ind + "for (int s = 0; s < NSTEP; ++s) {",
               ind + "    const int64_t m0 = (((int64_t)blockIdx.x * NSTEP + s) * TPB + t) * VEC;",
               ind + "    if (m0 < NUMEL) {"]
        pre, inner = [], []
        sub = {}
        for n in need:
            node = kern.nodes[n]
            if not is_ref_load(node):
                continue  # other loads are read where they are used, at their own offset of (r, c)
            k = node.attr[0]
            lt = w.types[kern.leaves[k].dtype]
            if n in cached and n in filled:
                if cache == "regs":
                    sub[n] = f"cache{n}[s][j]"
                    continue
                pre.append(f"float v{n}[VEC]; fg_vec_to_f<{lt}, VEC>(*reinterpret_cast<const Vec<{lt}, VEC>*>"
                           f"(sm{n} + (s * TPB + t) * VEC), v{n});")
            elif n in cached and cache == "regs":
                pre.append(f"fg_vec_to_f<{lt}, VEC>(fg_raw<{lt}, VEC, AL>(p{k} + m0), cache{n}[s]);")
                sub[n] = f"cache{n}[s][j]"
                continue
            elif n in cached:
                pre.append(f"const Vec<{lt}, VEC> raw{n} = fg_raw<{lt}, VEC, AL>(p{k} + m0);")
                pre.append(f"*reinterpret_cast<Vec<{lt}, VEC>*>(sm{n} + (s * TPB + t) * VEC) = raw{n};")
                pre.append(f"float v{n}[VEC]; fg_vec_to_f<{lt}, VEC>(raw{n}, v{n});")
            else:
                pre.append(f"float v{n}[VEC]; fg_vec_to_f<{lt}, VEC>(fg_raw<{lt}, VEC, AL>(p{k} + m0), v{n});")
            sub[n] = f"v{n}[j]"
        filled.update(n for n in need if n in cached)
        for n in need:
            inner.append(w.stmt(kern.nodes[n], sub.get(n)))
        inner += tail
        out += [ind + "        " + s for s in pre + head]
        out += [ind + "        #pragma unroll", ind + "        for (int j = 0; j < VEC; ++j) {",
                ind + "            const int64_t m = m0 + j;",
                ind + "            const int64_t c = m % RL + RL * (m / PER);",
                ind + "            (void)c;"]
        out += [ind + "            " + s for s in inner]
        out += [ind + "        }"] + [ind + "        " + s for s in post] + [ind + "    }", ind + "}"]
        return out

    for level in range(kern.levels):
        reds = [(k, r) for k, r in enumerate(kern.reductions) if r.level == level]
        row_nodes([r.body for _, r in reds], body, done)
        tail = []
        for k, r in reds:
            body.append(ind + f"float acc{k} = fg_ident<{OPS[r.kind]}>();")
            tail.append(f"acc{k} = fg_comb<{OPS[r.kind]}>(acc{k}, t{r.body});")
        body += loop([r.body for _, r in reds], tail, [], [])
        for k, r in reds:  # the block's share of each row, then the grid's
            body.append(ind + f"fg_tile_block<{OPS[r.kind]}>(acc{k}, fg_red, fg_ws + (int64_t){k} * BLOCKS * NR);")
        body.append(ind + "cooperative_groups::this_grid().sync();")
        for k, r in reds:
            body.append(ind + f"fg_tile_grid<{OPS[r.kind]}>(fg_ws + (int64_t){k} * BLOCKS * NR, fg_red, fg_tot[{k}]);")
            body.append(ind + f"const float red{k} = fg_tot[{k}][r];")
    full = [o for o in kern.outputs if not o.per_row]
    shared_rows: list[int] = []
    if not lay.transposed:
        row_nodes([o.node for o in full], body, done)
        tail, head, post = [], [], []
        for o in full:
            if o.dtype in FLOATS:
                head.append(f"float o{o.index}[VEC];")
                tail.append(f"o{o.index}[j] = t{o.node};")
                post.append(f"fg_st<{w.types[o.dtype]}, VEC, AL>(q{o.index} + m0, o{o.index});")
            else:
                tail.append(w.store(o.dtype, f"q{o.index}[m]", f"t{o.node}"))
        body += loop([o.node for o in full], tail, head, post)
    else:
        body += _tiles_transposed(kern, w, lay, full, cached, cache, ind, shared_rows)
    row_outs = [o for o in kern.outputs if o.per_row]
    scope: list[str] = []
    if row_outs or shared_rows:  # row values: thread q of the block for row q
        row_nodes([o.node for o in row_outs] + shared_rows, scope, set())
        for n in shared_rows:
            scope.append(ind + f"fg_row{n}[r] = t{n};")
        for o in row_outs:
            scope.append(ind + "if (blockIdx.x == 0) " + w.store(o.dtype, f"q{o.index}[{w.offset(o.offset)}]", f"t{o.node}"))
    decls = [ind + d for d in w.row_decls()]
    head_scope: list[str] = []
    if scope:
        head_scope += [ind + "if (t < NR) {", ind + "    const int64_t r = t;"]
        head_scope += ["    " + d for d in decls]
        head_scope += [ind + f"    const float red{k} = fg_tot[{k}][r];" for k in range(nred)]
        head_scope += ["    " + s for s in scope] + [ind + "}"]
        if shared_rows:
            head_scope.append(ind + "__syncthreads();")
    if shared_rows:  # the transposed phase reads them: computed before it
        at = body.index(ind + "/* the transposed outputs */")
        body[at:at] = head_scope
    else:
        body += head_scope
    row_smem = "".join(f"    __shared__ {w.vtype(kern.nodes[n])} fg_row{n}[NR];\n" for n in shared_rows)
    params_c, args_c = kernel_args(kern, w)
    vloads = [kern.nodes[n] for n in set(loop_nodes(kern, [r.body for r in kern.reductions] + [o.node for o in full]))
              if is_ref_load(kern.nodes[n])]
    aligned = aligned_check(kern, vec, vloads, [o for o in full if o.dtype in FLOATS])
    smem = smem_of[-1]
    nl = "\n"
    extern = "    extern __shared__ __align__(16) unsigned char fg_smem[];\n" if smem else ""

    def launch(al: str) -> str:
        kn = f"fg_kernel<{al}>"
        return (f"        cudaFuncSetAttribute({kn}, cudaFuncAttributeMaxDynamicSharedMemorySize, {smem});\n"
                "        cudaLaunchAttribute attr[1];\n"
                "        attr[0].id = cudaLaunchAttributeCooperative;\n"
                "        attr[0].val.cooperative = 1;\n"
                "        cudaLaunchConfig_t cfg = {};\n"
                "        cfg.gridDim = dim3(BLOCKS);\n"
                "        cfg.blockDim = dim3(TPB);\n"
                f"        cfg.dynamicSmemBytes = {smem};\n"
                "        cfg.stream = s;\n"
                "        cfg.attrs = attr;\n"
                "        cfg.numAttrs = 1;\n"
                f"        e = cudaLaunchKernelEx(&cfg, {kn}, {args_c}, ws);\n")
    ws_bytes = 4 * max(1, nred) * blocks * kern.rows
    launcher = workspace_entry(str(ws_bytes)) + f"""
    {check_inputs(kern, card.inputs, card.outputs)}
    if (ws_bytes < {ws_bytes}) return 3;
    cudaStream_t s = (cudaStream_t)stream;
    float* ws = (float*)workspace;  /* every block's partial results: written before they are read */
    cudaError_t e;
    if ({aligned}) {{
{launch("true")}    }} else {{
{launch("false")}    }}
    if (e != cudaSuccess) return (int)e;
    return (int)cudaGetLastError();
}}"""
    return PRELUDE + f'''
/* {kern.summary}; tiles of {threads} x {vec} elements in memory order, {blocks} blocks, cache {cache}{
", transposed outputs" if lay.transposed else ""} */
static const int64_t NUMEL = {kern.rows * kern.cols};
#define NR {kern.rows}
#define RL {lay.rl}
#define PER {lay.per}
#define TPB {threads}
#define VEC {vec}
#define BLOCKS {blocks}
#define NSTEP {nstep}
''' + TILE_HELPERS + f'''
/* AL: every vector access aligned to its width (else element by element, the same walk) */
template <bool AL>
__global__ void __launch_bounds__(TPB, {p.get("bps", 1)}) fg_kernel({params_c}, float* __restrict__ fg_ws) {{
    __shared__ float fg_red[TPB];
    __shared__ float fg_tot[{max(1, nred)}][NR];
{row_smem}{extern}    const int t = threadIdx.x;
    /* a block's runs start on whole periods, each TPB x VEC elements whole periods: thread t's
       elements are all of one row */
    const int64_t r = ((int64_t)t * VEC / RL) % NR;
{nl.join(decls)}
{nl.join(body)}
}}

{launcher}
'''


def _tiles_transposed(kern: Kernel, w: NodeWriter, lay: TileLayout, full: list, cached: list[int], cache: str,
                      ind: str, shared_rows: list[int]) -> list[str]:
    """The output phase of a tiles kernel with transposed outputs: the block's chunk is PIX whole
    periods (pixels); work item ``it`` is channel ``it % PER``'s run of VEC pixels ``it / PER``,
    so a thread writes a channel's pixels in order, a vector a run. The rows' values the phase
    needs (``shared_rows``) are computed for every row before it, into shared memory."""
    need = loop_nodes(kern, [o.node for o in full])
    for n in need:
        for a in kern.nodes[n].args:
            if not kern.nodes[a].varying and a not in shared_rows:
                shared_rows.append(a)
    shared_rows.sort()
    inner: list[str] = []
    hoisted: list[str] = []  # the item's values: the same for its VEC pixels (a channel's weight)
    for n in shared_rows:
        hoisted.append(f"const {w.vtype(kern.nodes[n])} t{n} = fg_row{n}[r];")
    head, post, tail = [], [], []
    same = _pixel_invariant(kern, lay, need)
    for n in need:
        node = kern.nodes[n]
        if node.op == "load" and node.kind == "f" and node.attr[1] == lay.ref and n in cached and cache == "smem":
            inner.append(w.stmt(node, f"to_f(sm{n}[(pl + j) * PER + ch])"))
        elif n in same:
            hoisted.append(w.stmt(node))
        else:
            inner.append(w.stmt(node))
    for o in full:
        if o.dtype in FLOATS and o.offset == lay.trans:
            head.append(f"float o{o.index}[VEC];")
            tail.append(f"o{o.index}[j] = t{o.node};")
            row, _ = o.offset.split("c")
            post.append(f"fg_st<{w.types[o.dtype]}, VEC, AL>(q{o.index} + {w.row_name(row)} + {col0(o.offset)}, "
                        f"o{o.index});")
        else:
            tail.append(w.store(o.dtype, f"q{o.index}[{w.offset(o.offset)}]", f"t{o.node}"))
    out = [ind + "/* the transposed outputs */",
           ind + "#pragma unroll 4",
           ind + "for (int it = t; it < PER * (PIX / VEC); it += TPB) {",
           ind + "    const int64_t ch = it % PER, pl = (it / PER) * VEC;",
           ind + "    const int64_t px = (int64_t)blockIdx.x * PIX + pl;",
           ind + "    if (px * PER < NUMEL) {",
           ind + "        const int64_t r = ch / RL;",
           ind + "        const int64_t c0 = ch % RL + RL * px;",
           ind + "        (void)c0;"]
    out += [ind + "        " + d for d in w.row_decls()]
    out += [ind + "        " + s for s in head]
    if hoisted:
        out += [ind + "        const int64_t c = c0;", ind + "        (void)c;"]
        out += [ind + "        " + s for s in hoisted]
    out += [ind + "        #pragma unroll", ind + "        for (int j = 0; j < VEC; ++j) {",
            ind + "            const int64_t c = c0 + RL * j;"]
    out += [ind + "            " + s for s in inner + tail] + [ind + "        }"]
    out += [ind + "        " + s for s in post] + [ind + "    }", ind + "}"]
    return out


def _pixel_invariant(kern: Kernel, lay: TileLayout, need: list[int]) -> set[int]:
    """The varying nodes whose value is the same at columns ``c`` and ``c + RL * j`` (a channel's
    other pixels): loads and index values that read ``c`` only modulo a divisor of RL, and what
    is computed from those and row values alone."""
    def fixed(e: Index) -> bool:
        return all(isinstance(a, Atom) and (a.var != "c" or (a.div == 1 and a.mod is not None and lay.rl % a.mod == 0))
                   for _, a in e.terms)

    out: set[int] = set()
    for n in need:
        node = kern.nodes[n]
        if node.op == "load":
            ok = fixed(node.attr[1])
        elif node.op == "index":
            ok = fixed(node.attr)
        elif node.op == "icmp":
            ok = fixed(node.attr[0]) and fixed(node.attr[2])
        else:
            ok = all(a in out or not kern.nodes[a].varying for a in node.args)
        if ok:
            out.add(n)
    return out

