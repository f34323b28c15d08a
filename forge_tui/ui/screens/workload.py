"""Workload: the op table (sortable, filterable), the card pane, the search's budgets and its
controls (start or resume, pause, stop), and the event log."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Input, Static

from ...generation_result import summary_line
from ...profiler.trust import shares_note
from ...table import ordered
from ..state import SearchState
from ..widgets.common.event_log import EventLog
from ..widgets.common.guide import Guide
from ..widgets.common.nav import NavBar
from ..widgets.workload.budget import BudgetPanel
from ..widgets.workload.card_detail import CardDetail
from ..widgets.workload.op_table import OpTable
from .base import ForgeScreen


class WorkloadScreen(ForgeScreen):
    BINDINGS = [
        Binding("g", "app.start_search", "Search"),
        Binding("p", "app.pause_search", "Pause"),
        Binding("x", "app.stop_search", "Stop"),
        Binding("slash", "filter_text", "Filter"),
        Binding("m", "kind('module')", "Modules", show=False),
        Binding("o", "kind('op')", "Ops", show=False),
        Binding("c", "kind('chain')", "Chains", show=False),
        Binding("a", "kind(None)", "All", show=False),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]

    def compose(self) -> ComposeResult:
        yield NavBar("workload")
        yield Guide()
        with Vertical(id="workload-main"):
            yield Input(placeholder="filter cards (Enter keeps it, Escape clears)", id="card-filter")
            yield OpTable(id="optable")
            yield Static("", id="table-note")
            yield BudgetPanel()
            with Horizontal(id="workload-bottom"):
                yield CardDetail(id="detail")
                yield EventLog(id="status")
        yield Footer()

    def on_mount(self) -> None:
        app = self.forge
        self.query_one("#card-filter", Input).display = False
        app.cards_changed.subscribe(self, self._cards)
        app.state_changed.subscribe(self, self._state)
        app.cards_status_changed.subscribe(self, lambda _: self._note())
        app.bench_changed.subscribe(self, lambda _: self._note())
        self._cards(app.cards)
        self._state(app.state)
        self.query_one(OpTable).focus()

    def _cards(self, cards: list) -> None:  # type: ignore[type-arg]
        table = self.query_one(OpTable)
        table.picks = set(self.forge.picks)
        self.query_one(CardDetail).set_cards(cards, self.forge.offline)
        table.show_cards(cards)
        self._note()

    def _note(self) -> None:
        """At most four lines under the table: why the shares add up past the forward, which
        cards are not trusted, and when they are timed again; where the workload generates, the
        tokens/s of the last ``forge bench --generate`` (``b`` on 3 measures them)."""
        cards = self.forge.cards
        nested = {c.id for c, inside in ordered(cards) if inside}
        total = sum(c.share or 0.0 for c in cards if c.id not in nested and c.share)
        status = self.forge.cards_status
        parts = [f"shares add up to {100 * total:.1f}% of the forward" if total > 1.0 else "", status]
        if total > 1.0 and not status:
            parts[1] = shares_note(cards, nested) or ""
            parts[0] = ""
        text = ": ".join(p for p in parts if p)
        if self.forge.generation is not None:
            text = "\n".join(t for t in (text, summary_line(self.forge.generation)) if t)
        note = self.query_one("#table-note", Static)
        note.update(text)
        note.display = bool(text)

    def _state(self, state: "SearchState") -> None:
        self.query_one(OpTable).show_state(state)
        self.query_one(BudgetPanel).show(state)

    def on_op_table_card_highlighted(self, event: OpTable.CardHighlighted) -> None:
        self.query_one(CardDetail).show(event.card)

    def on_op_table_picks_changed(self, event: OpTable.PicksChanged) -> None:
        self.forge.set_picks(event.picks)

    def action_kind(self, kind: str | None) -> None:
        self.query_one(OpTable).set_filter(kind=kind)

    def action_filter_text(self) -> None:
        box = self.query_one("#card-filter", Input)
        box.display = True
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "card-filter":
            table = self.query_one(OpTable)
            table.set_filter(kind=table.kind, text=event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "card-filter":
            self.query_one(OpTable).focus()
            event.input.display = bool(event.value)

    def action_clear_filter(self) -> None:
        box = self.query_one("#card-filter", Input)
        box.value = ""
        box.display = False
        table = self.query_one(OpTable)
        table.set_filter(kind=None, text="")
        table.focus()

    def on_data_table_row_selected(self, event: OpTable.RowSelected) -> None:
        """Enter on a card: its tree on the search screen."""
        card = self.query_one(OpTable).current
        if card is not None:
            self.forge.show_card_tree(card.id)
