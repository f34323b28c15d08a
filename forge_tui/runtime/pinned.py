"""Parameters pointed at slices of one stacked tensor, and the proof that they still are.

A rewrite that computes several linears in one product (routed experts in a grouped pass,
sibling linears in one batched product) reads their weights as one ``[groups, rows, cols]``
tensor. Installing copies each weight into its slice and then points the parameter at it
(``param.data = view``): the same ``Parameter`` objects, the same values, no second copy; loading
weights in place writes through the views. ``intact()`` says whether the model still holds those
objects where they were (no module, linear or weight replaced) with their data where it was put;
``release()`` gives every parameter its own storage again (undo).
"""

from __future__ import annotations

from typing import Any


class Pinned:
    """Parameters re-pointed at views, and the object links the rewrite relies on."""

    def __init__(self) -> None:
        self.links: list[tuple[dict[str, Any], str, Any]] = []
        """(a dict, a key, the object it held): the module tree as installed."""
        self.sizes: list[tuple[dict[str, Any], int]] = []
        """(a dict, its length): a module list that must keep its length."""
        self.params: list[Any] = []
        self.ptrs: tuple[int, ...] = ()
        self.repointed = False

    def link(self, d: dict[str, Any], key: str) -> Any:
        """Record that ``d[key]`` must stay the object it is now; returns it."""
        obj = d.get(key)
        self.links.append((d, key, obj))
        return obj

    def size(self, d: dict[str, Any]) -> None:
        self.sizes.append((d, len(d)))

    def repoint(self, views: list[Any]) -> None:
        """Point ``self.params`` at ``views`` (one each), once every copy is made: a failure
        before leaves the parameters as they were."""
        for p, v in zip(self.params, views, strict=True):
            p.data = v
        self.ptrs = tuple(p.data_ptr() for p in self.params)
        self.repointed = True

    def intact(self) -> bool:
        if any(len(d) != n for d, n in self.sizes):
            return False
        if any(d.get(k) is not obj for d, k, obj in self.links):
            return False
        return not self.repointed or tuple(p.data_ptr() for p in self.params) == self.ptrs

    def release(self) -> None:
        """Give each re-pointed parameter its own storage again (undo)."""
        if self.repointed:
            import torch

            with torch.no_grad():
                mine = set(self.ptrs)
                for p in self.params:
                    if p.data_ptr() in mine:
                        p.data = p.data.clone()


def owns_storage(t: Any) -> bool:
    """Whether tensor ``t`` is the whole of its storage (no view of another, no tied weight):
    what re-pointing it may assume."""
    return t.untyped_storage().nbytes() == t.numel() * t.element_size() and t.storage_offset() == 0
