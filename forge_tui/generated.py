"""``forge_tui.generate``: a searched kernel for one function, used like the function.

    ln_gelu = forge_tui.generate(lambda x, w, b: F.gelu(F.layer_norm(x, (4096,), w, b)), [x, w, b])
    y = ln_gelu(x, w, b)        # the kernel where the call matches the card, else the function
    print(ln_gelu)              # which kernel is active, calls served and fallen back, and why

With a Python function and example inputs no LLM is needed: the function is wrapped in a leaf
module and profiled in this process into a workspace whose one card is the function
(``funcards.py``); the search runs on that card (``Session.search``: the configured proposer,
the templates without an agent); the best passing kernel is promoted when it clears the evidence
rule (``promotion.AutoRule``, as ``forge approve --auto``); the returned ``GeneratedOp`` runs it
through the runtime (``runtime.apply`` on the wrapper: the guard's device, dtype, shape and stride
checks, the non-tensor arguments, gradients, kernel errors, shadow checks) and calls the function
wherever the kernel does not apply. With a description, the LLM agent first drafts the reference
(``describe.py``); a library call cannot ask for approval, so that needs ``yes=True``.

A workspace that already has the card (the same program, shapes, dtypes and strides) is reused: a
promoted kernel is used as it is, a recorded search is resumed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .errors import ForgeError

if TYPE_CHECKING:
    from .agent.messages import Provider
    from .cards import Card
    from .promotion import AutoRule
    from .runtime.apply import Applied
    from .runtime.manifest import Entry
    from .search.runner import SearchSummary
    from .workspace import Workspace


class GeneratedOp:
    """A function with a searched kernel: call it like the function."""

    def __init__(self, fn: Callable[..., Any], card: "Card", workspace: "Workspace", *, name: str, device: str,
                 why_no_kernel: str = "", shadow_every: int = 0, only_faster: bool = True,
                 search: "SearchSummary | None" = None) -> None:
        from .funcards import reference_module
        from .promotion import manifest
        from .runtime.apply import apply

        self.reference = fn
        """The function (or the drafted reference): what runs wherever the kernel does not."""
        self.card = card
        self.workspace = workspace
        self.name = name
        self.device = device
        self.search = search
        self.entry: Entry | None = None
        self._applied: Applied | None = None
        self._why = why_no_kernel
        self._calls = 0
        self._unserved: Counter[str] = Counter()
        self._module = reference_module(fn, name)
        entry = manifest(workspace).entries.get(card.id)
        if entry is None:
            self._why = why_no_kernel or "no kernel is promoted for its card"
            return
        self.entry = entry
        applied = apply(self._module, workspace, device=device, cards=[card.id], shadow_every=shadow_every,
                        only_faster=only_faster)
        if card.id not in applied.guards:
            applied.undo()
            self._why = applied.skipped.get(card.id, "the runtime did not install it")
            return
        self._applied = applied

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._calls += 1
        if self._applied is None:
            self._unserved["no kernel" if self.entry is None else "kernel not used"] += 1
            return self.reference(*args, **kwargs)
        return self._module(*args, **kwargs)

    # ---- what it did -------------------------------------------------------------------------------
    @property
    def kernel(self) -> str | None:
        """The promoted kernel (its search node), or None."""
        return self.entry.evidence.node if self.entry is not None else None

    def status(self) -> dict[str, Any]:
        """The kernel (node, speedup, active or why not) and the calls: how many the kernel served,
        how many ran the reference, and why."""
        served, fallbacks, active, why = 0, Counter(self._unserved), False, self._why
        if self._applied is not None:
            self._applied.board.settle()  # the counts module cards keep themselves (``status.Tally``)
            st = self._applied.guards[self.card.id].status
            served, active = st.served, st.active
            fallbacks.update(st.fallbacks)
            why = "" if st.active else st.disabled_reason
        ev = self.entry.evidence if self.entry is not None else None
        return {"name": self.name, "card": self.card.id, "workspace": str(self.workspace.root), "kernel": self.kernel,
                "speedup_vs_eager": ev.speedup_vs_eager if ev is not None else None, "active": active,
                "why_not": why, "calls": self._calls, "served": served, "fallbacks": dict(fallbacks)}

    def __repr__(self) -> str:
        s = self.status()
        if s["kernel"] is None:
            head = f"no kernel ({s['why_not']})"
        else:
            sp = f", {s['speedup_vs_eager']:.2f}x eager" if s["speedup_vs_eager"] else ""
            head = f"kernel {s['kernel']} of {s['card']}{sp}: " + ("active" if s["active"] else f"not used ({s['why_not']})")
        fb = "; ".join(f"{n} {why}" for why, n in sorted(s["fallbacks"].items(), key=lambda x: -x[1]))
        calls = f"{s['calls']} calls, {s['served']} by the kernel" + (f", fell back: {fb}" if fb else "")
        return f"<GeneratedOp {self.name}: {head}; {calls}>"

    def close(self) -> None:
        """Write the runtime's status file one last time (``forge status`` shows it)."""
        if self._applied is not None:
            self._applied.board.write()


def _load_reference(source: str, folder: Path) -> Any:
    """The drafted reference module, loaded in this process (after approval)."""
    import hashlib
    import importlib.util
    import sys

    name = "forge_reference_" + hashlib.sha256(source.encode()).hexdigest()[:16]
    if name in sys.modules:
        return sys.modules[name]
    path = folder / "reference.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ForgeError(f"the reference cannot be loaded from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the drafted code may raise anything
        del sys.modules[name]
        raise ForgeError(f"the reference fails to load: {type(exc).__name__}: {exc}") from None
    return module


def _device_of(inputs: Sequence[Any]) -> str | None:
    for x in inputs:
        dev = getattr(x, "device", None)
        if dev is not None:
            return str(dev.type)
    return None


def generate(fn_or_description: Callable[..., Any] | str, example_inputs: Sequence[Any] | None = None, *,
             workspace: Path | str | None = None, device: str | None = None, proposer: str = "auto",
             max_evals: int = 20, yes: bool = False, config: Path | str | None = None,
             provider: "Provider | None" = None, rule: "AutoRule | None" = None, only_faster: bool = True,
             shadow_every: int = 0, progress: Callable[[str], None] = lambda msg: None) -> GeneratedOp:
    """A ``GeneratedOp`` for a function (with its example inputs) or a description of one.

    ``workspace``: where the card lives (default ``workspaces/<name>``; an existing workspace gets
    the card added, or reuses it). ``device``: default the inputs' (else CUDA where there is one).
    ``proposer``: as ``forge search --proposer``. ``max_evals``: the search's evaluations (0: no
    search; the promoted kernel, if any, is used). ``yes``: accept the agent's reference for a
    description without review (required: there is no approval in a library call). ``config``: a
    forge.toml (default ./forge.toml, then the workspace's). ``provider``: the model that drafts the
    reference (default the configured one). ``rule``: what a kernel must show to be promoted
    (default ``AutoRule()``: 1.05x eager, spread under 10%). ``only_faster`` and ``shadow_every``:
    as ``runtime.apply``."""
    from .funcards import class_name, function_stub, function_workload, profile_to_card, snake
    from .promotion import AutoRule

    cfg_path = Path(config) if config is not None else None
    tmp = Path(tempfile.mkdtemp(prefix="forge-generate-"))
    try:
        if isinstance(fn_or_description, str):
            if not yes:
                raise ForgeError("generate() from a description has the LLM agent write the reference, and a library "
                                 "call cannot ask you to approve it: pass yes=True to accept it unreviewed, or run "
                                 "forge new to review it first")
            fn, inputs, made, name = _from_description(fn_or_description, example_inputs, tmp, workspace=workspace,
                                                       device=device, config=cfg_path, provider=provider,
                                                       progress=progress)
        else:
            fn = fn_or_description
            if not callable(fn):
                raise ForgeError(f"generate() takes a function or a description, not {type(fn).__name__}")
            if example_inputs is None or isinstance(example_inputs, (str, bytes)) or not hasattr(example_inputs, "__len__"):
                raise ForgeError("generate(fn, example_inputs): the function's example inputs are needed "
                                 "(a list of its arguments, e.g. [x, weight, bias])")
            inputs = list(example_inputs)
            raw = getattr(fn, "__name__", type(fn).__name__)
            name = class_name(raw if raw != "<lambda>" else "")
            stub = tmp / f"{snake(name)}.py"
            stub.write_text(function_stub(fn, name))
            target = Path(workspace) if workspace is not None else Path("workspaces") / snake(name)
            made = profile_to_card(function_workload(fn, inputs, name, stub), target, name,
                                   device=device or _device_of(inputs), config_path=cfg_path, progress=progress)
        ws, card = made.workspace, made.card
        summary, why = _search_and_promote(ws, card, cfg_path, proposer=proposer, max_evals=max_evals,
                                           rule=rule or AutoRule(), progress=progress)
        return GeneratedOp(fn, card, ws, name=name, device=card.device or "cpu", why_no_kernel=why,
                           shadow_every=shadow_every, only_faster=only_faster, search=summary)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _from_description(description: str, example_inputs: Sequence[Any] | None, tmp: Path, *,
                      workspace: Path | str | None, device: str | None, config: Path | None,
                      provider: "Provider | None", progress: Callable[[str], None]) -> tuple[Any, list[Any], Any, str]:
    from .config import discover_config
    from .describe import accept, default_workspace, draft_reference

    cfg, _ = discover_config(config, Path(workspace) if workspace is not None else None)
    progress("the LLM agent is writing the reference")
    draft = draft_reference(description, cfg, provider=provider, workdir=tmp / "draft", environ=os.environ)
    if not draft.ok:
        raise ForgeError(f"the LLM agent wrote no usable reference for {description!r}: {draft.why_not}")
    made = accept(draft, Path(workspace) if workspace is not None else default_workspace(description), device=device,
                  config_path=config, approved_by="forge_tui.generate(yes=True)", progress=progress)
    module = _load_reference(draft.source, tmp)
    dev = made.card.device or "cpu"
    inputs = list(example_inputs) if example_inputs is not None else list(module.example_inputs(device=dev))
    return module.reference, inputs, made, draft.name


def _search_and_promote(ws: "Workspace", card: "Card", config: Path | None, *, proposer: str, max_evals: int,
                        rule: "AutoRule", progress: Callable[[str], None]) -> tuple["SearchSummary | None", str]:
    """Search the card (unless a kernel is promoted already) and promote its best kernel where the
    rule allows; (the search's summary, why there is no kernel or "")."""
    from .promotion import approve, manifest
    from .session import Session

    entry = manifest(ws).entries.get(card.id)
    if entry is not None and entry.enabled:
        return None, ""
    if max_evals <= 0:
        return None, "no kernel is promoted for its card, and max_evals=0 ran no search"
    session = Session.open(ws.root, config).with_search_settings(max_evals=max_evals, evals_per_card=max_evals)
    progress(f"searching {card.id} ({max_evals} evaluations at most)")
    with session.search(proposer=proposer, backend=session.profiled_backend(), cards=[card.id]) as search:
        summary = search.run(resume=True)  # continues what is recorded, else starts fresh
    if summary.git_failure:
        raise ForgeError(f"the search failed: {summary.git_failure}")
    try:  # the best passed kernel, faster than eager or not: the rule decides
        done, left = approve(ws, [card.id], auto=rule, by=f"forge_tui.generate (min {rule.min_speedup}x, max spread "
                             f"{rule.max_spread})", faster_only=False)
    except ForgeError:
        done, left = [], []
    if done:
        return summary, ""
    if left:
        return summary, f"its best kernel, {left[0][0].node}, was not promoted: {left[0][1]}"
    why = summary.skipped.get(card.id) or summary.finished.get(card.id) or summary.stopped
    return summary, f"the search found no passing kernel ({summary.evaluations} evaluations; {why})"
