"""``forge bench WORKLOAD -w WS --generate N``: greedy generation timed four ways.

The ways, each on a copy of the workload's model:

- ``eager``: the model's own generation (a transformers model's ``generate()`` with its default
  dynamic cache; a forge example's plain loop over a cache that grows at every step);
- ``eager+forge``: ``apply(model, ws)`` (``mode="cuda_graph"`` on CUDA) and ``GreedyRunner``: a
  static cache, the decode step replayed from a CUDA graph per batch bucket (op by op, with the
  reason, where it cannot be; with nothing promoted this is the host-free step alone);
- ``compile``: the documented fast path: a static cache and ``torch.compile`` of the forward
  (``compile_mode``, ``dynamic=False``; transformers models through ``generate()`` with a
  ``StaticCache`` passed in, ``fullgraph=True``; the examples in the same plain loop over a
  ``StaticKV``). The cache has the N-token generation's slots in every call of a batch, so that
  each batch's prefill and step compile once and the rounds time no recompile;
- ``compile+forge``: the same, ``apply(model, ws, mode="torch_compile")`` first and the forward
  compiled with ``backend=applied.backend()``.

Prefill and decode are timed apart without reaching into any way's loop: each round times a
generation of one token (the prefill and its argmax: "prefill") and one of N tokens; the decode's
time is their difference in the same round (N - 1 steps). Rounds are interleaved in a shuffled
order (``timing.Timer``); medians with quartiles over the rounds. The first call of each way (its
compiles and captures included) is timed apart, before the rounds. Tokens are checked against
eager's: identical, or else judged teacher-forced against the model in fp32: each way's model and
eager's run one forward over the prompt and eager's tokens, and their logits at every position are
set against the fp32 model's (``Forced``): the way is as accurate as eager where its mean gap is
at most ``ACCURACY_SLACK`` times eager's and its argmax is fp32's wherever fp32's top-2 margin is
clear. Along eager's tokens, a way whose own tokens went another way after a near tie is judged on
the same inputs as eager, not on a trajectory of its own. Batch-1 decode is set against the bandwidth limit: the
bytes a step must read (the weights it uses and the KV cache at the generation's mean length)
over the device's measured copy bandwidth.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ForgeError
from ..timing import Stats, Timer

WAYS = ("eager", "eager+forge", "compile", "compile+forge")
ACCURACY_SLACK = 1.1
"""A way whose tokens differ from eager's agrees when its mean logit gap to the fp32 model along
eager's tokens is at most this many times eager's (or under ``GAP_FLOOR``), its argmax fp32's at
every clear position."""
GAP_FLOOR = 1e-4
"""Gaps under this fraction of the fp32 logits' largest magnitude are rounding alone (an fp32 model
against itself, its reductions in another order)."""


@dataclass
class WayResult:
    way: str
    batch: int
    prefill_tok_s: Stats | None = None
    decode_tok_s: Stats | None = None
    decode_vs_eager: Stats | None = None
    """Per round, eager's decode time over this way's (paired)."""
    first_call_s: float | None = None
    tokens: str = ""
    """"identical", or how they differ and how accurate they are against the model in fp32."""
    agrees: bool = True
    steps: str = ""
    """How its decode steps ran (graphs, op by op and why, compiled)."""
    bandwidth_pct: float | None = None
    error: str | None = None
    compiled: dict[str, int] = field(default_factory=dict)
    """What Dynamo did during a compiled way's first call at this batch (``_dynamo_counts``)."""

    def to_json(self) -> dict[str, Any]:
        def st(s: Stats | None) -> dict[str, Any] | None:
            return s.to_json() if s is not None else None

        return {"way": self.way, "batch": self.batch, "prefill_tok_s": st(self.prefill_tok_s),
                "decode_tok_s": st(self.decode_tok_s), "decode_vs_eager": st(self.decode_vs_eager),
                "first_call_s": self.first_call_s, "tokens": self.tokens, "agrees": self.agrees, "steps": self.steps,
                "bandwidth_pct": self.bandwidth_pct, "error": self.error, "compiled": self.compiled}


@dataclass
class GenBenchResult:
    workload: str
    device: str
    dtype: str
    prompt_len: int
    new_tokens: int
    repeats: int
    rows: list[WayResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    bandwidth: dict[str, Any] = field(default_factory=dict)
    """"bandwidth_Bps" (copy, read + written), and per batch 1 the bytes a step reads."""
    runner: dict[str, Any] = field(default_factory=dict)
    """The eager + forge runner's status (``RunnerStatus.to_json``)."""
    switched_off: dict[str, str] = field(default_factory=dict)
    """Cards switched off for compiled models by this bench, with why (``switch_off_under_compile``)."""

    def to_json(self) -> dict[str, Any]:
        return {"workload": self.workload, "device": self.device, "dtype": self.dtype, "prompt_len": self.prompt_len,
                "new_tokens": self.new_tokens, "repeats": self.repeats, "rows": [r.to_json() for r in self.rows],
                "notes": self.notes, "bandwidth": self.bandwidth, "runner": self.runner,
                "switched_off": self.switched_off}

    def mismatches(self) -> list[str]:
        """The forge ways whose tokens do not agree with eager's (by the rule above)."""
        return [f"{r.way} at batch {r.batch}: {r.tokens}" for r in self.rows if "forge" in r.way and not r.agrees]

    def table(self) -> str:
        head = (f"generate: {self.workload} on {self.device} ({self.dtype}), prompts of {self.prompt_len} tokens, "
                f"{self.new_tokens} new tokens, greedy; tokens/s medians [q1 - q3] of {self.repeats} interleaved rounds")
        lines = [head, f"{'batch':>5s}  {'way':14s} {'prefill tok/s':>24s} {'decode tok/s':>24s} {'vs eager':>8s} "
                 f"{'first call':>10s}  tokens; decode steps"]

        def fmt(s: Stats | None) -> str:
            return f"{s.median:9.1f} [{s.q1:.0f} - {s.q3:.0f}]" if s is not None else "-"

        for r in self.rows:
            if r.error:
                lines.append(f"{r.batch:5d}  {r.way:14s} failed: {r.error}")
                continue
            ratio = f"{r.decode_vs_eager.median:.2f}x" if r.decode_vs_eager is not None else "-"
            first = f"{r.first_call_s:.2f} s" if r.first_call_s is not None else "-"
            lines.append(f"{r.batch:5d}  {r.way:14s} {fmt(r.prefill_tok_s):>24s} {fmt(r.decode_tok_s):>24s} {ratio:>8s} "
                         f"{first:>10s}  {r.tokens}; {r.steps}")
        bw = self.bandwidth
        for r in self.rows:
            if r.bandwidth_pct is not None:
                lines.append(f"batch-1 decode, {r.way}: {r.bandwidth_pct:.1f}% of the bandwidth limit "
                             f"({bw['weight_bytes'] / 1e9:.3f} GB of weights and {bw['kv_bytes'] / 1e6:.2f} MB of KV "
                             f"cache read a step, over {bw['bandwidth_Bps'] / 1e12:.2f} TB/s measured copy bandwidth, "
                             f"read + written: at most {bw['limit_tok_s']:.0f} tokens/s)")
        served = {k: v for k, v in self.runner.get("served", {}).items() if v}
        if served:  # calls counted where guards run: op by op, and once per capture
            lines.append("forge served: " + ", ".join(f"{k} x{v}" for k, v in served.items()))
        lines.extend(self.notes)
        return "\n".join(lines)


# ---- the ways --------------------------------------------------------------------------------
def _prompt_len(module: Any, device: str, inputs: list[Any]) -> int:
    value = getattr(module, "PROMPT_LEN", None)
    if isinstance(value, dict):
        value = value.get(device)
    if isinstance(value, int):
        return value
    return int(inputs[0].shape[1])


def _prompts(vocab: int, batch: int, length: int, device: str) -> Any:
    import torch

    g = torch.Generator().manual_seed(1000 + batch)
    return torch.randint(0, vocab, (batch, length), generator=g).to(device)


@dataclass
class _Way:
    name: str
    model: Any
    generate: Callable[[Any, int], Any]
    steps: Callable[[], str]
    applied: Any = None
    logits: Callable[[Any], Any] | None = None
    """The way's model's logits at every position of a sequence, one forward (``_judge``)."""
    backend: Any = None
    """forge's torch.compile backend (``compile+forge``), whose sites and failures are reported."""


def _said(text: str) -> Callable[[], str]:
    return lambda: text


def _no_eos(gen: Any) -> None:
    """A transformers model's ``generate()`` makes every token asked for (no EOS stop)."""
    cfg = getattr(gen, "generation_config", None)
    if cfg is not None:
        cfg.eos_token_id = None


def _sized(static_generate: Callable[..., Any], max_len: int) -> Callable[[Any, int], Any]:
    """A compiled way's generation with a cache of ``max_len`` slots whatever it asks for: the
    one-token and the N-token generations of a batch run the same shapes."""
    return lambda ids, n: static_generate(ids, n, max_len)


def _build_ways(model: Any, ws: Any, device: str, max_len: int, batches: tuple[int, ...], with_compile: bool,
                compile_mode: str, compile_backend: str, notes: list[str], promoted: bool,
                only_faster: bool = True) -> tuple[dict[str, _Way], Any]:
    import torch

    from ..runtime.apply import apply
    from .adapters import HFAdapter, adapter_for, generating_module
    from .runner import GreedyRunner

    ways: dict[str, _Way] = {}
    eager_ad = adapter_for(model)
    _no_eos(eager_ad.model)
    ways["eager"] = _Way("eager", model, eager_ad.eager_generate, lambda: (
        "generate(), dynamic cache, op by op" if isinstance(eager_ad, HFAdapter) else "plain loop, growing cache, op by op"),
        logits=eager_ad.full_logits)

    fm = copy.deepcopy(model)
    applied = None
    if promoted:
        applied = apply(fm, ws, mode="cuda_graph" if device == "cuda" else "inference", device=device,
                        only_faster=only_faster)
        notes.extend(f"eager+forge: not used {c}: {why}" for c, why in applied.skipped.items())
    ad = adapter_for(fm)
    _no_eos(ad.model)
    runner = GreedyRunner(ad, max_len=max_len, buckets=batches)
    ways["eager+forge"] = _Way("eager+forge", fm, lambda ids, n: runner.generate(ids, n).tokens, runner.status().line, applied,
                               ad.full_logits)

    if with_compile:
        hf = isinstance(eager_ad, HFAdapter)
        how = (f"static cache, torch.compile(forward, mode={compile_mode!r}, dynamic=False{', fullgraph=True' if hf else ''}"
               f"{'' if compile_backend == 'inductor' else f', backend={compile_backend!r}'})")
        for name in ("compile", "compile+forge"):
            cm = copy.deepcopy(model)
            cap = None
            if name == "compile+forge" and promoted:
                cap = apply(cm, ws, mode="torch_compile", device=device, only_faster=only_faster)
                notes.extend(f"compile+forge: not used {c}: {why}" for c, why in cap.skipped.items())
                notes.extend(_vs_compile(ws, [*cap.guards, *cap.experts]))
            gen = generating_module(cm)
            _no_eos(gen)
            # dynamic=False: each batch's prefill and step get graphs of their own, as a compile per
            # batch size would (Dynamo's automatic dynamic shapes would otherwise recompile the
            # second batch's graphs with a symbolic batch, or leave frames to run eagerly)
            kw: dict[str, Any] = {"backend": cap.backend(compile_backend)} if cap is not None else (
                {"mode": compile_mode, "backend": compile_backend} if compile_backend == "inductor" else {"backend": compile_backend})
            kw["dynamic"] = False
            if hf:
                gen.forward = torch.compile(gen.forward, fullgraph=True, **kw)
                cad: Any = HFAdapter(gen)
            else:
                cad = adapter_for(gen).with_forward(torch.compile(gen, **kw))
            text = how if cap is None else how.split(", torch.compile")[0] + ", torch.compile(forward, backend=applied.backend())"
            ways[name] = _Way(name, cm, _sized(cad.static_generate, max_len), _said(text), cap, cad.full_logits,
                              kw["backend"] if cap is not None else None)
    return ways, runner


def _vs_compile(ws: Any, cards: list[str]) -> list[str]:
    """compile+forge's cards, each with its isolated ratio over torch.compile's own code for it,
    as its evidence has it (the evaluator's, or ``forge experts``' timing of the compiled block),
    or that none was measured."""
    from ..runtime.apply import _resolve
    from ..runtime.manifest import Manifest

    entries = Manifest.load(_resolve(ws)[0]).entries
    out = []
    for card in sorted(cards):
        ev = entries[card].evidence
        if ev.speedup_vs_compile is None:
            out.append(f"compile+forge: {card}: its ratio over torch.compile's own code for it was not measured")
        else:
            basis = {"device": "device time", "latency": "call latency"}.get(ev.compile_basis or "", "call latency")
            out.append(f"compile+forge: {card}: {ev.speedup_vs_compile:.2f}x torch.compile's own code for it "
                       f"alone ({basis})")
    return out


def _dynamo_counts() -> dict[str, int]:
    """Dynamo's running counts: frames it was given and those it compiled, graphs compiled, graph
    breaks. A frame given and not compiled (a recompile limit reached, say) runs eagerly."""
    from torch._dynamo.utils import counters

    return {"frames": int(counters["frames"]["total"]), "frames_compiled": int(counters["frames"]["ok"]),
            "graphs": int(counters["stats"]["unique_graphs"]), "graph_breaks": int(sum(counters["graph_break"].values()))}


def _compiled_note(way: str, batch: int, before: dict[str, int], after: dict[str, int], backend: Any) -> tuple[dict[str, int], str]:
    """What a compiled way's first call at ``batch`` compiled, in one line, and the op and chain
    cards ``backend`` rewrote into its graphs (sites per card, rewrites that failed) where it is
    forge's. Module cards are not among them: they enter the graphs as the custom ops their
    modules' forwards call, and the served counts list them."""
    d = {k: after[k] - before[k] for k in after}
    eager = d["frames"] - d["frames_compiled"]
    line = (f"{way} at batch {batch}: the first call compiled {d['graphs']} graph(s) from {d['frames_compiled']} of "
            f"{d['frames']} frame(s), {d['graph_breaks']} graph break(s)"
            + (f"; {eager} frame(s) ran eagerly" if eager > 0 else ""))
    if backend is not None:
        sites = ", ".join(f"{c} x{n}" for c, n in sorted(backend.sites.items())) or "none"
        line += f"; op and chain cards rewritten into its graphs so far: {sites}"
        if backend.failed:
            line += f"; rewrites that failed: {len(backend.failed)} (first: {backend.failed[0][:160]})"
    return d, line


# ---- tokens against eager's ------------------------------------------------------------------
@dataclass
class Forced:
    """A way's logits along eager's tokens against the fp32 model's, at every position."""

    mean_gap: float
    """The mean of |logit - fp32's logit| over every position and vocabulary entry."""
    max_gap: float
    clear: int
    """Positions where fp32's top-2 margin is clear (``forced``'s ``margin``)."""
    agree: int
    """Of those, the positions where the way's argmax is fp32's."""


def forced(logits: Any, ref: Any, margin: float) -> Forced:
    """``logits`` (a way's, [batch, positions, vocab]) against ``ref`` (the fp32 model's, the same
    positions): a position is clear where fp32's best logit leads its second by more than
    ``margin``."""
    gap = (logits.float() - ref).abs()
    top2 = ref.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > margin
    agree = (logits.float().argmax(dim=-1) == ref.argmax(dim=-1)) & clear
    return Forced(float(gap.mean()), float(gap.max()), int(clear.sum()), int(agree.sum()))


def _judge(tokens: dict[str, Any], eager: Any, eager_again: Any, logits: Callable[[str], Any],
           ref: Callable[[], Any]) -> dict[str, tuple[str, bool]]:
    """Per way: what its tokens are against eager's, and whether that agrees. ``logits(way)``: the
    way's logits along eager's tokens (one forward over the prompt and eager's tokens), ``ref()``:
    the fp32 model's, asked for only where a way's tokens differ from eager's. A position is clear
    where fp32's top-2 margin exceeds twice eager's largest gap (eager's own error cannot swap
    them) and ``GAP_FLOOR``."""
    import torch

    out: dict[str, tuple[str, bool]] = {}
    stable = torch.equal(eager, eager_again)
    out["eager"] = ("eager's two runs identical" if stable else "eager's two runs differ", True)
    base: list[tuple[Any, Forced, float, float]] = []
    for name, t in tokens.items():
        if name == "eager":
            continue
        if t.shape == eager.shape and torch.equal(t, eager):
            out[name] = ("identical", True)
            continue
        if t.shape != eager.shape:
            out[name] = (f"shape {tuple(t.shape)} where eager's is {tuple(eager.shape)}", False)
            continue
        rows = (t != eager).any(dim=1)
        first = int((t != eager).int().argmax(dim=1)[rows].min())
        said = f"differ from step {first + 1} in {int(rows.sum())} of {t.shape[0]} rows"
        if not base:
            r, el = ref().float(), logits("eager")
            floor = GAP_FLOOR * float(r.abs().max())
            margin = max(2 * float((el.float() - r).abs().max()), floor)
            base.append((r, forced(el, r, margin), margin, floor))
        r, e, margin, floor = base[0]
        w = forced(logits(name), r, margin)
        ok = (w.mean_gap <= ACCURACY_SLACK * e.mean_gap or w.mean_gap <= floor) and w.agree == w.clear
        out[name] = (f"{said}; along eager's tokens {'as accurate as' if ok else 'LESS accurate than'} eager against "
                     f"fp32 (logit gap mean {w.mean_gap:.3g}, max {w.max_gap:.3g}; eager's {e.mean_gap:.3g}, "
                     f"{e.max_gap:.3g}; fp32's argmax at {w.agree} of {w.clear} clear positions)", ok)
    return out


# ---- the bench -------------------------------------------------------------------------------
class _WayFailed(Exception):
    def __init__(self, way: str, exc: BaseException) -> None:
        super().__init__(way)
        self.way, self.exc = way, exc


def _rounds(timer: Timer, live: dict[str, "_Way"], prompt: Any, new_tokens: int,
            rows: dict[str, WayResult]) -> dict[str, list[float]]:
    """The interleaved rounds: per way, a one-token and an N-token generation (µs samples). A way
    that raises in them gets the error on its row, and the rounds run again without it (eager's
    failing ends the bench)."""
    live = dict(live)
    while True:
        fns: dict[str, Callable[[], Any]] = {}
        for name, way in live.items():
            for key, n in (("1", 1), ("n", new_tokens)):
                def run(w: _Way = way, k: int = n, who: str = name) -> Any:
                    try:
                        return w.generate(prompt, k)
                    except Exception as exc:  # noqa: BLE001 - named, then the way is left out
                        raise _WayFailed(who, exc) from exc
                fns[f"{name}|{key}"] = run
        try:
            return timer.time(fns, subtract_overhead=False)[1]
        except _WayFailed as failed:
            if failed.way == "eager":
                raise failed.exc from None
            first = str(failed.exc).strip().splitlines()[0][:300] if str(failed.exc).strip() else ""
            rows[failed.way].error = f"while timed: {type(failed.exc).__name__}: {first}"
            del live[failed.way]


RECOMPILE_LIMIT = 64
"""Dynamo's recompile limit while the bench runs. It counts the graphs of one function, and both
compiled ways compile the same one: a transformers model's forward wrapper, which ``generate``
calls with other arguments at the prefill and at a step. Two ways at two batches reach Dynamo's
default of 8, after which a compile under ``fullgraph=True`` raises."""


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def generate_bench(workload_spec: Any, workspace: Any, new_tokens: int, *, batches: tuple[int, ...] | None = None,
                   device: str | None = None, dtype: Any = None, repeats: int = 5, with_compile: bool = True,
                   compile_mode: str = "default", compile_backend: str = "inductor",
                   bandwidth_Bps: float | None = None, only_faster: bool = True,
                   switch_off: bool = False) -> GenBenchResult:
    """Greedy generation four ways (see the module's docstring). ``bandwidth_Bps``: the copy
    bandwidth to set batch-1 decode against (default: measured on CUDA, none elsewhere).
    ``only_faster``: ``apply``'s (False: every promoted kernel is used, whatever it is timed at
    here, as the tests ask where they check what is served rather than how fast).
    ``switch_off``: the kernels torch.compile + forge served are switched off for compiled models
    where its generations were not faster than torch.compile's at every batch
    (``switch_off_under_compile``; ``forge bench --generate`` unless ``--keep-slower``)."""
    import time

    import torch

    from ..workload import load_workload, resolve_device
    from ..workspace import Workspace
    from .adapters import adapter_for

    if new_tokens < 2:
        raise ForgeError(f"--generate needs at least 2 new tokens (a prefill and a decode step), got {new_tokens}")
    if repeats < 1:
        raise ForgeError(f"repeats must be at least 1, got {repeats}")
    ws = workspace if isinstance(workspace, Workspace) else Workspace.open(workspace)
    dev = resolve_device(device)
    wl = load_workload(workload_spec)
    model, inputs = wl.build(dev, dtype)
    model.eval()
    adapter_for(model)  # a model that cannot generate is refused before anything is built
    if batches is None:
        batches = tuple(getattr(wl.module, "BATCHES", (1, 8)))
    if not batches or any(b < 1 for b in batches):
        raise ForgeError(f"batch sizes must be positive, got {batches}")
    batches = tuple(sorted(set(batches)))
    plen = _prompt_len(wl.module, dev, inputs)
    del inputs
    param = next(model.parameters())
    res = GenBenchResult(wl.name, dev, str(param.dtype).removeprefix("torch."), plen, new_tokens, repeats)
    from ..promotion import kernels_dir
    from ..runtime.manifest import Manifest

    promoted = bool(Manifest.load(kernels_dir(ws)).entries)
    if not promoted:
        res.notes.append("nothing promoted in the workspace: eager + forge is the host-free decode step alone"
                         + (", and torch.compile + forge is torch.compile" if with_compile else ""))
    max_len = plen + new_tokens
    ways, runner = _build_ways(model, ws, dev, max_len, batches, with_compile, compile_mode, compile_backend, res.notes,
                               promoted, only_faster)
    vocab = adapter_for(model).vocab()
    model32: list[Any] = []

    def along(seq: Any) -> tuple[Callable[[str], Any], Callable[[], Any]]:
        """(a way's logits, the fp32 model's) at every position of ``seq`` but its last (the
        prompt and eager's tokens: each position's logits chose the token after it)."""
        def of(name: str) -> Any:
            fn = ways[name].logits
            assert fn is not None
            return fn(seq)[:, :-1, :]

        def ref() -> Any:
            if not model32:
                model32.append(copy.deepcopy(model).float())
            return adapter_for(model32[0]).full_logits(seq)[:, :-1, :].float()
        return of, ref

    bw = bandwidth_Bps
    if bw is None and dev == "cuda":
        from ..roofline import ceilings

        bw = float(ceilings(dev)["bandwidth_Bps"])
    import torch._dynamo

    # per batch, the N-token generations' times: torch.compile's and torch.compile + forge's
    whole: dict[int, tuple[list[float], list[float]]] = {}
    compile_served: list[str] = []
    dynamo_limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = max(dynamo_limit, RECOMPILE_LIMIT)
    try:
        with torch.no_grad():
            for batch in batches:
                prompt = _prompts(vocab, batch, plen, dev)
                rows = {name: WayResult(name, batch) for name in ways}
                tokens: dict[str, Any] = {}
                for name, way in ways.items():  # first calls: compiles and captures included
                    try:
                        _sync(dev)
                        before = _dynamo_counts()
                        t0 = time.perf_counter()
                        tokens[name] = way.generate(prompt, new_tokens)
                        _sync(dev)
                        rows[name].first_call_s = time.perf_counter() - t0
                        if name.startswith("compile"):
                            rows[name].compiled, said = _compiled_note(name, batch, before, _dynamo_counts(), way.backend)
                            res.notes.append(said)
                    except Exception as exc:  # noqa: BLE001 - one way failing leaves the others their rows
                        if name == "eager":
                            raise
                        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
                        rows[name].error = f"{type(exc).__name__}: {first}"
                live = {n: w for n, w in ways.items() if rows[n].error is None}
                again = ways["eager"].generate(prompt, new_tokens)
                of, ref = along(torch.cat([prompt, tokens["eager"]], dim=1))
                for name, (said, ok) in _judge(tokens, tokens["eager"], again, of, ref).items():
                    rows[name].tokens, rows[name].agrees = said, ok
                timer = Timer(dev, warmup=1, repeats=repeats, cold_l2=False)
                before = _dynamo_counts()
                raw = _rounds(timer, live, prompt, new_tokens, rows)
                live = {n: w for n, w in live.items() if rows[n].error is None}
                if "compile" in live and "compile+forge" in live:
                    whole[batch] = (raw["compile|n"], raw["compile+forge|n"])
                timed = {k: v - before[k] for k, v in _dynamo_counts().items()}
                if timed["graphs"] or timed["frames"] != timed["frames_compiled"]:
                    res.notes.append(f"batch {batch}: while timed, Dynamo compiled {timed['graphs']} more graph(s) and "
                                     f"ran {timed['frames'] - timed['frames_compiled']} frame(s) eagerly "
                                     "(a first call did not settle every shape)")
                # a round whose N-token generation took no longer than its one-token one (a machine
                # busy elsewhere) resolves no decode time: it is left out of the decode figures
                decode_us = {n: [b - a if b > a else None for a, b in zip(raw[f"{n}|1"], raw[f"{n}|n"])] for n in live}
                for name in live:
                    r = rows[name]
                    r.prefill_tok_s = Stats.from_samples([batch * plen / (us * 1e-6) for us in raw[f"{name}|1"]])
                    own = [us for us in decode_us[name] if us is not None]
                    pairs = [(e, w) for e, w in zip(decode_us["eager"], decode_us[name]) if e is not None and w is not None]
                    r.decode_tok_s = Stats.from_samples([batch * (new_tokens - 1) / (us * 1e-6) for us in own]) if own else None
                    r.decode_vs_eager = Stats.from_samples([e / w for e, w in pairs]) if pairs else None
                    if len(own) < repeats:
                        res.notes.append(f"{name} at batch {batch}: {repeats - len(own)} of {repeats} rounds resolved no "
                                         "decode time (N tokens no slower than one), left out")
                    r.steps = ways[name].steps()
                if batch == 1 and bw:
                    ad = adapter_for(model)
                    wb = ad.weight_bytes(1)
                    kvb = int(ad.kv_bytes_per_token() * (plen + new_tokens / 2))
                    limit = bw / (wb + kvb)
                    res.bandwidth = {"bandwidth_Bps": bw, "weight_bytes": wb, "kv_bytes": kvb, "limit_tok_s": limit,
                                     "kv_length": plen + new_tokens / 2}
                    for name in live:
                        st = rows[name].decode_tok_s
                        rows[name].bandwidth_pct = 100 * st.median / limit if st is not None else None
                res.rows.extend(rows.values())
    finally:
        torch._dynamo.config.recompile_limit = dynamo_limit
        res.runner = runner.status().to_json()
        for way in ways.values():
            if way.applied is not None:
                cards = way.applied.status()["cards"]
                res.runner.setdefault("served", {}).update({f"{way.name}: {c['card']}": c["served"] for c in cards})
                if way.name == "compile+forge":
                    compile_served = [c["card"] for c in cards if c["served"]]
                way.applied.undo()
    why = runner.status().why_not_graphed
    if why:
        res.notes.append(f"eager+forge decode steps run op by op: {why}")
    if switch_off and only_faster and compile_served:
        res.switched_off = switch_off_under_compile(ws, compile_served, whole, new_tokens, dev)
        res.notes.extend(f"compile+forge: {card} switched off for compiled models: {why}"
                         for card, why in res.switched_off.items())
    return res


def switch_off_under_compile(ws: Any, served: list[str], whole: dict[int, tuple[list[float], list[float]]],
                             new_tokens: int, dev: str) -> dict[str, str]:
    """torch.compile + forge never below torch.compile, in generation as in the forward
    (``e2e.switch_off_compile``): unless its N-token generations were faster than torch.compile's
    at every batch timed (the paired ratio's median above 1, ``not_faster``), every kernel it served
    is switched off for compiled models (eager models keep them), all at once, in one commit of the
    workspace. A kernel faster than eager alone can still cost a compiled step more than it saves
    (inductor fuses the ops it replaces with their neighbours, and the call leaves inductor's code).
    Returns the cards switched off, with why."""
    from ..e2e.switch_off import not_faster
    from ..e2e.switch_off_compile import disable_under_compile
    from ..promotion import kernels_dir
    from ..runtime.manifest import Manifest
    from ..timing import paired_ratio

    slower = []
    for batch, (c, cf) in sorted(whole.items()):
        if not any(b > 0 for b in cf):  # no round timed: no verdict
            continue
        ratio = paired_ratio(c, cf)
        if not_faster(ratio):
            slower.append(f"{ratio.median:.3f}x [{ratio.q1:.3f}, {ratio.q3:.3f}] at batch {batch}")
    if not slower:
        return {}
    why = (f"torch.compile + forge's {new_tokens}-token generations were not faster than torch.compile's: " +
           ", ".join(slower) + f" (its speed over torch.compile's, paired rounds, forge bench --generate, {dev})")
    man = Manifest.load(kernels_dir(ws))
    cards = [c for c in served if c in man.entries]
    if cards:
        disable_under_compile(ws, man, cards, why)
    return {card: why for card in cards}
