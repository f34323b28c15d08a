"""Pointwise programs: a flat grid-stride kernel, VEC consecutive columns a thread, and the row
folded in parts (``fold``) where that reads each element once."""

from __future__ import annotations

from ...kernels.device import DeviceProps
from ..emit_common import NodeWriter
from ..index import Atom, Index, Space
from ..ir import FLOATS, Kernel
from .common import PRELUDE, aligned_check, col0, kernel_args, launcher, vec_ok


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


def _grid(numel: int, per_block: int, cap: int | None) -> tuple[int, str]:
    """Blocks covering ``numel`` elements ``per_block`` a block, at most ``cap``: the number, and
    the C expression of it over the element count."""
    full = -(-numel // per_block)
    c = f"({numel}LL + {per_block - 1}) / {per_block}"
    if cap is None:
        return full, f"(unsigned)({c})"
    return min(full, cap), f"(unsigned)({c} < {cap} ? {c} : {cap})"


def emit_flat(kern: Kernel, p: dict, card, device: DeviceProps) -> str:
    """``fold`` = P > 1: each thread computes VEC columns in each of the row's P parts (c, c + H,
    ... with H = cols / P) and reads every distinct element once: accesses that meet across parts
    (rotate-half's x at c + H in part 0 and at c in part 1) are one load; a domain that P does not
    divide that way (see ``fold_gains``) is not folded. A program with outputs of different sizes
    (``kern.more``): a kernel a size, launched one after the other on the stream (``launch`` =
    ``each``), or one launch whose blocks are split among the sizes (``one``)."""
    w = NodeWriter(kern, "cuda", p.get("math", "eager"))
    params_c, args_c = kernel_args(kern, w)
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
            f"    if ({al}) {name}<{vec}><<<{gc}, {threads}, 0, s>>>({args_c});\n"
            f"    else {name}<1><<<{gc1}, {threads}, 0, s>>>({args_c});\n"
            for (_, (_, gc), (_, gc1), al), name in zip(doms, [f"fg_kernel{d if d else ''}" for d in range(len(doms))]))
        return PRELUDE + sources + "\n" + launcher(kern, card, launches) + "\n"
    names = ", ".join(a.split("__restrict__ ")[1] for a in params_c.split(", "))
    calls = []
    total = total1 = 0
    for d, (_, (g, _), (g1, _), _) in enumerate(doms):
        calls.append(f"    if (b < (VEC == 1 ? {total1 + g1}u : {total + g}u)) {{ fg_domain{d}<VEC>(b - (VEC == 1 ? "
                     f"{total1}u : {total}u), VEC == 1 ? {g1}u : {g}u, {names}); return; }}")
        total, total1 = total + g, total1 + g1
    aligned = " && ".join(sorted({c for _, _, _, al in doms for c in al.split(" && ") if c != "true"})) or "true"
    kernel = ("/* one launch: the blocks of every size's kernel, in turn */\n"
              f"template <int VEC>\n__global__ void __launch_bounds__({threads}) fg_kernel({params_c}) {{\n"
              "    const unsigned b = blockIdx.x;\n" + "\n".join(calls) + "\n}\n")
    launch = (f"    if ({aligned}) fg_kernel<{vec}><<<{total}, {threads}, 0, s>>>({args_c});\n"
              f"    else fg_kernel<1><<<{total1}, {threads}, 0, s>>>({args_c});\n")
    return PRELUDE + sources + "\n" + kernel + "\n" + launcher(kern, card, launch) + "\n"


def _flat_domain(kern: Kernel, p: dict, device: DeviceProps, kname: str, params_c: str,
                 device_fn: bool = False) -> tuple[str, tuple[int, str], tuple[int, str], str]:
    """One domain's kernel named ``kname`` (a ``__global__`` one, or with ``device_fn`` a device
    function of its block index and block count, for a launch shared with other domains), its grid
    at VEC and at 1 (each a number and the C expression of it over the element count, which a
    range card's source takes at run time: see codegen/ranged.py), and the condition for the VEC
    instantiation."""
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
    wave = device.sms * max(1, device.max_threads_per_sm // threads)
    cap = {"full": None, "waves4": 4 * wave, "waves1": wave}[p["grid"]]
    grid = _grid(numel, threads * vec, cap)
    grid1 = _grid(numel, threads, None) if p["grid"] == "full" else grid
    aligned = aligned_check(kern, vec, vloads, vouts)
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

