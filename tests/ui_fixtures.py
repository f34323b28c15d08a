"""Fixed data for the app's snapshot tests: six cards of tiny_decoder (tests/data/ui/cards, their
numbers fixed), a search history with every kind of node (passed, best, build failure with a
diagnostic, crash, noisy, an agent's node with its transcript), a promotion request, a promoted
kernel and a runtime status. Nothing measured, no time stamp, no temporary path: every run of the
app on this backend draws the same screens."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

from forge_tui.cards import Card, load_cards
from forge_tui.evaluator.result import BuildReport, Correctness, Diagnostic, EvalResult, InputSetResult, ProfileReport, TimeStats, Timing
from forge_tui.promotion import Request, evidence_of
from forge_tui.runtime.manifest import Entry, Evidence, Signature
from forge_tui.search.events import BestImproved, CardFinished, NodeAdded, ProposerFailed, SearchEvent, SearchStarted, SearchStopped
from forge_tui.ui.backend import Backend, BenchOutcome, NodeDetail, RewriteOutcome, Variant
from forge_tui.ui.describe_api import Draft

CARDS_DIR = Path(__file__).parent / "data" / "ui" / "cards"
RMS = "mod-RMSNorm-7be6e8fcef"
SOFTMAX = "_softmax-3b2a8c03bf"

SOURCE = """// forge-template: {"family": "rownorm", "params": {"vec": 4}}
#include <cmath>
#include <cstdint>
#include "forge_kernel.h"

static void row(const float* x, const float* w, float* y, int64_t n, float eps) {
    float acc = 0.f;
    for (int64_t i = 0; i < n; ++i) acc += x[i] * x[i];
    const float r = 1.f / std::sqrt(acc / n + eps);
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r * w[i];
}

extern "C" int forge_launch(const ForgeTensor* in, int n_in, ForgeTensor* out, int n_out,
                            const double* scalars, int n_scalars, void* stream) {
    const int64_t n = in[0].shape[in[0].ndim - 1];
    for (int64_t r = 0; r < in[0].numel / n; ++r)
        row((const float*)in[0].data + r * n, (const float*)in[1].data, (float*)out[0].data + r * n, n, 1e-6f);
    return 0;
}
"""
BROKEN = SOURCE.replace("acc += x[i] * x[i];", "acc += x[i] * x[i]\n    undefined_call(acc);")
DIFF = """diff --git a/candidate/candidate.cpp b/candidate/candidate.cpp
--- a/candidate/candidate.cpp
+++ b/candidate/candidate.cpp
@@ -1,4 +1,4 @@
-// forge-template: {"family": "rownorm", "params": {"vec": 1}}
+// forge-template: {"family": "rownorm", "params": {"vec": 4}}
 #include <cmath>
"""
SETS = ["captured-0", "random-0", "random-1", "random-2", "adversarial-overflow", "adversarial-special"]


def _stats(median: float, spread: float = 0.02) -> TimeStats:
    return TimeStats(median=median, mean=median, min=median * 0.98, max=median * 1.03, q1=median * (1 - spread),
                     q3=median * (1 + spread), n=20, spread=spread)


def passed(card: str, speedup: float, eager_us: float = 29.5) -> EvalResult:
    t = Timing(candidate=_stats(eager_us / speedup), eager=_stats(eager_us), speedup_vs_eager=_stats(speedup, 0.03),
               floor_us=0.2, fraction_of_floor=0.2 * speedup / eager_us)
    return EvalResult(status="passed", card=card, backend="cpu", speedup_vs_eager=speedup, time_us=eager_us / speedup,
                      correctness=Correctness(sets=[InputSetResult(name=s) for s in SETS]), timing=t,
                      build=BuildReport(ok=True, backend="cpu", key="k"),
                      profile=ProfileReport(available=False, reason="Nsight Compute: the cpu backend has no ncu"))


def build_failed(card: str) -> EvalResult:
    diags = [Diagnostic(file="candidate.cpp", line=9, column=33, severity="error", message="expected ';' before 'undefined_call'"),
             Diagnostic(file="candidate.cpp", line=10, column=5, severity="error",
                        message="'undefined_call' was not declared in this scope")]
    return EvalResult(status="build_failed", card=card, backend="cpu", reason="g++ failed: 2 errors",
                      build=BuildReport(ok=False, backend="cpu", key="k", reason="g++ failed: 2 errors", diagnostics=diags))


def crashed(card: str) -> EvalResult:
    return EvalResult(status="crash", card=card, backend="cpu", reason="the candidate crashed: SIGSEGV in forge_launch",
                      build=BuildReport(ok=True, backend="cpu", key="k"),
                      correctness=Correctness(sets=[InputSetResult(name="captured-0", ok=False)]))


TRANSCRIPT: list[dict[str, Any]] = [
    {"type": "start", "conversation": "c0007", "card": SOFTMAX, "parent": "root", "backend": "cpu",
     "provider": "anthropic", "model": "claude-sonnet-4-6", "limits": {"tool_calls": 40, "tokens": 600000}},
    {"type": "system", "text": "You write one C++ kernel for one operator card.\nRules: ..."},
    {"type": "message", "step": 0, "message": {"role": "user", "text": "Write a faster kernel for _softmax (2x4x256 fp32)."}},
    {"type": "query", "step": 1, "model": "claude-sonnet-4-6", "stop_reason": "tool_use", "cost_usd": 0.0042,
     "seconds": 3.2, "usage": {"input_tokens": 1200, "output_tokens": 300, "cache_read_tokens": 800,
                               "cache_write_tokens": 0}},
    {"type": "message", "step": 1, "message": {"role": "assistant", "text": "One pass with an online max.",
                                              "tool_calls": [{"id": "c1", "name": "compile", "arguments": {}}]}},
    {"type": "tool", "step": 1, "name": "compile", "call_id": "c1", "is_error": False, "seconds": 0.4},
    {"type": "message", "step": 1, "message": {"role": "tool", "results": [{"call_id": "c1", "name": "compile",
                                                                          "content": "ok: built in 0.4 s"}]}},
    {"type": "end", "step": 2, "reason": "submitted", "queries": 1, "cost_usd": 0.0042,
     "usage": {"input_tokens": 1200, "output_tokens": 300, "cache_read_tokens": 800, "cache_write_tokens": 0}},
]


def events() -> list[SearchEvent]:
    cfg = {"max_evals": 12, "max_wall_s": 600.0, "max_cost_usd": 5.0}
    return [
        SearchStarted(seq=1, cards=[RMS, SOFTMAX], backend="cpu", proposer="templates", config=cfg,
                      skipped={"mm-f5b665fc78": "no template serves it: left to the LLM agent"}),
        NodeAdded(seq=2, card=RMS, node="root", status="reference", speedup=1.0, move="eager PyTorch", proposer="reference"),
        NodeAdded(seq=3, card=SOFTMAX, node="root", status="reference", speedup=1.0, move="eager PyTorch", proposer="reference"),
        NodeAdded(seq=4, card=RMS, node="n0001", parent="root", status="passed", speedup=1.42, move="rownorm: vec=1",
                  proposer="templates"),
        BestImproved(seq=4, card=RMS, node="n0001", speedup=1.42, previous=1.0),
        NodeAdded(seq=5, card=RMS, node="n0002", parent="n0001", status="build_failed", move="rownorm: vec=8",
                  proposer="templates", reason="g++ failed: 2 errors"),
        NodeAdded(seq=6, card=SOFTMAX, node="n0001", parent="root", status="crash", move="agent: one pass",
                  proposer="agent", reason="the candidate crashed: SIGSEGV in forge_launch", cost_usd=0.0123),
        NodeAdded(seq=7, card=RMS, node="n0003", parent="n0001", status="passed", speedup=1.87, move="rownorm: vec=4",
                  proposer="templates"),
        BestImproved(seq=7, card=RMS, node="n0003", speedup=1.87, previous=1.42),
        NodeAdded(seq=8, card=SOFTMAX, node="n0002", parent="root", status="passed", speedup=1.21, move="agent: online max",
                  proposer="agent", cost_usd=0.0042),
        BestImproved(seq=8, card=SOFTMAX, node="n0002", speedup=1.21, previous=1.0),
        NodeAdded(seq=9, card=SOFTMAX, node="n0003", parent="n0002", status="noisy", move="agent: vectorised",
                  proposer="agent", reason="the machine was busy", cost_usd=0.0051),
        ProposerFailed(seq=10, card=SOFTMAX, node="n0002", reason="the provider answered 429", proposer="agent"),
        CardFinished(seq=11, card=RMS, reason="reached 90% of the roofline floor", evals=3, best_speedup=1.87),
        SearchStopped(seq=12, reason="evaluation budget spent (6 of 12)", evaluations=6, cost_usd=0.0216),
    ]


class ScriptedSearch:
    """A search that publishes scripted events on the app's bus. With a ``gate`` (a semaphore the
    test releases) it waits for the gate before each event; ``stubborn``: it ignores a stop, as an
    evaluation in flight does (the app must not wait for it)."""

    def __init__(self, bus: Any, events: list[SearchEvent], gate: threading.Semaphore | None = None,
                 stubborn: bool = False) -> None:
        self.bus = bus
        self.events = list(events)
        self.gate = gate
        self.stubborn = stubborn
        self.stop_reason: str | None = None
        self.running = threading.Event()
        self.done = threading.Event()
        self.abandoned = False

    def run(self, resume: bool = False) -> Any:
        self.running.set()
        try:
            for e in self.events:
                if self.gate is not None:
                    while not self.gate.acquire(timeout=0.02):
                        if self.stop_reason and not self.stubborn:
                            break
                if self.stop_reason and not self.stubborn:
                    break
                self.bus.publish(e)
        finally:
            self.done.set()
        stop = next((e.reason for e in self.events if isinstance(e, SearchStopped)), "every card is finished")
        return SimpleNamespace(stopped=self.stop_reason or stop)

    def retime(self) -> Any:
        return self.run()

    def request_stop(self, reason: str = "stopped by the user") -> None:
        self.stop_reason = reason

    def abandon(self, timeout: float = 0.5) -> bool:
        self.request_stop("the app quit")
        self.abandoned = True
        return True


def _way(way: str, batch: int, prefill: float, decode: float) -> dict[str, Any]:
    def st(median: float) -> dict[str, Any]:
        return {"median": median, "q1": median * 0.98, "q3": median * 1.02, "n": 3}

    return {"way": way, "batch": batch, "prefill_tok_s": st(prefill), "decode_tok_s": st(decode), "tokens": "identical",
            "agrees": True, "error": None}


GENERATION: dict[str, Any] = {
    "workload": "tiny_decoder", "device": "cpu", "dtype": "float32", "prompt_len": 16, "new_tokens": 8, "repeats": 3,
    "rows": [_way("eager", 1, 1200.0, 300.0), _way("eager+forge", 1, 1500.0, 600.0),
             _way("eager", 2, 2000.0, 500.0), _way("eager+forge", 2, 2100.0, 400.0)]}
"""A ``forge bench --generate`` result as the workspace stores it (``generation_result.py``)."""


class FixtureBackend(Backend):
    """The app's backend with fixed answers (no git, no evaluator, no model run); a search and the
    retimes publish scripted events (``script``, ``retime_rounds``)."""

    def __init__(self, root: Path = Path("fixture"), *, history: bool = True) -> None:
        super().__init__(root)
        self._cards = load_cards(CARDS_DIR)
        self.history = history
        self.approved: list[str] = []
        self.rejected: list[str] = []
        self.not_offered: list[tuple[str, str]] = []
        self.retimed: list[str] = []
        self.script: list[SearchEvent] = []
        """What a search started in the app publishes."""
        self.gate: threading.Semaphore | None = None
        self.stubborn = False
        self.searches: list[ScriptedSearch] = []
        self.settings: list[dict[str, Any]] = []
        """The settings each search was started with."""
        self.retime_rounds: list[list[SearchEvent]] | None = None
        """What each retime call publishes, round by round (None: the not_offered cards pass)."""
        self.requests_open = True
        """Whether the RMSNorm request is offered; ``offer_after_retime`` opens it after the rounds."""
        self.offer_after_retime = False
        self.generating_workload = False
        """Whether the workload generates: ``b`` then measures tokens/s (``bench_generate``)."""
        self.stored_generation: dict[str, Any] | None = None
        """The workspace's stored ``forge bench --generate`` result (``generation``)."""
        self.generation_runs = 0

    @contextmanager
    def search(self, *, settings: dict[str, Any], cards: list[str] | None, bus: Any, proposer: str = "auto",
               config: Path | None = None) -> Iterator[tuple[Any, bool, str]]:
        search = ScriptedSearch(bus, self.script, self.gate, self.stubborn)
        self.searches.append(search)
        self.settings.append(dict(settings))
        yield search, True, "proposer: scripted (fixture)"

    def title(self) -> str:
        return "tiny_decoder on CPU x86_64 (fixture)"

    def cards(self) -> list[Card]:
        return list(self._cards)

    def card(self, card_id: str) -> Card:
        return next(c for c in self._cards if c.id == card_id)

    def events(self) -> list[SearchEvent]:
        return events() if self.history else []

    def node_detail(self, card: str, node: str) -> NodeDetail:
        if node == "root":
            ref = "def reference(in0, in1):\n    return [in0 * torch.rsqrt(in0.pow(2).mean(-1, keepdim=True) + 1e-6)" \
                " * in1]\n"
            return NodeDetail(card, node, source=ref, language="python")
        results = {(RMS, "n0001"): passed(RMS, 1.42), (RMS, "n0002"): build_failed(RMS), (RMS, "n0003"): passed(RMS, 1.87),
                   (SOFTMAX, "n0001"): crashed(SOFTMAX), (SOFTMAX, "n0002"): passed(SOFTMAX, 1.21, 8.2)}
        parent = {"n0001": "root", "n0002": "n0001", "n0003": "n0001"}.get(node)
        return NodeDetail(card, node, parent=parent, source=BROKEN if node == "n0002" and card == RMS else SOURCE,
                          language="cuda", diff=DIFF, result=results.get((card, node)),
                          transcript=TRANSCRIPT if card == SOFTMAX else None)

    def requests(self) -> list[Request]:
        if RMS in self.approved or RMS in self.rejected or not self.requests_open:
            return []
        r = passed(RMS, 1.87)
        return [Request(self.card(RMS), "n0003", "n0001", "c0ffee", SOURCE, "cpu", r,
                        evidence_of("n0003", "c0ffee", "n0001", r, DIFF))]

    def unrequested(self, pending: list[Request] | None = None) -> list[tuple[str, str]]:
        return list(self.not_offered)

    def retime(self, config: Path | None = None, *, settings=None, bus=None, on_search=None) -> list[str]:
        """A scripted round (``retime_rounds``), or else: the machine is quiet now, every untimed
        kernel passes (and its card leaves the list)."""
        if self.retime_rounds is not None:
            events = self.retime_rounds.pop(0) if self.retime_rounds else []
            search = ScriptedSearch(bus, events)
            if on_search is not None:
                on_search(search)
            search.run()
            if not self.retime_rounds and self.offer_after_retime:
                self.requests_open = True
            return [e.line() for e in events if isinstance(e, NodeAdded)]
        lines = [f"retimed {card}: n0009 1.500x eager" for card, _ in self.not_offered]
        self.retimed.extend(card for card, _ in self.not_offered)
        self.not_offered = []
        return lines

    def untimed(self) -> int:
        return len(self.retime_rounds) if self.retime_rounds is not None else len(self.not_offered)

    def budget(self, config: Path | None = None, settings=None) -> tuple[int, int]:
        return 12, 4

    def retime_cards(self, stop=lambda: False, progress=lambda line: None):
        from forge_tui.profiler.retime import CardRetime

        return CardRetime()

    def approve(self, card: str) -> list[Entry]:
        self.approved.append(card)
        return [self._entry(card)]

    def reject(self, card: str, reason: str = "") -> None:
        self.rejected.append(card)

    def _entry(self, card: str, enabled: bool = True, why: str = "") -> Entry:
        c = self.card(card)
        return Entry(card=card, signature=Signature.of(c), source=f"{card}/kernel.cpp", source_sha256="0" * 64,
                     evidence=Evidence(node="n0003", commit="c0ffee", speedup_vs_eager=1.87), approved_by="fixture",
                     approved_at="2026-01-01T00:00:00", enabled=enabled, disabled_reason=why)

    def promoted(self) -> list[Entry]:
        return [self._entry(SOFTMAX, False, "the forward ran 41.0 µs with it and 39.5 µs without (forge bench, cpu)")] + \
            [self._entry(c) for c in self.approved]

    def runtime_status(self) -> dict[str, Any] | None:
        return {"pid": 4242, "started_at": "start", "updated_at": "now", "cards": [
            {"card": RMS, "kind": "module", "target": "RMSNorm", "active": True, "disabled_reason": "", "served": 120,
             "fallbacks": {"grad enabled": 3, "shape differs": 1}, "shadow_checks": 0, "dispatch_us": 2.5, "sites": []},
            {"card": SOFTMAX, "kind": "op", "target": "aten._softmax.default", "active": False,
             "disabled_reason": "kernel error: forge_launch returned 3", "served": 7, "fallbacks": {"disabled": 40},
             "shadow_checks": 0, "dispatch_us": None, "sites": []}]}

    def rewrites(self) -> RewriteOutcome:
        return RewriteOutcome(["fold: fixture.py: the model has no batch norm after a convolution to fold",
                               "experts: fixture.py: the model has no routed mixture-of-experts block"], 0)

    def generation(self) -> dict[str, Any] | None:
        return self.stored_generation

    def generates(self) -> bool:
        return self.generating_workload

    def bench_generate(self, repeats: int = 3) -> dict[str, Any] | None:
        self.generation_runs += 1
        if not self.generating_workload:
            return None
        self.stored_generation = GENERATION
        return GENERATION

    def bench(self, repeats: int = 10) -> BenchOutcome:
        return BenchOutcome([Variant("eager", 842.8, 830.1, 851.0, "-"), Variant("eager+forge", 771.0, 760.2, 780.4)],
                            paired=(1.088, 1.071, 1.102), bound=1.123,
                            bound_why=f"{RMS} 17.5% of eager's forward at 1.87x", outputs_agree={"eager+forge": None})


class FixtureDescriber:
    """Answers every description with the same draft."""

    def __init__(self) -> None:
        self.accepted: list[str] = []

    def draft(self, description: str) -> Draft:
        return Draft(description, "import torch\n\n\ndef reference(x):\n    return torch.nn.functional.gelu(x)\n\n\n"
                     "def example_inputs(device='cpu'):\n    return [torch.randn(64, 256, device=device)]\n",
                     "[0] 64x256 fp32 randn", "written by scripted fixture ($0.0000)\ngelu over (64, 256) fp32")

    def accept(self, draft: Draft) -> str:
        self.accepted.append(draft.description)
        return "mod-Gelu-0000000000"

    def discard(self, draft: Draft) -> None:
        pass


def screen_text(app: Any) -> str:
    """The app's screen as text, one line a row (its SVG screenshot's text, placed by column)."""
    import html
    import re

    svg = app.export_screenshot()
    rows: dict[float, list[tuple[float, str]]] = {}
    for x, y, t in re.findall(r'<text class="[^"]*" x="([\d.]+)" y="([\d.]+)"[^>]*>(.*?)</text>', svg):
        rows.setdefault(float(y), []).append((float(x), html.unescape(t)))
    out = []
    for y in sorted(rows):
        line = ""
        for x, t in sorted(rows[y]):
            line = line.ljust(int(round(x / 12.2))) + t.replace("\xa0", " ")
        out.append(line.rstrip())
    return "\n".join(out)
