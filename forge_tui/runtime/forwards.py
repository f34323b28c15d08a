"""Forwards set on module instances, and undone to what each instance had before."""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import torch


@dataclass
class _Replaced:
    """One forward forge set on a module instance, and what the instance had before."""

    module: Any
    had_own: bool
    """Whether the instance had a forward attribute of its own (else its class's served)."""
    old: Any
    new: Callable[..., Any]
    taken_out: bool = False

    def put_back(self) -> None:
        # the instance's dict, as nn.Module.__setattr__ sets a plain callable (not its checks)
        if self.had_own:
            self.module.__dict__["forward"] = self.old
        else:
            self.module.__dict__.pop("forward", None)


class ReplacedForwards:
    """Forwards set on module instances, each undone to what the instance had before (its own
    forward attribute, or its class's), last first."""

    def __init__(self) -> None:
        self._restore: list[_Replaced] = []

    def replace(self, module: Any, new: Callable[..., Any]) -> None:
        self._restore.append(_Replaced(module, "forward" in module.__dict__, module.__dict__.get("forward"), new))
        module.forward = new

    def modules(self) -> list[Any]:
        return [r.module for r in self._restore]

    def take_out(self, module: Any, new: Callable[..., Any]) -> bool:
        """Put back what ``module`` had before forge set ``new`` on it, where ``new`` is still its
        forward, or where the forward is a wrapper forge set over ``new`` that can call another
        (``outside_scope``'s, a scope's child leaving its interception): that wrapper then calls
        the module's own forward, and undo puts back what the module had before ``new``. Whether
        it was taken out."""
        live = [r for r in self._restore if r.module is module and not r.taken_out]
        inner = next((r for r in reversed(live) if r.new is new), None)
        if inner is None:
            return False
        current = module.__dict__.get("forward")
        if current is new:
            inner.taken_out = True
            inner.put_back()
            return True
        outer = next((r for r in reversed(live) if r.new is current), None)
        retarget = getattr(current, "forge_retarget", None)
        if outer is None or outer.old is not new or retarget is None:
            return False
        retarget(inner.old if inner.had_own else types.MethodType(type(module).forward, module))
        outer.old, outer.had_own = inner.old, inner.had_own
        inner.taken_out = True
        return True

    def suspend(self, keep: Callable[..., Any]) -> None:
        """Put back what every module had before forge, but ``keep`` (the forward that resumes
        them), until ``resume``: the model then runs as written (``Passthrough``)."""
        for r in reversed(self._restore):
            if not r.taken_out and r.new is not keep:
                d = r.module.__dict__  # ``put_back``, without a call an entry
                if r.had_own:
                    d["forward"] = r.old
                elif "forward" in d:
                    del d["forward"]

    def resume(self, keep: Callable[..., Any]) -> None:
        """Forge's forwards set again where ``suspend`` put them back."""
        for r in self._restore:
            if not r.taken_out and r.new is not keep:
                r.module.__dict__["forward"] = r.new

    def restore(self) -> None:
        for r in reversed(self._restore):
            if not r.taken_out:
                r.put_back()
        self._restore.clear()


def called_children(module: "torch.nn.Module") -> list["torch.nn.Module"]:
    """The submodules ``module``'s forward calls directly: its children, and the items of its
    ModuleList and ModuleDict children (containers, never called themselves)."""
    import torch

    out: list[torch.nn.Module] = []
    for child in module.children():
        if isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            out.extend(called_children(child))
        else:
            out.append(child)
    return out
