"""Approvals: the queue of promotion requests with their evidence; y approves (the kernel is built
for this machine and committed to the workspace's main), n rejects (recorded, not asked again),
t times again the kernels a busy machine left untimed (``forge retime``). With no request waiting,
each searched card says why it has none."""

from __future__ import annotations

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Footer

from ..messages import RequestsLoaded
from ..widgets.approvals.evidence import EvidenceView
from ..widgets.approvals.queue import RequestQueue
from ..widgets.common.guide import Guide
from ..widgets.common.nav import NavBar
from .base import ForgeScreen


class ApprovalsScreen(ForgeScreen):
    BINDINGS = [
        Binding("y", "decide(True)", "Approve"),
        Binding("n", "decide(False)", "Reject"),
        Binding("r", "reload", "Refresh"),
        Binding("t", "app.retime", "Time again"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.busy: str | None = None
        self.not_offered: list[tuple[str, str]] = []
        """Searched cards with no request, and why (shown while the queue is empty)."""

    def compose(self) -> ComposeResult:
        yield NavBar("approvals")
        yield Guide()
        with Horizontal(id="approvals-main"):
            yield RequestQueue(id="request-queue")
            yield EvidenceView(id="evidence")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(EvidenceView).show(None, "reading the promotion requests ...")
        self.forge.requests_stale.subscribe(self, lambda _: self.action_reload())
        self.query_one(RequestQueue).focus()  # the first read: on_screen_resume, which follows the mount

    def on_screen_resume(self) -> None:
        self.action_reload()

    def action_reload(self) -> None:
        if self.busy is None:
            self.load()

    @work(thread=True, exclusive=True, group="requests", exit_on_error=False, name="reading the promotion requests")
    def load(self) -> None:
        b = self.forge.backend
        reqs = b.requests()
        self.post_message(RequestsLoaded(reqs, b.promoted(), b.unrequested(reqs)))

    def on_requests_loaded(self, message: RequestsLoaded) -> None:
        self.forge.note_requests(message.requests, message.promoted)
        self.not_offered = message.not_offered
        self.query_one(RequestQueue).show(message.requests)

    def on_request_queue_request_highlighted(self, event: RequestQueue.RequestHighlighted) -> None:
        note = ""
        if event.request is None and self.not_offered:
            note = "no promotion request waiting: a request is a card's best node faster than eager\n\n" + \
                "\n".join(f"{card}: {why}" for card, why in self.not_offered) + \
                "\n\nt times the untimed kernels again (those a busy machine timed as noisy)"
        self.query_one(EvidenceView).show(event.request, note)

    def action_decide(self, approve: bool) -> None:
        req = self.query_one(RequestQueue).current
        if req is None:
            self.notify("no request to decide", severity="warning")
            return
        if self.busy is not None:
            self.notify(f"still {self.busy}", severity="warning")
            return
        self.busy = f"{'approving' if approve else 'rejecting'} {req.card.id}"
        self.query_one(EvidenceView).show(None, f"{self.busy} ... (building it for this machine)" if approve else self.busy)
        self.decide(req.card.id, approve)

    @work(thread=True, exclusive=True, group="decide", exit_on_error=False, name="deciding a promotion")
    def decide(self, card: str, approve: bool) -> None:
        try:
            if approve:
                done = self.forge.backend.approve(card)
                line = "; ".join(f"approved {e.card}: {e.evidence.node} "
                                 f"{(e.evidence.speedup_vs_eager or 0):.3f}x eager" for e in done)
            else:
                self.forge.backend.reject(card)
                line = f"rejected {card}"
            self.app.call_from_thread(self.forge.note, line)
        finally:
            self.app.call_from_thread(self._decided)

    def _decided(self) -> None:
        self.busy = None
        self.action_reload()
