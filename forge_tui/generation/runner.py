"""Greedy generation over a static KV cache, its decode steps replayed from CUDA graphs.

``GreedyRunner(adapter, max_len=...)`` generates greedy tokens for a batch of prompts of one
length: a prefill over the prompts (op by op), then decode steps of one token each. A decode step
reads its token and position from device buffers, picks the next token with ``argmax`` on the
device, and writes it to the token buffer and to its own input: nothing in it needs the host, so
the host only launches steps, and waits once at the end (or every ``sync_every`` steps to check for
``eos_token_id``).

Batches are served in buckets (by default 1, 2, 4, 8, 16, 32, 64 sequences, as serving engines
capture them): a batch runs in the smallest bucket that holds it, its rows padded with copies of
its first prompt, and the bucket's step is captured once, at its first generation (after
``warmup`` steps run as written, so that what forge's ``apply`` does on first calls, its trials,
compiles and first-call checks, happens before the step is scanned for host syncs and stays out of
the graph; then one more on the capture's side stream) and replayed at every step after; the
generation itself then starts again from its prefill. A batch larger than every bucket runs its steps op by op, and
the status counts it. Where the step cannot be captured at all (it reads the device back on the
host, the model has no static cache, the capture fails, no CUDA device) the status says why in one
line and every step runs op by op: the same step, each op launched by the host.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..errors import ForgeError
from .graphs import Capture, CudaCapture, host_syncs

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class _Slot:
    """One batch size's static state: its cache, and the step's buffers (fixed addresses)."""

    batch: int
    cache: Any
    ids: torch.Tensor  # [batch, 1] the step's input token
    pos: torch.Tensor  # [1] its position
    tokens: torch.Tensor  # [batch, max_len] the generated tokens
    count: torch.Tensor  # [1] how many are written
    replay: Callable[[], None] | None = None
    replays: int = 0


@dataclass
class Generated:
    tokens: torch.Tensor
    """[batch, new tokens] (fewer where every row reached ``eos_token_id``)."""
    graphed: bool
    """Whether the decode steps were replayed from a CUDA graph."""
    bucket: int | None
    seconds: float


@dataclass
class RunnerStatus:
    buckets: tuple[int, ...]
    why_not_graphed: str | None
    graphs: dict[int, int] = field(default_factory=dict)
    """Per captured bucket, the steps replayed from its graph."""
    op_by_op: Counter[str] = field(default_factory=Counter)
    """Decode steps run op by op, by reason."""
    generations: Counter[str] = field(default_factory=Counter)
    """Generations by how their steps ran ("graph, bucket 8", "op by op: why")."""

    def to_json(self) -> dict[str, Any]:
        return {"buckets": list(self.buckets), "why_not_graphed": self.why_not_graphed,
                "graphs": {str(k): v for k, v in self.graphs.items()}, "op_by_op": dict(self.op_by_op),
                "generations": dict(self.generations)}

    def line(self) -> str:
        """The status in one line."""
        parts = []
        if self.graphs:
            parts.append("steps from CUDA graphs: " + ", ".join(f"bucket {b} x{n}" for b, n in sorted(self.graphs.items())))
        for why, n in self.op_by_op.items():
            parts.append(f"{n} steps op by op ({why})")
        return "; ".join(parts) or "nothing generated yet"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class GreedyRunner:
    """Greedy generation for one model (see the module's docstring).

    ``capture``: how decode steps are captured: ``"auto"`` (CUDA graphs on a CUDA device, none
    elsewhere), None (never: every step op by op, with ``why`` as the reason), or an object with
    ``capture(fn, warmup)`` (tests use a stand-in)."""

    def __init__(self, adapter: Any, *, max_len: int, buckets: tuple[int, ...] = DEFAULT_BUCKETS,
                 capture: Capture | str | None = "auto", warmup: int = 3, sync_every: int = 16,
                 eos_token_id: int | None = None, pad_token_id: int | None = None, why: str | None = None) -> None:
        if not buckets or any(b < 1 for b in buckets):
            raise ForgeError(f"batch buckets must be positive sizes, got {buckets}")
        self.adapter = adapter
        self.max_len = max_len
        self.buckets = tuple(sorted(set(buckets)))
        self.warmup = warmup
        self.sync_every = sync_every
        self.eos = eos_token_id
        self.pad = pad_token_id if pad_token_id is not None else eos_token_id
        self.device = adapter.device
        why_not = adapter.why_not_static() or why
        if capture == "auto":
            if self.device.type == "cuda":
                capture = CudaCapture()
            else:
                capture, why_not = None, why_not or f"no CUDA device ({self.device.type}): CUDA graphs need one"
        elif capture is None:
            why_not = why_not or "CUDA graphs were not asked for"
        self.capture: Capture | None = None if why_not else capture  # type: ignore[assignment]
        self._status = RunnerStatus(self.buckets, why_not)
        self._slots: dict[int, _Slot] = {}

    # ---- state --------------------------------------------------------------------------------
    def status(self) -> RunnerStatus:
        return self._status

    def bucket(self, batch: int) -> int | None:
        """The smallest bucket that holds ``batch`` sequences; None above every bucket."""
        return next((b for b in self.buckets if b >= batch), None)

    def _slot(self, batch: int) -> _Slot:
        slot = self._slots.get(batch)
        if slot is None:
            dev = self.device
            slot = _Slot(batch, self.adapter.static_cache(batch, self.max_len),
                         torch.zeros(batch, 1, dtype=torch.long, device=dev), torch.zeros(1, dtype=torch.long, device=dev),
                         torch.zeros(batch, self.max_len, dtype=torch.long, device=dev),
                         torch.zeros(1, dtype=torch.long, device=dev))
            self._slots[batch] = slot
        return slot

    # ---- the step -----------------------------------------------------------------------------
    def _step(self, slot: _Slot) -> None:
        """One decode step on the slot's buffers: the next token chosen and written on the device."""
        logits = self.adapter.decode(slot.ids, slot.pos, slot.cache)
        nxt = logits.argmax(-1, keepdim=True)
        slot.ids.copy_(nxt)
        slot.tokens.index_copy_(1, slot.count, nxt)
        slot.count.add_(1)
        slot.pos.add_(1)

    def _prefill(self, slot: _Slot, prompt: torch.Tensor) -> None:
        """Reset the slot, run the prompt through the model and write the first new token."""
        self.adapter.reset(slot.cache)
        slot.tokens.zero_()
        nxt = self.adapter.prefill(prompt, slot.cache).argmax(-1, keepdim=True)
        slot.ids.copy_(nxt)
        slot.tokens[:, :1].copy_(nxt)
        slot.count.fill_(1)
        slot.pos.fill_(prompt.shape[1])

    def _try_capture(self, slot: _Slot, prompt: torch.Tensor) -> None:
        """Capture the slot's step, or say why the step cannot be captured (then no bucket's is)."""
        assert self.capture is not None
        self._prefill(slot, prompt)
        at = prompt.shape[1]

        def step_at_prompt_end() -> None:
            # every warm-up, scanned and captured step writes the slot right after the prompt, so
            # that however many there are, none writes past the cache's end
            slot.pos.fill_(at)
            slot.count.fill_(1)
            self.adapter.rewind(slot.cache, at)
            self._step(slot)

        for _ in range(self.warmup):  # first calls (forge's trials, compiles, checks) before the scan and capture
            step_at_prompt_end()
        why = host_syncs(step_at_prompt_end)
        if why is None:
            try:
                slot.pos.fill_(at)  # the capture's own warm-up call, then the graph of one plain step
                slot.count.fill_(1)
                self.adapter.rewind(slot.cache, at)
                slot.replay = self.capture.capture(lambda: self._step(slot), 1)
            except Exception as exc:  # noqa: BLE001 - any capture failure means op by op, with its reason
                first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
                why = f"the capture failed: {type(exc).__name__}: {first}"
        else:
            why = f"the decode step {why}"
        if why is not None:
            self.capture = None
            self._status.why_not_graphed = why
            for s in self._slots.values():
                s.replay = None

    # ---- generation ---------------------------------------------------------------------------
    def generate(self, prompt: torch.Tensor, new_tokens: int) -> Generated:
        """Greedy ``new_tokens`` tokens after ``prompt`` (``[batch, length]`` token ids)."""
        if prompt.dim() != 2 or prompt.shape[0] < 1 or prompt.shape[1] < 1:
            raise ForgeError(f"prompts must be [batch, length] token ids, got shape {tuple(prompt.shape)}")
        if new_tokens < 1:
            raise ForgeError(f"new tokens must be at least 1, got {new_tokens}")
        if prompt.shape[1] + new_tokens > self.max_len:
            raise ForgeError(f"a prompt of {prompt.shape[1]} tokens and {new_tokens} new ones exceed the cache's "
                             f"{self.max_len} slots")
        t0 = time.perf_counter()
        with torch.no_grad():
            batch = prompt.shape[0]
            bucket = self.bucket(batch)
            size = bucket if bucket is not None else batch
            if size > batch:  # pad rows: copies of the first prompt, dropped from the result
                prompt = torch.cat([prompt, prompt[:1].expand(size - batch, -1)])
            slot = self._slot(size)
            if bucket is not None and self.capture is not None and slot.replay is None and new_tokens > 1:
                self._try_capture(slot, prompt)
            if bucket is None:
                why = f"batch {batch} above every bucket ({', '.join(map(str, self.buckets))})"
            else:
                why = self._status.why_not_graphed or ""
            replay = slot.replay if bucket is not None else None
            self._prefill(slot, prompt)
            done_steps = 1
            for i in range(1, new_tokens):
                if replay is not None:
                    replay()
                else:
                    self._step(slot)
                done_steps += 1
                if self.eos is not None and self.sync_every and i % self.sync_every == 0 and self._all_ended(slot, batch, done_steps):
                    break
            tokens = slot.tokens[:batch, :done_steps].clone()
            _sync(self.device)
        if replay is not None:
            slot.replays += done_steps - 1
            self._status.graphs[size] = self._status.graphs.get(size, 0) + done_steps - 1
            self._status.generations[f"graph, bucket {size}"] += 1
        else:
            self._status.op_by_op[why] += done_steps - 1
            self._status.generations[f"op by op: {why}"] += 1
        return Generated(self._after_eos(tokens), replay is not None, bucket, time.perf_counter() - t0)

    def _all_ended(self, slot: _Slot, batch: int, steps: int) -> bool:
        """Whether every sequence has made ``eos_token_id`` (the host waits for the device here)."""
        assert self.eos is not None
        made = torch.eq(slot.tokens[:batch, :steps], self.eos)
        return bool(made.any(dim=1).all())

    def _after_eos(self, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens after a sequence's first ``eos_token_id`` become the pad token, as
        ``generate()`` leaves them."""
        if self.eos is None:
            return tokens
        ended = (tokens == self.eos).int().cumsum(dim=1)
        after = (ended - (tokens == self.eos).int()) > 0
        return tokens.masked_fill(after, self.pad if self.pad is not None else self.eos)
