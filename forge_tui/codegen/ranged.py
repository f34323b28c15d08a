"""A range card's generated kernel: one source that takes the ranged sizes at run time.

The generator works at exact sizes: its index algebra folds what each size makes redundant, and
every size, stride and extent is a literal of the source it writes. For a range card
(``Card.ranges``) the source is rendered at a grid of the range's sizes and compared:

* Every rendered source, its comments aside, must read the same but for its integer literals
  (the *skeleton*). Each literal that changes is fitted, exactly, as a polynomial in the sizes
  of the ranged dimension groups (``ranges._linked``: dimensions that vary together are one
  size), of degree at most 2 in each (``MAX_DEGREE``), and checked at every sampled size the fit
  did not use.
  Where a group's whole range is sampled the fit is exact at every size it can take.
* A size of 1 may read otherwise (a dimension of one drops out of every index: a decode step's
  one row). Where it does, that size gets a source of its own, itself a range source over the
  other groups, and ``forge_launch`` picks it at run time; each variant sits in a namespace of
  its own. Any other size that reads otherwise refuses the card, naming the size.
* The literals become C expressions of ``fg_n0``, ``fg_n1``..., read from the inputs' shapes
  when ``forge_launch`` starts (and refused outside the range). Every ``__global__`` kernel
  takes them as its first parameters; declarations that were constants (``constexpr``, the
  file's ``static const`` extents) become run-time ones. A literal that changes in a template
  argument, an array's size, ``__launch_bounds__`` or a pragma refuses the card: the compiler
  needs it.

The evaluator then checks the one source at the range's ends and at odd and prime sizes inside
it, as any range candidate (``ranges.size_points``). The configurations offered are those valid
at every sampled size, with the grids whose launches read sizes alone (``RANGE_AXES``).
"""

from __future__ import annotations

import itertools
import re
from fractions import Fraction
from typing import Callable

from ..cards import Card
from ..ranges import _linked, at_sizes, checked_sizes, heaviest, parse_key
from .values import Unsupported

MAX_POINTS = 100
"""Sampled sizes (grid points over the groups) at most: each is an analysis and a rendering."""

MAX_DEGREE = 2
"""The highest power of a size in a fitted literal: a block count or an extent is linear in a size,
a product of two extents quadratic."""

SAMPLES = 7
"""Sizes sampled of a group whose range is larger: its ends, the checked and most weighted
sizes, then evenly spread ones."""

LIT = re.compile(r"(?<![\w.])(\d+)(LL|u)?(?![\w.])")
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
COMPILE_TIME = re.compile(r"template\s*<|__launch_bounds__|#\s*pragma|__shared__|\w<[^<>()]*$|"
                          r"\b(?:float|double|int|int64_t|unsigned|bool|char)\s+\w+\[[^\]]*$")

Point = tuple[int, ...]


class _Group:
    def __init__(self, keys: list[str], card: Card) -> None:
        self.keys = keys
        r = self.range = card.ranges[keys[0]]
        self.lo, self.hi = r.min, r.max
        _, self.k, self.d = parse_key(keys[0])
        self.weighted = heaviest(r)[0]

    def samples(self) -> list[int]:
        every = list(range(self.lo, self.hi + 1))
        if len(every) <= SAMPLES:
            return every
        picks = {self.lo, self.hi, self.weighted, *checked_sizes(self.range)}
        step = (self.hi - self.lo) / (SAMPLES + 1)
        for i in range(1, SAMPLES + 1):
            if len(picks) >= SAMPLES + 2:
                break
            picks.add(self.lo + round(i * step))
        return sorted(picks)


def skeleton(src: str) -> tuple[str, list[tuple[int, str]]]:
    """The source without comments, each integer literal a NUL character; and the literals (value,
    suffix)."""
    src = COMMENT.sub("", src)
    return LIT.sub("\0", src), [(int(m.group(1)), m.group(2) or "") for m in LIT.finditer(src)]


def _fit(points: list[Point], values: list[int], degrees: list[int]) -> dict[tuple[int, ...], int] | None:
    """Integer coefficients of the polynomial (monomials: exponent tuples, each at most its
    group's degree) through ``values`` at ``points``, or None where none fits them all: solved
    exactly on a grid of the first sizes of each group, then checked at every point."""
    monos = list(itertools.product(*[range(d + 1) for d in degrees]))
    axes = [sorted({p[g] for p in points}) for g in range(len(degrees))]
    base = list(itertools.product(*[axes[g][:degrees[g] + 1] for g in range(len(degrees))]))
    have = dict(zip(points, values))
    if any(b not in have for b in base):
        return None
    # a square system (tensor-product interpolation: the grid's sizes are distinct), exact
    rows = [[Fraction(_mono(b, m)) for m in monos] + [Fraction(have[b])] for b in base]
    n = len(monos)
    for col in range(n):
        piv = next(i for i in range(col, n) if rows[i][col] != 0)
        rows[col], rows[piv] = rows[piv], rows[col]
        for i in range(n):
            if i != col and rows[i][col] != 0:
                f = rows[i][col] / rows[col][col]
                rows[i] = [a - f * b for a, b in zip(rows[i], rows[col])]
    coef = {}
    for i, m in enumerate(monos):
        c = rows[i][n] / rows[i][i]
        if c.denominator != 1:
            return None
        if c:
            coef[m] = int(c)
    for p, v in zip(points, values):
        if sum(c * _mono(p, m) for m, c in coef.items()) != v:
            return None
    return coef


def _mono(p: Point, m: tuple[int, ...]) -> int:
    out = 1
    for x, e in zip(p, m):
        out *= x ** e
    return out


def _c_poly(coef: dict[tuple[int, ...], int], names: list[str]) -> str:
    terms = []
    for m, c in sorted(coef.items(), reverse=True):
        factors = [names[g] for g, e in enumerate(m) for _ in range(e)]
        terms.append("*".join([f"{c}LL"] + factors) if factors and c != 1 else
                     ("*".join(factors) if factors else f"{c}LL"))
    return "(" + (" + ".join(terms) if terms else "0LL") + ")"


class RangeSource:
    """A range card's one source for one configuration: ``render_at(card)`` is the generator's
    source for an exact-size card at that configuration (without its header line), ``prelude``
    what every such source starts with."""

    def __init__(self, card: Card, render_at: Callable[[Card], str], prelude: str) -> None:
        self.card, self.render_at, self.prelude = card, render_at, prelude
        self.groups = [_Group([k for k in keys if k.startswith("input")], card) for keys in _linked(card)]
        self.groups = [g for g in self.groups if g.keys]
        self._renders: dict[Point, str] = {}

    def _at(self, point: Point) -> str:
        hit = self._renders.get(point)
        if hit is None:
            sizes = {k: v for g, v in zip(self.groups, point) for k in g.keys}
            src = self.render_at(at_sizes(self.card, sizes))
            if not src.startswith(self.prelude):
                raise Unsupported("range: the generated source does not start with its prelude")
            hit = self._renders[point] = src[len(self.prelude):]
        return hit

    def source(self) -> str:
        """The one source for the whole range, or Unsupported with the one-line reason."""
        samples = [g.samples() for g in self.groups]
        n = 1
        for s in samples:
            n *= len(s)
        if n > MAX_POINTS:
            raise Unsupported(f"range: {len(self.groups)} independently ranged sizes ({n} sampled sizes; at most "
                              f"{MAX_POINTS})")
        variants = self._variants({}, samples)
        if len(variants) == 1:
            return self.prelude + variants[0][1]
        return self.prelude + self._dispatch(variants)

    def _variants(self, fixed: dict[int, int], samples: list[list[int]]) -> list[tuple[dict[int, int], str]]:
        """(the groups fixed at 1, the body) for the range with the groups of ``fixed`` at 1: the
        variants fixing more groups first, the general body of this call last."""
        free = [g for g in range(len(self.groups)) if g not in fixed]
        grid = list(itertools.product(*[[fixed[g]] if g in fixed else samples[g] for g in range(len(self.groups))]))
        top = grid[-1]  # every free group at its largest sampled size
        skel0 = skeleton(self._at(top))[0]
        # a group whose size 1 reads otherwise, the others' sizes larger, gets its own variants
        special = [g for g in free if any(p[g] == 1 and all(p[h] != 1 for h in free if h != g)
                                           and skeleton(self._at(p))[0] != skel0 for p in grid)]
        use = [p for p in grid if all(p[g] != 1 for g in special)]
        for p in use:
            if skeleton(self._at(p))[0] != skel0:
                raise Unsupported(f"range: its code takes another form at sizes {self._named(p)} than at "
                                  f"{self._named(top)}")
        uniq: dict[tuple, tuple[dict[int, int], str]] = {}
        for g in special:
            for f, b in self._variants({**fixed, g: 1}, samples):
                uniq.setdefault(tuple(sorted(f.items())), (f, b))
        ordered = sorted(uniq.values(), key=lambda fb: -len(fb[0]))
        return ordered + [(fixed, self._general(use, skel0, free, special))]

    def _named(self, p: Point) -> str:
        return ", ".join(f"{g.keys[0]}={v}" for g, v in zip(self.groups, p))

    def _general(self, points: list[Point], skel0: str, free: list[int], special: list[int]) -> str:
        """The body for ``points`` (one skeleton): each literal that changes as its polynomial in
        the free groups' sizes, of degree ``MAX_DEGREE`` at most in each, solved on the first
        sizes and checked at every other sampled one. Where a group's every size (but a size 1 of
        its own variant) is sampled, the fit is exact at every size it can take; another group
        needs a sampled size beyond those the fit used."""
        lits = [skeleton(self._at(p))[1] for p in points]
        sub = [tuple(p[g] for g in free) for p in points]
        degrees = []
        for i, g in enumerate(free):
            vals = sorted({s[i] for s in sub})
            grp = self.groups[g]
            domain = [v for v in range(grp.lo, grp.hi + 1) if not (v == 1 and g in special)]
            if vals == domain:  # exact at every size of the domain, whatever degree fits it
                degrees.append(min(len(vals) - 1, MAX_DEGREE))
            elif len(vals) > MAX_DEGREE + 1:
                degrees.append(MAX_DEGREE)
            else:
                raise Unsupported(f"range: too few sizes of {grp.keys[0]} to fit its code to")
        names = [f"fg_n{g}" for g in free]
        out: list[str] = []
        pieces = skel0.split("\0")
        changed = False
        text_so_far = ""
        for i, piece in enumerate(pieces[:-1]):
            text_so_far += piece
            col = [lit[i][0] for lit in lits]
            value, suffix = lits[-1][i]
            if len(set(col)) == 1:
                out.append(piece + f"{value}{suffix}")
                text_so_far += "0"
                continue
            coef = _fit(sub, col, degrees)
            if coef is None:
                raise Unsupported(f"range: a size in its code ({col[-1]}) is no polynomial of the ranged sizes")
            line = text_so_far[text_so_far.rfind("\n") + 1:]
            if COMPILE_TIME.search(line):
                raise Unsupported("range: a ranged size is a compile-time constant of its code "
                                  f"(...{line.strip()[-60:]})")
            expr = _c_poly(coef, names)
            out.append(piece + (f"(unsigned){expr}" if suffix == "u" else expr))
            text_so_far += "0"
            changed = True
        out.append(pieces[-1])
        body = "".join(out)
        lo = {g: 2 for g in special if self.groups[g].lo == 1}
        return self._runtime(body, free, lo, sized=changed)

    def _runtime(self, body: str, free: list[int], lo: dict[int, int], sized: bool = True) -> str:
        """The body with its sizes read at run time: ``fg_n*`` read and checked in forge_launch
        (within the range, from ``lo`` where a size 1 has a variant of its own), passed to every
        kernel; constants made run-time values."""
        names = [f"fg_n{g}" for g in free]
        if not sized or not names:
            return body
        lines = []
        for line in body.split("\n"):
            if "fg_n" in line:
                line = line.replace("constexpr ", "const ")
            m = re.match(r"static const (\w+) (\w+) = (.*);$", line)
            if m:  # a file-scope extent: a macro of the kernels' and forge_launch's sizes
                line = f"#define {m.group(2)} (({m.group(1)})({m.group(3)}))"
            lines.append(line)
        body = "\n".join(lines)
        params = "".join(f"const int64_t {n}, " for n in names)
        body = re.sub(r"(__global__ void (?:__launch_bounds__\([^)]*\) )?\w+\()", lambda m: m.group(1) + params, body)
        body = re.sub(r"(<<<[^>]*>>>\()", lambda m: m.group(1) + ", ".join(names) + ", ", body)
        reads = "".join(
            f"\n    const int64_t {n} = in[{self.groups[g].k}].shape[{self.groups[g].d}];"
            f"\n    if ({n} < {lo.get(g, self.groups[g].lo)} || {n} > {self.groups[g].hi}) return 2;"
            for n, g in zip(names, free))
        head = re.search(r"int forge_launch\([^)]*\) \{\n    if \(n_in != \d+ \|\| n_out != \d+\) return 2;", body)
        if head is None:
            raise Unsupported("range: its forge_launch does not start with the argument count check")
        return body[:head.end()] + reads + body[head.end():]

    def _dispatch(self, variants: list[tuple[dict[int, int], str]]) -> str:
        """Each variant in a namespace of its own, its forge_launch a static function there, and
        the exported forge_launch picking the first whose fixed sizes the call has."""
        out = []
        conds = []
        for i, (fixed, body) in enumerate(variants):
            body = body.replace("FORGE_EXPORT int forge_launch(", "static int fg_launch(")
            macros = sorted(set(re.findall(r"^#define (\w+)", body, re.M)))
            out.append(f"namespace fg_v{i} {{\n{body}\n}}  // namespace fg_v{i}\n"
                       + "".join(f"#undef {m}\n" for m in macros))
            test = " && ".join(f"in[{self.groups[g].k}].shape[{self.groups[g].d}] == {v}"
                               for g, v in sorted(fixed.items()))
            call = f"return fg_v{i}::fg_launch(in, n_in, out, n_out, sc, n_sc, stream);"
            conds.append(f"    if ({test}) {call}" if test else f"    {call}")
        ins = self.card.inputs
        return "\n".join(out) + f"""
FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,
                              const forge_scalar* sc, int32_t n_sc, void* stream) {{
    if (n_in != {len(ins)} || n_out != {len(self.card.outputs)}) return 2;
{chr(10).join(conds)}
}}
"""
