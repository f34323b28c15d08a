"""CUDA for the cuda backend.

Pointwise programs: a flat grid-stride kernel, VEC consecutive columns a thread (16-byte vector
loads and stores where an access is contiguous along the row and aligned; a VEC=1 instantiation
runs when a pointer is not aligned), grid ``full`` or capped at whole waves; ``fold`` P: a thread
computes its VEC columns in each of the row's P parts, and an element two parts read (rotate-half's
partner) is loaded once.

Programs with reductions: TPR threads a row (4 to 1024: below 32, several rows share a warp and
the shuffles stay within each row's lanes), RPB rows a block, one phase a reduction level
(warp shuffles, then shared memory across the row's warps), then the output phase. What the
phases read again is cached (``cache``): in registers (``regs``: NV x VEC values a thread, the
loops unrolled; a later phase starts from the values an earlier one computed, see ``Carry``), in
shared memory (``smem``: each thread keeps its own elements, raw), or not at
all (``none``: re-read, from L1/L2). ``grid``: a block per RPB rows, or a persistent grid of
whole waves walking the row groups. ``split`` > 1 (sm_90 and later): a row over a cluster of SPLIT
blocks (one row a cluster), each walking every SPLIT-th run of TPR x VEC columns; a reduction
level combines the blocks' partial results through distributed shared memory, in rank order, so
every block of the row gets the same value. Few long rows (a group norm's 32 groups of 262144
elements) then fill the GPU: one block a row used 32 of the H200's 132 SMs. ``tiles``: rows
interleaved in memory (a channels-last group norm's groups, runs of a group's channels side by
side) walked in memory order by a cooperative grid of ``bps`` blocks an SM, each thread one row's
elements, the blocks' partial results combined behind a grid barrier (see ``_tiles``). On the
H200 (the diffusion's group norm) it is level with a cluster a row in the evaluator, at 36% of a
copy, and takes 20-25% less GPU time under Nsight Compute; neither is bound by memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..kernel_abi import ITEMSIZE
from ..kernels.common import CUDA_COMMON, FAST_HELPERS, HELPERS
from ..kernels.device import DEFAULT_DEVICE, DeviceProps
from ..kernels.launch import cluster_config, workspace_entry
from .emit_common import NodeWriter, check_inputs
from .index import Atom, Index, Space, to_c
from .ir import FLOATS, Kernel

PRELUDE = CUDA_COMMON + r'''
#include <cooperative_groups.h>
#define FG __device__ __forceinline__
FG float fg_rbf(float v) { return round_to<__nv_bfloat16>(v); }
FG float fg_rh(float v) { return round_to<__half>(v); }
FG float fg_rsqrt(float v) { return rsqrtf(v); }
''' + HELPERS + FAST_HELPERS + r'''
template <int OP> FG float fg_comb(float a, float b) { return OP == 0 ? a + b : OP == 1 ? fg_max_acc(a, b) : fg_min_acc(a, b); }
template <int OP> FG float fg_ident() { return OP == 0 ? 0.f : OP == 1 ? -INFINITY : INFINITY; }

/* Reduce over the TPR threads of a row (rows side by side in the block, TPR a power of two; below
   32 a warp holds 32 / TPR rows). Every thread of the block calls it. scratch: RPB * (TPR / 32). */
template <int TPR, int OP>
FG float fg_row_reduce(float v, float* scratch) {
    constexpr int LANES = TPR < 32 ? TPR : 32;
#pragma unroll
    for (int o = LANES / 2; o > 0; o >>= 1) v = fg_comb<OP>(v, __shfl_xor_sync(0xffffffffu, v, o));
    if constexpr (TPR > 32) {
        constexpr int W = TPR / 32;
        const int lane = threadIdx.x & 31, w = (threadIdx.x % TPR) >> 5, slot = threadIdx.x / TPR;
        __syncthreads();
        if (lane == 0) scratch[slot * W + w] = v;
        __syncthreads();
        v = lane < W ? scratch[slot * W + lane] : fg_ident<OP>();
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v = fg_comb<OP>(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}

/* A row split over a cluster (SPLIT > 1): each block's partial result of a reduction, written to
   its own slot, read from every block of the cluster in rank order after a cluster barrier. */
template <int OP> FG float fg_cluster_comb(float* part, int split) {
    cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
    float v = fg_ident<OP>();
    for (int r = 0; r < split; ++r) v = fg_comb<OP>(v, *cl.map_shared_rank(part, r));
    return v;
}
FG void fg_cluster_sync() { cooperative_groups::this_cluster().sync(); }

template <typename T, int N> FG void fg_vec_to_f(const Vec<T, N>& a, float (&out)[N]) {
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = to_f(a.v[j]);
}
'''
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


def _args(kern: Kernel, w: NodeWriter) -> tuple[str, str]:
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


def _aligned(kern: Kernel, vec: int, vec_loads: list, vec_outs: list) -> str:
    conds = []
    for n in vec_loads:
        k = n.attr[0]
        conds.append(f"forge_aligned(in[{k}].data, {vec * ITEMSIZE[kern.leaves[k].dtype]})")
    for o in vec_outs:
        conds.append(f"forge_aligned(out[{o.index}].data, {vec * ITEMSIZE[o.dtype]})")
    return " && ".join(sorted(set(conds))) or "true"



def _launcher(kern: Kernel, card, launches: str) -> str:
    """forge_launch: the inputs checked against the card, then ``launches`` on the caller's stream
    (``s``), then the launch error, if any."""
    return f"""FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {{
    {check_inputs(kern, card.inputs, card.outputs)}
    cudaStream_t s = (cudaStream_t)stream;
{launches}    return (int)cudaGetLastError();
}}"""

def _cluster_launch(kernel: str, rows: int, split: int, args: str) -> str:
    """Host code launching ``kernel`` on stream ``s`` as one cluster of ``split`` blocks a row."""
    return (cluster_config(kernel, split, str(rows * split), "TPR * RPB", 0) +
            f"        cudaError_t e = cudaLaunchKernelEx(&cfg, {kernel}, {args});\n"
            "        if (e != cudaSuccess) return (int)e;\n")


def resident_blocks(threads: int, device: DeviceProps) -> int:
    """Blocks of ``threads`` an SM holds at once, as the "waves" grid counts them (at most 32,
    the hardware's limit of resident blocks)."""
    return max(1, min(32, device.max_threads_per_sm // threads))


def emit_cuda(kern: Kernel, params: dict, card, device: DeviceProps = DEFAULT_DEVICE) -> str:
    if kern.reductions and params.get("grid") == "tiles":
        return _tiles(kern, params, card, device)
    if kern.reductions:
        return _rows(kern, params, card, device)
    return _flat(kern, params, card, device)


# ---- pointwise -----------------------------------------------------------------------------------
def _shifted(e: Index, shift: int, space: Space) -> Index:
    """``e`` (over ``r`` and ``c``) at column ``c + shift``, in ``space`` (where ``c`` ranges over one
    part of the row): exact index arithmetic, canonical, so two accesses of one element compare
    equal whatever their parts."""
    out = space.const(e.const)
    for coef, a in e.terms:
        if isinstance(a, Atom):
            if a.var != "c":
                out = space.add(out, space.canon(0, [(coef, a)]))
                continue
            x = space.add(space.const(shift), space.var("c"))
            x = space.floordiv(x, a.div)
            if a.mod is not None:
                x = space.mod(x, a.mod)
        else:
            inner = _shifted(a.inner, shift, space)
            x = space.floordiv(inner, a.k) if a.op == "/" else space.mod(inner, a.k)
        out = space.add(out, space.scale(x, coef))
    return out


def fold_loads(kern: Kernel, parts: int, vec: int) -> tuple[list[tuple[int, Index]], int] | None:
    """Folded ``parts`` ways (a thread computes column c and c + H, c + 2H ... of its row, H = cols /
    parts): the distinct vector loads a thread makes for its ``parts`` x VEC elements, as (leaf,
    offset over c in [0, H)), and how many scalar (not vectorisable) loads remain per element.
    None where the row does not fold that way."""
    if parts == 1 or kern.reductions or kern.cols % (parts * vec):
        return None
    key = ("fold", parts, vec)
    hit = kern.memo.get(key)
    if hit is None:
        h = kern.cols // parts
        space = Space({"r": kern.rows, "c": h})
        need = kern.needed([o.node for o in kern.outputs])
        seen: dict[tuple[int, Index], None] = {}
        scalar = 0
        for n in need:
            node = kern.nodes[n]
            if node.op != "load" or not node.varying:
                continue
            k, off = node.attr
            for p in range(parts):
                o = _shifted(off, p * h, space)
                if node.kind == "f" and vec_ok(o, vec):
                    seen[(k, o)] = None
                else:
                    scalar += 1
        hit = kern.memo[key] = (list(seen), scalar)
    return hit


def fold_gains(kern: Kernel, parts: int, vec: int) -> bool:
    """Whether folding ``parts`` ways reads fewer vectors per element than not folding (the rotary's
    rotate-half reads x at c and at its partner c +- H: folded in two, each x once)."""
    folded = fold_loads(kern, parts, vec)
    need = kern.needed([o.node for o in kern.outputs])
    flat = sum(1 for n in need if kern.nodes[n].op == "load" and kern.nodes[n].varying)
    return folded is not None and folded[1] == 0 and len(folded[0]) < parts * flat


def _flat(kern: Kernel, p: dict, card, device: DeviceProps) -> str:
    """``fold`` = P > 1: each thread computes VEC columns in each of the row's P parts (c, c + H,
    ... with H = cols / P) and reads every distinct element once: accesses that meet across parts
    (rotate-half's x at c + H in part 0 and at c in part 1) are one load; a domain that P does not
    divide that way (see ``fold_gains``) is not folded. A program with outputs of different sizes
    (``kern.more``): a kernel a size, launched one after the other on the stream (``launch`` =
    ``each``), or one launch whose blocks are split among the sizes (``one``)."""
    w = NodeWriter(kern, "cuda", p.get("math", "eager"))
    params_c, args_c = _args(kern, w)
    one = p.get("launch", "each") == "one" and len(kern.domains) > 1
    vec, threads = p["vec"], p["threads"]
    doms = []  # per domain: (source, grid at VEC, grid at 1, the VEC instantiation's condition)
    fold = p.get("fold", 1)
    for d, k in enumerate(kern.domains):
        doms.append(_flat_domain(k, {**p, "fold": fold if fold > 1 and fold_gains(k, fold, vec) else 1},
                                 device, f"fg_domain{d}" if one else f"fg_kernel{d if d else ''}", params_c, one))
    sources = "\n".join(src for src, _, _, _ in doms)
    if not one:
        launches = "".join(
            f"    if ({al}) {name}<{vec}><<<{g}, {threads}, 0, s>>>({args_c});\n"
            f"    else {name}<1><<<{g1}, {threads}, 0, s>>>({args_c});\n"
            for (_, g, g1, al), name in zip(doms, [f"fg_kernel{d if d else ''}" for d in range(len(doms))]))
        return PRELUDE + sources + "\n" + _launcher(kern, card, launches) + "\n"
    names = ", ".join(a.split("__restrict__ ")[1] for a in params_c.split(", "))
    calls = []
    total = total1 = 0
    for d, (_, g, g1, _) in enumerate(doms):
        calls.append(f"    if (b < (VEC == 1 ? {total1 + g1}u : {total + g}u)) {{ fg_domain{d}<VEC>(b - (VEC == 1 ? "
                     f"{total1}u : {total}u), VEC == 1 ? {g1}u : {g}u, {names}); return; }}")
        total, total1 = total + g, total1 + g1
    aligned = " && ".join(sorted({c for _, _, _, al in doms for c in al.split(" && ") if c != "true"})) or "true"
    kernel = ("/* one launch: the blocks of every size's kernel, in turn */\n"
              f"template <int VEC>\n__global__ void __launch_bounds__({threads}) fg_kernel({params_c}) {{\n"
              "    const unsigned b = blockIdx.x;\n" + "\n".join(calls) + "\n}\n")
    launch = (f"    if ({aligned}) fg_kernel<{vec}><<<{total}, {threads}, 0, s>>>({args_c});\n"
              f"    else fg_kernel<1><<<{total1}, {threads}, 0, s>>>({args_c});\n")
    return PRELUDE + sources + "\n" + kernel + "\n" + _launcher(kern, card, launch) + "\n"


def _flat_domain(kern: Kernel, p: dict, device: DeviceProps, kname: str, params_c: str,
                 device_fn: bool = False) -> tuple[str, int, int, str]:
    """One domain's kernel named ``kname`` (a ``__global__`` one, or with ``device_fn`` a device
    function of its block index and block count, for a launch shared with other domains), its grid
    at VEC and at 1, and the condition for the VEC instantiation."""
    w = NodeWriter(kern, "cuda", p.get("math", "eager"))
    threads, vec, parts = p["threads"], p["vec"], p.get("fold", 1)
    h = kern.cols // parts
    space = Space({"r": kern.rows, "c": h})
    ind = "        "
    roots = [o.node for o in kern.outputs]
    need = kern.needed(roots)
    row_stmts = [ind + w.stmt(kern.nodes[n]) for n in need if not kern.nodes[n].varying]
    vloads: list = []  # the load nodes read as vectors (for the alignment check)
    pre: list[str] = []
    names: dict[tuple[int, Index], str] = {}
    part_vec: list[dict[int, str]] = []  # per part: load node -> the vector holding it
    for part in range(parts):
        here: dict[int, str] = {}
        for n in need:
            ld = kern.nodes[n]
            if ld.op != "load" or not ld.varying or ld.kind != "f":
                continue
            k, off = ld.attr
            o = _shifted(off, part * h, space) if parts > 1 else off
            if not vec_ok(o, vec):
                continue
            name = names.get((k, o))
            if name is None:
                name = names[(k, o)] = f"v{len(names)}"
                row, _ = o.split("c")
                pre.append(ind + f"float {name}[VEC]; load_vec<{w.types[kern.leaves[k].dtype]}, VEC>(p{k} + "
                                 f"{w.row_name(row)} + {col0(o)}, {name});")
                vloads.append(ld)
            here[n] = name
        part_vec.append(here)
    vouts = [o for o in kern.outputs if o.dtype in FLOATS
             and all(vec_ok(_shifted(o.offset, q * h, space) if parts > 1 else o.offset, vec) for q in range(parts))]
    inner: list[str] = []
    post: list[str] = []
    for part in range(parts):
        body = []
        for n in need:
            node = kern.nodes[n]
            if not node.varying:
                continue
            vn = part_vec[part].get(n)
            body.append(w.stmt(node, f"{vn}[j]" if vn else None))
        for o in kern.outputs:
            if o in vouts:
                pre.append(ind + f"float o{o.index}_{part}[VEC];")
                body.append(f"o{o.index}_{part}[j] = t{o.node};")
                off = _shifted(o.offset, part * h, space) if parts > 1 else o.offset
                row, _ = off.split("c")
                post.append(ind + f"store_vec<{w.types[o.dtype]}, VEC>(q{o.index} + {w.row_name(row)} + {col0(off)}, "
                                  f"o{o.index}_{part});")
            else:
                body.append(w.store(o.dtype, f"q{o.index}[{w.offset(o.offset)}]", f"t{o.node}"))
        shift = f" + {part * h}LL" if part else ""
        inner.append(ind + "    {\n" + ind + f"        const int64_t c = c0 + j{shift};\n" + ind + "        (void)c;\n"
                     + "\n".join(ind + "        " + b for b in body) + "\n" + ind + "    }")
    decls = [ind + d for d in w.row_decls()]
    numel = kern.rows * h
    full = -(-numel // (threads * vec))
    wave = device.sms * max(1, device.max_threads_per_sm // threads)
    grid = {"full": full, "waves4": min(full, 4 * wave), "waves1": min(full, wave)}[p["grid"]]
    grid1 = -(-numel // threads) if p["grid"] == "full" else grid
    aligned = _aligned(kern, vec, vloads, vouts)
    nl = "\n"
    folded = f", folded {parts} ways (a thread: columns c + k x {h})" if parts > 1 else ""
    # the parts' column tests (rotate-half's c < H) then fold to constants
    assume = "\n        __builtin_assume(c0 >= 0 && c0 + VEC <= COLS);" if parts > 1 else ""
    head = (f"__device__ __forceinline__ void {kname}(const unsigned blk, const unsigned nblk, {params_c})"
            if device_fn else f"__global__ void __launch_bounds__({threads}) {kname}({params_c})")
    blk, nblk = ("blk", "nblk") if device_fn else ("blockIdx.x", "gridDim.x")
    return f'''
/* {kern.summary}{folded} */
template <int VEC>
{head} {{
    constexpr int64_t NUMEL = {numel}, COLS = {h};
    for (int64_t e0 = ((int64_t){blk} * {threads} + threadIdx.x) * VEC; e0 < NUMEL;
         e0 += (int64_t){nblk} * {threads} * VEC) {{
        const int64_t r = e0 / COLS;
        const int64_t c0 = e0 - r * COLS;{assume}
{nl.join(decls)}
{nl.join(row_stmts)}
{nl.join(pre)}
#pragma unroll
        for (int j = 0; j < VEC; ++j) {{
{nl.join(inner)}
        }}
{nl.join(post)}
    }}
}}
''', grid, grid1, aligned


# ---- rows ----------------------------------------------------------------------------------------
def cached_loads(kern: Kernel) -> list[int]:
    """Varying float loads that more than one phase reads (what the cache keeps)."""
    hit = kern.memo.get("cached_loads")
    if hit is None:
        hit = kern.memo["cached_loads"] = _cached_loads(kern)
    return list(hit)


def _cached_loads(kern: Kernel) -> list[int]:
    uses: dict[int, set[int]] = {}
    roots_by_phase = [[r.body for r in kern.reductions if r.level == lv] for lv in range(kern.levels)]
    roots_by_phase.append([o.node for o in kern.outputs if not o.per_row])
    for ph, roots in enumerate(roots_by_phase):
        for n in _loop_nodes(kern, roots):
            node = kern.nodes[n]
            if node.op == "load" and node.kind == "f":
                uses.setdefault(n, set()).add(ph)
    return sorted(n for n, phases in uses.items() if len(phases) > 1)


def _loop_nodes(kern: Kernel, roots: list[int]) -> list[int]:
    return [n for n in kern.needed(roots) if kern.nodes[n].varying]


def _phase_roots(kern: Kernel) -> list[list[int]]:
    """The nodes each loop over a row's columns computes: the reductions of each level, then the
    full (not per-row) outputs."""
    phases = [[r.body for r in kern.reductions if r.level == lv] for lv in range(kern.levels)]
    return phases + [[o.node for o in kern.outputs if not o.per_row]]


@dataclass
class Carry:
    """How the register cache carries a row from loop to loop. Without it (``recompute``), a
    later loop recomputes every value it needs from the cached loads: the attention chain's
    scale, mask and rounding three times and its exponential twice (on the H200 that kept the
    kernel at a third of its memory floor, bound by instructions). With it, a loop keeps in
    registers the values a later loop reads (``keep``: node ids), and the later loop starts from
    them; arithmetic and rounding are the same, done once."""

    need: list[list[int]]
    """Per loop: the varying nodes it computes or reads from the cache, in order."""
    keep: list[list[int]]
    """Per loop: the non-load nodes it computes and stores for a later loop."""
    loads: list[int]
    """The loads more than one loop reads (kept in the load cache)."""

    @property
    def arrays(self) -> int:
        """The most register arrays (one per kept node or cached load) live at once."""
        live = 0
        for i in range(1, len(self.need)):
            later = {n for ph in self.need[i:] for n in ph}
            earlier = {n for ph in self.need[:i] for n in ph}
            live = max(live, len(later & earlier))
        return live


def carry_plan(kern: Kernel) -> Carry:
    """Each loop computes only the values no earlier loop computed, and reads the rest from
    registers (see ``Carry``)."""
    hit = kern.memo.get("carry")
    if hit is None:
        hit = kern.memo["carry"] = _carry_plan(kern)
    return hit


def _carry_plan(kern: Kernel) -> Carry:
    computed: set[int] = set()
    needs: list[list[int]] = []
    keep_at: dict[int, int] = {}  # kept node -> the loop that computes it
    first: dict[int, int] = {}
    for ph, roots in enumerate(_phase_roots(kern)):
        seen: set[int] = set()
        stack = [n for n in roots if kern.nodes[n].varying]
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if n in computed:
                if kern.nodes[n].op != "load":
                    keep_at[n] = first[n]
                continue  # read from registers: its operands are not needed again
            stack.extend(a for a in kern.nodes[n].args if kern.nodes[n].varying and kern.nodes[a].varying)
        need = sorted(seen)
        for n in need:
            first.setdefault(n, ph)
        computed |= seen
        needs.append(need)
    keep = [sorted(n for n, ph in keep_at.items() if ph == i) for i in range(len(needs))]
    uses: dict[int, int] = {}
    for need in needs:
        for n in need:
            if kern.nodes[n].op == "load" and kern.nodes[n].kind == "f":
                uses[n] = uses.get(n, 0) + 1
    return Carry(needs, keep, sorted(n for n, c in uses.items() if c > 1))


def carries(kern: Kernel, cache: str) -> bool:
    """Whether a configuration's loops carry values (``Carry``): the register cache does when that
    needs no more register arrays than caching the loads alone."""
    return cache == "regs" and carry_plan(kern).arrays <= max(1, len(cached_loads(kern)))


def smem_bytes(kern: Kernel, rpb: int, vec: int) -> int:
    total = 0
    for n in cached_loads(kern):
        node = kern.nodes[n]
        if vec_ok(node.attr[1], vec):
            total += -(-rpb * kern.cols * ITEMSIZE[node.dtype] // 16) * 16
    return total


def _rows(kern: Kernel, p: dict, card, device: DeviceProps) -> str:
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
        need = carry.need[phase] if carry else _loop_nodes(kern, roots)
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
        # several rows a thread, every group whole: every row is live, no row clamped. ptxas gives
        # the Qwen-3 per-head norm's kernel 48 registers at 8 rows a thread so, 120 with each row's
        # liveness and clamp (timed on an H100: no faster, bench/lab/row_configs.py); at one row a
        # thread it gave 48 against 38, so one row a thread keeps them
        head += ["const bool live = ROWS > 0;  // every group is whole", "const int64_t r = rr;", "(void)live;"]
    stages = [[ind + x for x in head] + [ind + d for d in w.row_decls()] + body[:cuts[0]]]
    stages += [body[a:b] for a, b in zip(cuts, cuts[1:] + [len(body)])]
    body = [line for stage in stages for i in range(rpt) for line in _row_copy(stage, i, rpt)]
    params_c, args_c = _args(kern, w)
    groups = -(-kern.rows // (rpb * rpt))
    grid = groups if p.get("grid", "rows") == "rows" else min(groups, device.sms * resident_blocks(tpr * rpb, device))
    nv = -(-cols // (tpr * vec * split))
    nv1 = -(-cols // (tpr * split))
    smem = off
    vec_loads = [kern.nodes[n] for n in set(_loop_nodes(kern, [r.body for r in kern.reductions] + roots))
                 if kern.nodes[n].op == "load" and kern.nodes[n].kind == "f" and vec_ok(kern.nodes[n].attr[1], vec)]
    aligned = _aligned(kern, vec, vec_loads, vouts)
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
        launches = (f"    if ({aligned}) {{\n{_cluster_launch(f'fg_kernel<{vec}, {nv}>', groups, split, args_c)}    }} else {{\n"
                    f"{_cluster_launch(f'fg_kernel<1, {nv1}>', groups, split, args_c)}    }}\n")
    parts = f"    __shared__ float fg_part[{max(1, len(kern.reductions))}];\n" if split > 1 else ""
    rows_note = f", {rpt} rows a thread" if rpt > 1 else ""
    return PRELUDE + f'''
/* {kern.summary}; {tpr} threads a row, {rpb} rows a block, {split} blocks a row, cache {cache}{rows_note} */
static const int64_t ROWS = {kern.rows}, GROUPS = {groups};
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

{_launcher(kern, card, launches)}
'''


_ROW_NAMES = re.compile(r"\b(I|r|rr|live|(?:ro|acc|red|part|keep|cache|t|v|o|raw|sm)\d+)\b")


def _row_copy(lines: list[str], i: int, rpt: int) -> list[str]:
    """A stage of the rows kernel's body for a thread's ``i``-th row of ``rpt``: the row's own
    names (its index, offsets, accumulators, values and register arrays) suffixed, so that the
    rows' copies of a stage sit side by side (all rows' loads before any row's reduction)."""
    if rpt == 1:
        return lines
    return [_ROW_NAMES.sub(lambda m: str(i) if m.group(1) == "I" else f"{m.group(1)}_{i}", x) for x in lines]


# ---- tiles ---------------------------------------------------------------------------------------
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


def _tiles(kern: Kernel, p: dict, card, device: DeviceProps) -> str:
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
        need = _loop_nodes(kern, roots)
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
    params_c, args_c = _args(kern, w)
    vloads = [kern.nodes[n] for n in set(_loop_nodes(kern, [r.body for r in kern.reductions] + [o.node for o in full]))
              if is_ref_load(kern.nodes[n])]
    aligned = _aligned(kern, vec, vloads, [o for o in full if o.dtype in FLOATS])
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
    need = _loop_nodes(kern, [o.node for o in full])
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


TILE_HELPERS = r"""
#define PIX (NSTEP * TPB * VEC / PER)

/* A vector's elements, one access where aligned (AL), else one by one; and its store. */
template <typename T, int N, bool AL> FG Vec<T, N> fg_raw(const T* __restrict__ p) {
    if constexpr (AL) {
        return *reinterpret_cast<const Vec<T, N>*>(p);
    } else {
        Vec<T, N> a;
#pragma unroll
        for (int j = 0; j < N; ++j) a.v[j] = p[j];
        return a;
    }
}
template <typename T, int N, bool AL> FG void fg_st(T* __restrict__ p, const float (&in)[N]) {
    if constexpr (AL) {
        store_vec<T, N>(p, in);
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j) p[j] = from_f<T>(in[j]);
    }
}

/* The block's share of each row: thread q < NR combines, in thread order, the values of the
   block's threads of row q (runs q, q + NR, ... of RL / VEC threads) into ws[blockIdx.x * NR + q]. */
template <int OP> FG void fg_tile_block(float v, float* red, float* ws) {
    const int t = threadIdx.x;
    constexpr int TR = RL / VEC;
    red[t] = v;
    __syncthreads();
    if (t < NR) {
        float a = fg_ident<OP>();
        for (int k = 0; k < TPB * VEC / PER; ++k)
#pragma unroll
            for (int i = 0; i < TR; ++i) a = fg_comb<OP>(a, red[(t + k * NR) * TR + i]);
        ws[(int64_t)blockIdx.x * NR + t] = a;
    }
    __syncthreads();
}

/* After the grid barrier, in every block alike: thread t combines row t % NR's results of blocks
   t / NR, t / NR + TPB / NR, ..., then thread q < NR those of threads q, q + NR, ... in order. */
template <int OP> FG void fg_tile_grid(const float* ws, float* red, float* tot) {
    const int t = threadIdx.x;
    constexpr int W = TPB / NR;
    float a = fg_ident<OP>();
#pragma unroll 8
    for (int b = t / NR; b < BLOCKS; b += W) a = fg_comb<OP>(a, __ldcg(ws + (int64_t)b * NR + t % NR));
    red[t] = a;
    __syncthreads();
    if (t < NR) {
        float v = fg_ident<OP>();
        for (int i = 0; i < W; ++i) v = fg_comb<OP>(v, red[i * NR + t]);
        tot[t] = v;
    }
    __syncthreads();
}
"""
