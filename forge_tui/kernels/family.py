"""What a family of kernels is (the proposer's unit: recognise a card, name its parameter axes,
render a candidate for one configuration) and the header line every rendered candidate carries."""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from ..cards import Card
from .device import DEFAULT_DEVICE, DeviceProps

HEADER_RE = re.compile(r"^// forge-template: (\{.*\})$", re.M)


@dataclass
class Match:
    family: str
    card: Card
    info: dict[str, Any] = field(default_factory=dict)


class Family(ABC):
    """A template family: recognises the cards it serves, names the parameter axes that make sense
    for a card's shape and renders a complete candidate for any configuration (one value an axis).

    What depends on the GPU (which modes exist, first choices, grid sizes, shared-memory requests)
    is read from ``device``: the proposer passes the detected GPU's properties; DEFAULT_DEVICE
    stands for the GPU where none is present. The optional hooks below have working defaults."""

    @property
    @abstractmethod
    def name(self) -> str:
        """The family's name (a class attribute in every family)."""

    @abstractmethod
    def match(self, card: Card) -> Match | None:
        """The match for a card this family serves, else None."""

    @abstractmethod
    def axes(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict[str, list]:
        """Parameter axes, each a list of values valid for this card, in a sensible order."""

    @abstractmethod
    def initial(self, m: Match, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict:
        """The heuristic first configuration for this shape."""

    @abstractmethod
    def render(self, m: Match, params: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> str:
        """The complete source of the candidate for this configuration, headed by header()."""

    @abstractmethod
    def passes(self, m: Match, params: dict) -> int:
        """Passes over the data this configuration makes (1: read once, write once)."""

    def range_reason(self, m: Match) -> str | None:
        """For a range card (``Card.ranges``): None where the family's kernels take the ranged
        sizes at run time from the ABI's shapes, else why not in one line. By default they bake
        every size in as a constant."""
        return f"{self.name}: its kernels are compiled for one size of every dimension"

    def valid(self, m: Match, params: dict, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> bool:
        """Whether the configuration can be rendered and run on ``device``. By default every
        combination of the axes' values can."""
        return True

    def mode_settings(self, m: Match, mode: str, backend: str, device: DeviceProps = DEFAULT_DEVICE) -> dict:
        """Settings a move into ``mode`` takes along (a thread count right for one mode can spill or
        starve another). By default none: the move changes the mode alone."""
        return {}

    def relevant(self, params: dict) -> dict:
        """The parameters that change the rendered kernel: two configurations that agree on these
        are the same move. By default all of them."""
        return dict(params)


def header(family: str, params: dict, passes: int) -> str:
    return "// forge-template: " + json.dumps({"family": family, "params": params, "passes": passes},
                                              sort_keys=True) + "\n"


def parse_header(source: str | None) -> dict | None:
    if not source:
        return None
    m = HEADER_RE.search(source)
    return json.loads(m.group(1)) if m else None


def describe(family: str, params: dict) -> str:
    return family + ": " + " ".join(f"{k}={params[k]}" for k in sorted(params))
