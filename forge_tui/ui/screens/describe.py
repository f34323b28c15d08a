"""Describe an op: type a description, review the generated reference and inputs, approve, and it
becomes a card (the core's ``forge new``, through ``describe_api``)."""

from __future__ import annotations

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.widgets import Footer, Input

from ...errors import ForgeError
from ..describe_api import Describer, Draft, Unavailable
from ..widgets.common.guide import Guide
from ..widgets.common.nav import NavBar
from ..widgets.describe.form import DescribeForm
from .base import ForgeScreen


class DraftReady(Message):
    def __init__(self, draft: Draft) -> None:
        super().__init__()
        self.draft = draft


class DescriberFound(Message):
    def __init__(self, describer: Describer) -> None:
        super().__init__()
        self.describer = describer


class DescribeScreen(ForgeScreen):
    AUTO_FOCUS = ""  # the description box takes keys only once asked for (i): 1-7 still switch screens
    BINDINGS = [
        Binding("y", "accept", "Make it a card"),
        Binding("n", "discard", "Discard"),
        Binding("i", "focus_input", "Describe"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.draft: Draft | None = None

    def compose(self) -> ComposeResult:
        yield NavBar("describe")
        yield Guide()
        yield DescribeForm()
        yield Footer()

    def on_mount(self) -> None:
        box = self.query_one("#describe-input", Input)
        box.disabled = True  # until the agent is known to be there
        if self.forge.describer is None:
            self.query_one(DescribeForm).status("checking whether the LLM agent is available ...")
            self.find_describer()
        else:
            self._ready(self.forge.describer)

    @work(thread=True, exclusive=True, group="describe", exit_on_error=False, name="finding the LLM agent")
    def find_describer(self) -> None:
        from ..describe_api import describer_for

        self.post_message(DescriberFound(describer_for(self.forge.workspace_path, self.forge.config_path)))

    def on_describer_found(self, message: DescriberFound) -> None:
        self.forge.describer = message.describer
        self._ready(message.describer)

    def _ready(self, describer: Describer) -> None:
        form = self.query_one(DescribeForm)
        box = self.query_one("#describe-input", Input)
        if isinstance(describer, Unavailable):
            box.disabled = True
            box.placeholder = "not available here (see below)"
            form.status(f"not available here: {describer.why}")
        else:
            box.disabled = False
            form.status("i: type a description, Enter asks the agent for a reference and example inputs; "
                        "y makes the reviewed draft a card, n discards it; Escape leaves the box")
        self.refresh_bindings()

    @property
    def describer(self) -> Describer:
        d = self.forge.describer
        if d is None:
            raise ForgeError("the LLM agent is still being looked for")
        return d

    def key_escape(self) -> None:
        self.set_focus(None)

    def action_leave_box(self) -> None:
        self.set_focus(None)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("accept", "discard"):
            if self.draft is None or isinstance(self.focused, Input):
                return False
            return self.draft.ok or action == "discard"
        if action == "focus_input":
            return not self.query_one("#describe-input", Input).disabled
        return True

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        self.query_one(DescribeForm).status(f"asking for a reference and inputs for: {text} ...")
        self.ask(text)

    @work(thread=True, exclusive=True, group="describe", exit_on_error=False, name="describing the op")
    def ask(self, text: str) -> None:
        self.post_message(DraftReady(self.describer.draft(text)))

    def on_draft_ready(self, message: DraftReady) -> None:
        self.draft = message.draft
        form = self.query_one(DescribeForm)
        form.show(self.draft)
        form.status("review the reference and inputs: y makes it a card, n discards it" if self.draft.ok else
                    "this draft cannot become a card (see above): n discards it, i describes again")
        self.query_one("#describe-reference").focus()
        self.refresh_bindings()

    def action_focus_input(self) -> None:
        self.query_one("#describe-input", Input).focus()

    def action_discard(self) -> None:
        if self.draft is not None:
            self.describer.discard(self.draft)
        self.draft = None
        form = self.query_one(DescribeForm)
        form.show(None)
        form.status("discarded")
        self.refresh_bindings()

    def action_accept(self) -> None:
        if self.draft is not None:
            self.accept(self.draft)

    @work(thread=True, exclusive=True, group="describe", exit_on_error=False, name="making the card")
    def accept(self, draft: Draft) -> None:
        card = self.describer.accept(draft)
        self.app.call_from_thread(self._accepted, card)

    def _accepted(self, card: str) -> None:
        self.draft = None
        form = self.query_one(DescribeForm)
        form.show(None)
        form.status(f"card {card} added to the workspace: it is in the op table (1), ready to search")
        self.forge.note(f"described op became card {card}")
        self.forge.reload_cards()
        self.refresh_bindings()
