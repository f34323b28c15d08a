"""Index arithmetic over the kernel's two loop variables, ``r`` (the row) and ``c`` (the column).

Every element a generated kernel touches is addressed by an :class:`Index`: a constant plus a sum
of terms ``coef * atom``. An atom is ``(v / div) % mod`` of a loop variable (``mod`` None: no
modulo), or, where no such form exists, an opaque ``(E / k)`` or ``(E % k)`` of another index.
The canonical form folds what the loop extents make redundant (a modulo larger than the range, a
division past it) and merges mixed-radix pairs (``4 * (r / 4) + r % 4`` is ``r``), so reshapes,
broadcasts, slices and permutations of a row-major tensor reduce to the plain ``C * r + c`` where
they are one; the emitters can then vectorise the columns and hoist the row part out of the loop.
All values are non-negative integers (a negative intermediate is refused by the caller).
"""

from __future__ import annotations

from dataclasses import dataclass


class IndexError_(Exception):
    """An index the algebra cannot express (a negative operand of a division)."""


@dataclass(frozen=True)
class Atom:
    var: str
    div: int = 1
    mod: int | None = None


@dataclass(frozen=True)
class Opaque:
    inner: "Index"
    op: str  # "/" or "%"
    k: int


Term = tuple[int, "Atom | Opaque"]


def _sort_key(t: Term) -> tuple:
    coef, a = t
    if isinstance(a, Atom):
        return (0, a.var, a.div, a.mod or 0, coef)
    return (1, repr(a), coef)


@dataclass(frozen=True)
class Index:
    const: int = 0
    terms: tuple[Term, ...] = ()

    def vars(self) -> set[str]:
        out: set[str] = set()
        for _, a in self.terms:
            out |= {a.var} if isinstance(a, Atom) else a.inner.vars()
        return out

    def split(self, var: str) -> tuple["Index", "Index"]:
        """(the part free of ``var``, the part that depends on it); the constant goes with the first."""
        free = tuple(t for t in self.terms if var not in _term_vars(t))
        dep = tuple(t for t in self.terms if var in _term_vars(t))
        return Index(self.const, free), Index(0, dep)

    def is_var(self, var: str) -> bool:
        """Exactly ``var``."""
        return self.const == 0 and self.terms == ((1, Atom(var)),)

    def coefs_divisible(self, k: int) -> bool:
        return self.const % k == 0 and all(c % k == 0 for c, _ in self.terms)

    def __str__(self) -> str:
        return to_c(self)


def _term_vars(t: Term) -> set[str]:
    a = t[1]
    return {a.var} if isinstance(a, Atom) else a.inner.vars()


class Space:
    """The extents of the loop variables (``{"r": rows, "c": cols}``) and the algebra over them."""

    def __init__(self, extents: dict[str, int]) -> None:
        self.ext = dict(extents)

    # ---- ranges ----------------------------------------------------------------------------------
    def size(self, a: Atom | Opaque) -> int:
        """How many values the atom takes (0 .. size-1)."""
        if isinstance(a, Atom):
            n = -(-max(self.ext[a.var], 1) // a.div)
            return min(n, a.mod) if a.mod is not None else n
        lo, hi = self.bounds(a.inner)
        return (hi // a.k + 1) if a.op == "/" else min(a.k, hi + 1)

    def bounds(self, e: Index) -> tuple[int, int]:
        lo = hi = e.const
        for coef, a in e.terms:
            span = coef * (self.size(a) - 1)
            if span >= 0:
                hi += span
            else:
                lo += span
        return lo, hi

    # ---- construction ----------------------------------------------------------------------------
    def var(self, name: str) -> Index:
        return self.canon(0, [(1, Atom(name))])

    def const(self, v: int) -> Index:
        return Index(int(v), ())

    def canon(self, const: int, terms: list[Term]) -> Index:
        cleaned: dict[Atom | Opaque, int] = {}
        for coef, a in terms:
            if coef == 0:
                continue
            if isinstance(a, Atom):
                n = -(-max(self.ext[a.var], 1) // a.div)
                if a.mod is not None and n <= a.mod:
                    a = Atom(a.var, a.div, None)
            if self.size(a) <= 1:
                continue  # always 0
            cleaned[a] = cleaned.get(a, 0) + coef
        items = [(c, a) for a, c in cleaned.items() if c != 0]
        # a * k * (E / k) + a * (E % k) is a * E
        for c1, a1 in items:
            if isinstance(a1, Opaque) and a1.op == "%":
                q = Opaque(a1.inner, "/", a1.k)
                c2 = cleaned.get(q)
                if c2 is not None and c2 == c1 * a1.k:
                    rest = [(c, a) for c, a in items if a not in (a1, q)]
                    return self.canon(const + c1 * a1.inner.const, rest + [(c1 * c, a) for c, a in a1.inner.terms])
        changed = True
        while changed:  # merge a * ((v / d) % m) + a * m * (v / (d * m) % m2) into a * ((v / d) % (m * m2))
            changed = False
            for i, (c1, a1) in enumerate(items):
                if not isinstance(a1, Atom) or a1.mod is None:
                    continue
                for j, (c2, a2) in enumerate(items):
                    if i == j or not isinstance(a2, Atom) or a2.var != a1.var or a2.div != a1.div * a1.mod \
                            or c2 != c1 * a1.mod:
                        continue
                    merged = Atom(a1.var, a1.div, None if a2.mod is None else a1.mod * a2.mod)
                    n = -(-max(self.ext[a1.var], 1) // merged.div)
                    if merged.mod is not None and n <= merged.mod:
                        merged = Atom(merged.var, merged.div, None)
                    items = [t for k, t in enumerate(items) if k not in (i, j)] + [(c1, merged)]
                    changed = True
                    break
                if changed:
                    break
        return Index(const, tuple(sorted(items, key=_sort_key)))

    def add(self, *es: Index) -> Index:
        terms: list[Term] = []
        const = 0
        for e in es:
            const += e.const
            terms.extend(e.terms)
        return self.canon(const, terms)

    def scale(self, e: Index, k: int) -> Index:
        return self.canon(e.const * k, [(c * k, a) for c, a in e.terms])

    def offset(self, e: Index, k: int) -> Index:
        return Index(e.const + k, e.terms)

    def _aligned(self, e: Index, k: int) -> tuple[int, Index, Index] | None:
        """(m, E // m, E % m) for the largest m dividing k such that the terms whose coefficient m
        does not divide stay within [0, m): E // k is then (E // m) // (k / m) exactly."""
        cands = sorted({c for c, _ in e.terms if 1 < c < k and k % c == 0} | {k}, reverse=True)
        for m in cands:
            high: list[Term] = []
            low: list[Term] = []
            for c, a in e.terms:
                if c % m == 0:
                    high.append((c // m, a))
                elif c > 0 and m % c == 0 and isinstance(a, Atom) and (a.mod is None or a.mod % (m // c) == 0):
                    # split the atom at the boundary: a = (m / c) * (a / (m / c)) + a % (m / c)
                    q = m // c
                    high.append((1, Atom(a.var, a.div * q, None if a.mod is None else a.mod // q)))
                    low.append((c, Atom(a.var, a.div, q)))
                else:
                    low.append((c, a))
            q, rem = divmod(e.const, m)
            low_e = self.canon(rem, low)
            lo, hi = self.bounds(low_e)
            if lo >= 0 and hi < m:
                return m, self.canon(q, high), low_e
        return None

    def floordiv(self, e: Index, k: int) -> Index:
        if k == 1:
            return e
        lo, hi = self.bounds(e)
        if lo < 0:
            raise IndexError_("division of an index that can be negative")
        if hi < k:
            return Index()
        al = self._aligned(e, k)
        if al is not None:
            m, high, _ = al
            return high if m == k else self.floordiv(high, k // m)
        if len(e.terms) == 1 and e.const == 0 and e.terms[0][0] > 0 and k % e.terms[0][0] == 0:
            return self._atom_div(e.terms[0][1], k // e.terms[0][0])
        return self.canon(0, [(1, Opaque(e, "/", k))])

    def mod(self, e: Index, k: int) -> Index:
        if k == 1:
            return Index()
        lo, hi = self.bounds(e)
        if lo < 0:
            raise IndexError_("modulo of an index that can be negative")
        if hi < k:
            return e
        al = self._aligned(e, k)
        if al is not None:
            m, high, low = al
            return low if m == k else self.add(self.scale(self.mod(high, k // m), m), low)
        if len(e.terms) == 1 and e.const == 0 and e.terms[0][0] > 0 and k % e.terms[0][0] == 0:
            c = e.terms[0][0]
            return self.scale(self._atom_mod(e.terms[0][1], k // c), c)
        return self.canon(0, [(1, Opaque(e, "%", k))])

    def _atom_div(self, a: Atom | Opaque, m: int) -> Index:
        if isinstance(a, Atom) and (a.mod is None or a.mod % m == 0):
            return self.canon(0, [(1, Atom(a.var, a.div * m, None if a.mod is None else a.mod // m))])
        return self.canon(0, [(1, Opaque(self.canon(0, [(1, a)]), "/", m))])

    def _atom_mod(self, a: Atom | Opaque, m: int) -> Index:
        if isinstance(a, Atom) and (a.mod is None or a.mod % m == 0):
            return self.canon(0, [(1, Atom(a.var, a.div, m))])
        return self.canon(0, [(1, Opaque(self.canon(0, [(1, a)]), "%", m))])

    # ---- tensors ---------------------------------------------------------------------------------
    def delinearize(self, flat: Index, shape: tuple[int, ...] | list[int]) -> list[Index]:
        """The row-major index of flat position ``flat`` in ``shape``."""
        out = []
        inner = 1
        for size in reversed(shape):
            out.append(self.mod(self.floordiv(flat, inner), size) if size != 1 else Index())
            inner *= size
        return list(reversed(out))

    def linearize(self, idx: list[Index], shape: tuple[int, ...] | list[int]) -> Index:
        parts = []
        inner = 1
        for i, size in zip(reversed(idx), reversed(shape)):
            if size != 1:
                parts.append(self.scale(i, inner))
            inner *= size
        return self.add(*parts) if parts else Index()

    def offset_of(self, idx: list[Index], strides: list[int]) -> Index:
        return self.add(*[self.scale(i, s) for i, s in zip(idx, strides)]) if idx else Index()


def atom_c(a: Atom | Opaque) -> str:
    if isinstance(a, Opaque):
        return f"(({to_c(a.inner)}) {a.op} {a.k}LL)"
    v = a.var
    if a.div != 1:
        v = f"({v} / {a.div}LL)"
    if a.mod is not None:
        v = f"({v} % {a.mod}LL)"
    return v


def to_c(e: Index) -> str:
    parts = []
    for coef, a in e.terms:
        s = atom_c(a)
        parts.append(s if coef == 1 else f"{coef}LL * {s}")
    if e.const or not parts:
        parts.append(f"{e.const}LL")
    return " + ".join(parts)


def evaluate(e: Index, env: dict):
    """The index's value for loop variables given in ``env`` (ints or integer tensors)."""
    total = e.const
    for coef, a in e.terms:
        if isinstance(a, Opaque):
            x = evaluate(a.inner, env)
            v = x // a.k if a.op == "/" else x % a.k
        else:
            v = env[a.var]
            if a.div != 1:
                v = v // a.div
            if a.mod is not None:
                v = v % a.mod
        total = total + coef * v
    return total
