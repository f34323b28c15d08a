"""A range card's generated source (forge_tui/codegen/ranged.py): the generator's exact-size code at
sampled sizes unified into one source whose sizes are read at run time, or refused in one line.

These tests drive ``RangeSource`` with a stand-in renderer whose code at each size is known, so
each rule (the fit, the size-1 variant, the refusals) is checked apart from the emitters; the real
cards of a generation are in test_generation_profile.py."""

from __future__ import annotations

import re

import pytest
import torch
from test_codegen import card_of

from forge_tui.cards import Card, DimRange
from forge_tui.codegen.ranged import RangeSource, skeleton
from forge_tui.codegen.values import Unsupported

LO, HI = 1, 40
PRE = "// prelude\n"


def _ranged_card() -> Card:
    card = card_of(lambda x: x * 2, torch.randn(1, 5, 16))
    weights = {"1": 30, "5": 2, "40": 1}
    return card.model_copy(update={"ranges": {
        "input0.dim1": DimRange(min=LO, max=HI, weights=weights),
        "output0.dim1": DimRange(min=LO, max=HI, weights=weights, same_as="input0.dim1")}})


def _source(body: str, launch: str) -> str:
    return (PRE + "__global__ void __launch_bounds__(256) k(float* p) {\n" + body + "\n}\n"
            "FORGE_EXPORT int forge_launch(const forge_tensor* in, int32_t n_in, forge_tensor* out, int32_t n_out,\n"
            "                              const forge_scalar* sc, int32_t n_sc, void* stream) {\n"
            "    if (n_in != 1 || n_out != 1) return 2;\n" + launch + "\n    return 0;\n}\n")


def _rows(card: Card) -> int:
    return card.inputs[0].shape[1]


def _render(body, launch=lambda n: "    k<<<1, 256, 0, s>>>((float*)out[0].data);", log=None):
    def render_at(card: Card) -> str:
        n = _rows(card)
        if log is not None:
            log.append(n)
        return _source(body(n), launch(n))
    return render_at


def _value(expr: str, n: int) -> int:
    return eval(expr.replace("LL", "").replace("fg_n0", str(n)))  # noqa: S307 - our own polynomial text


def test_sizes_that_change_become_polynomials_read_at_run_time():
    """Literals linear and quadratic in the size are fitted; the fit holds at every size of the
    range, sampled or not; a size of 1 whose code reads otherwise gets a variant of its own."""
    log: list[int] = []

    def body(n):
        if n == 1:  # a dimension of one drops out of the index, as the generator's algebra does
            return "    const int64_t NUMEL = 16;\n    p[0] = 7;"
        return f"    constexpr int64_t NUMEL = {16 * n}, SQ = {n * n + 3};\n    p[r % {n}LL] = 7;"

    src = RangeSource(_ranged_card(), _render(body, log=log), PRE).source()
    assert src.startswith(PRE) and src.count(PRE) == 1
    # the variant for a size of 1 first, the general one picked otherwise
    assert "if (in[0].shape[1] == 1) return fg_v0::fg_launch(" in src
    assert "return fg_v1::fg_launch(" in src
    general = src.split("namespace fg_v1 {", 1)[1]
    assert "__launch_bounds__(256) k(const int64_t fg_n0, float* p)" in general
    assert "k<<<1, 256, 0, s>>>(fg_n0, (float*)out[0].data)" in general
    assert "const int64_t fg_n0 = in[0].shape[1];\n    if (fg_n0 < 2 || fg_n0 > 40) return 2;" in general
    assert "constexpr" not in general  # a run-time value now
    numel = re.search(r"NUMEL = (\([^)]*\))", general).group(1)
    sq = re.search(r"SQ = (\([^)]*\))", general).group(1)
    mod = re.search(r"r % (\([^)]*\))", general).group(1)
    for n in range(2, HI + 1):  # every size, not only the sampled ones
        assert (_value(numel, n), _value(sq, n), _value(mod, n)) == (16 * n, n * n + 3, n)
    assert len(set(log)) < HI - LO  # sampled, not rendered at every size
    assert "fg_n0" not in src.split("namespace fg_v1 {", 1)[0]  # the size-1 variant is the exact code


def test_a_size_that_is_no_polynomial_refuses_the_range():
    """A block count rounded up (ceil(n / 4)) computed in Python is no polynomial of n."""
    launch = lambda n: f"    k<<<{-(-n // 4)}, 256, 0, s>>>((float*)out[0].data);"  # noqa: E731
    with pytest.raises(Unsupported, match=r"^range: a size in its code \(\d+\) is no polynomial of the ranged sizes$"):
        RangeSource(_ranged_card(), _render(lambda n: f"    p[{n}] = 1;", launch), PRE).source()


def test_a_size_the_compiler_needs_refuses_the_range():
    with pytest.raises(Unsupported, match=r"a ranged size is a compile-time constant of its code"):
        RangeSource(_ranged_card(), _render(lambda n: f"    float acc[{n}];\n    acc[0] = 1;"), PRE).source()
    with pytest.raises(Unsupported, match=r"a ranged size is a compile-time constant of its code"):
        RangeSource(_ranged_card(), _render(lambda n: "    p[0] = 1;",
                                            lambda n: f"    k<{n}><<<1, 256, 0, s>>>(p);"), PRE).source()


def test_code_of_another_form_inside_the_range_refuses_it_naming_the_size():
    body = lambda n: "    p[0] = 1;" if n % 2 else "    p[0] = 1;\n    p[1] = 2;"  # noqa: E731
    with pytest.raises(Unsupported) as err:
        RangeSource(_ranged_card(), _render(body), PRE).source()
    assert re.match(r"^range: its code takes another form at sizes input0\.dim1=\d+ than at input0\.dim1=\d+$",
                    str(err.value))


def test_the_skeleton_ignores_comments_and_keeps_suffixes():
    text, lits = skeleton("/* 20 rows */ x = 16LL * (r % 5LL) + 2u; // 7 more\n#pragma unroll\n")
    assert "rows" not in text and "more" not in text and "#pragma unroll" in text
    assert lits == [(16, "LL"), (5, "LL"), (2, "u")]
