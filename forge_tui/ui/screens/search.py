"""Search: the live tree per card and the selected node's panes (source, diff, nvcc errors, test
results, ncu report, agent transcript). The replay screen is the same screen over a replayed state."""

from __future__ import annotations

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Footer

from ...table import display_name
from ..backend import NodeDetail
from ..messages import NodeDetailLoaded
from ..state import SearchState
from ..widgets.common.guide import Guide
from ..widgets.common.nav import NavBar
from ..widgets.search.node_panes import NodePanes
from ..widgets.search.tree import SearchTree, TreePane
from .base import ForgeScreen


class TreeScreen(ForgeScreen):
    """A tree on the left, the chosen node's panes on the right."""

    BINDINGS = [
        Binding("c", "tab('source')", "Source"),
        Binding("d", "tab('diff')", "Diff"),
        Binding("e", "tab('errors')", "Errors"),
        Binding("r", "tab('tests')", "Tests"),
        Binding("n", "tab('ncu')", "ncu"),
        Binding("a", "tab('agent')", "Agent"),
        Binding("f", "only_card", "One card", show=False),
        Binding("left_square_bracket", "focus_tree", "Tree", show=False),
    ]
    MODE = "search"

    def __init__(self) -> None:
        super().__init__()
        self._details: dict[tuple[str, str], NodeDetail] = {}
        self._wanted: tuple[str, str] | None = None
        self._jump: tuple[str, str] | None = None
        """A build failure whose first error the source pane shows once its node is read."""
        self.only: str | None = None
        self.shown_state: SearchState = SearchState()

    def compose_top(self) -> ComposeResult:
        yield from ()

    def compose(self) -> ComposeResult:
        yield NavBar(self.MODE)
        yield Guide()
        yield from self.compose_top()
        with Horizontal(id="tree-main"):
            yield TreePane(id="tree-pane")
            yield NodePanes(id="node-panes")
        yield Footer()

    def show_state(self, state: SearchState) -> None:
        self.shown_state = state
        tree = self.query_one(SearchTree)
        tree.names = {c.id: display_name(c) for c in self.forge.cards}
        tree.show_state(state, self.only)

    def action_tab(self, tab: str) -> None:
        panes = self.query_one(NodePanes)
        panes.active = tab
        if tab == "errors":
            panes.focus_errors()  # Enter on the first diagnostic shows it in the source at once

    def action_focus_tree(self) -> None:
        self.query_one(SearchTree).focus()

    def action_only_card(self) -> None:
        """Show only the card under the cursor (again: every card)."""
        tree = self.query_one(SearchTree)
        data = tree.cursor_node.data if tree.cursor_node is not None else None
        self.only = None if self.only is not None or data is None else data[0]
        self.show_state(self.shown_state)

    def focus_card(self, card: str) -> None:
        self.only = card
        self.show_state(self.shown_state)
        tree = self.query_one(SearchTree)
        tree.focus()
        self.call_after_refresh(lambda: tree.move_cursor_to_line(0) if tree.last_line >= 0 else None)

    def on_tree_node_selected(self, event: SearchTree.NodeSelected[tuple[str, str | None]]) -> None:
        """Enter on a node that failed to build: its source, at the first error's line."""
        data = event.node.data
        if data is None or data[1] is None:
            return
        n = self.shown_state.node(data[0], data[1])
        if n is not None and n.status == "build_failed":
            self._jump = (data[0], data[1])
            detail = self._details.get(self._jump)
            if detail is not None:
                self._jump = None
                self.query_one(NodePanes).show_first_error()

    # ---- node details, read from git in a worker -----------------------------------------------
    def on_search_tree_node_chosen(self, event: SearchTree.NodeChosen) -> None:
        key = (event.card, event.node)
        self._wanted = key
        if key in self._details:
            self.query_one(NodePanes).show(self._details[key])
        else:
            self.load_detail(event.card, event.node)

    @work(thread=True, exclusive=True, group="node-detail", exit_on_error=False, name="reading the node from git")
    def load_detail(self, card: str, node: str) -> None:
        detail = self.forge.backend.node_detail(card, node)
        self.post_message(NodeDetailLoaded(detail))

    def on_node_detail_loaded(self, message: NodeDetailLoaded) -> None:
        d = message.detail
        self._details[(d.card, d.node)] = d
        if self._wanted == (d.card, d.node):
            self.query_one(NodePanes).show(d)
            if self._jump == (d.card, d.node):
                self._jump = None
                self.query_one(NodePanes).show_first_error()


class SearchScreen(TreeScreen):
    MODE = "search"

    def on_mount(self) -> None:
        self.forge.state_changed.subscribe(self, self.show_state)
        self.show_state(self.forge.state)
        self.query_one(SearchTree).focus()
