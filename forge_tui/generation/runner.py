"""Greedy generation over a static KV cache, its prefill and decode steps replayed from CUDA graphs.

``GreedyRunner(adapter, max_len=...)`` generates greedy tokens for a batch of prompts of one
length: a prefill over the prompts, then decode steps of one token each. A decode step
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

The prefill is captured too, per batch bucket and prompt length (``lengths``: by default 16, 32,
... 512 tokens; a prompt is padded on the right with token 0 to the smallest that holds it, and
its first token is chosen from its own last position's logits). A short prompt's prefill, like a
decode step, launches hundreds of small kernels whose host cost is most of its time. The padding
changes none of the prompt's logits: causal attention keeps each position from seeing those after
it, and the padding's cache slots are written over by the decode steps before any query sees them.
A longer prompt, or a prefill that reads the device back or fails to capture, runs op by op, and
the status says why.
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
DEFAULT_LENGTHS = (16, 32, 64, 128, 256, 512)
"""Prompt lengths a prefill is captured at (a prompt is padded on the right to the smallest that
holds it). A longer prompt's prefill does enough work per launch that the host's share is small;
it runs op by op."""


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
class _Prefill:
    """One (batch bucket, prompt length) prefill's static inputs, which its graph reads."""

    ids: torch.Tensor  # [batch, length] the prompt, padded on the right
    plen: torch.Tensor  # [1] the prompt's own length: the first decode step's position
    last: torch.Tensor  # [1] its last position, whose logits choose the first new token
    replay: Callable[[], None] | None = None


@dataclass
class Generated:
    tokens: torch.Tensor
    """[batch, new tokens] (fewer where every row reached ``eos_token_id``)."""
    graphed: bool
    """Whether the decode steps were replayed from a CUDA graph."""
    bucket: int | None
    seconds: float
    prefill_graphed: bool = False
    """Whether the prefill was replayed from a CUDA graph."""


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
    why_no_prefill_graph: str | None = None
    """Why no prefill is captured (none is tried again), or None."""
    prefill_graphs: Counter[str] = field(default_factory=Counter)
    """Prefills replayed from a graph, per "batch x length" they were captured at."""
    prefill_op_by_op: Counter[str] = field(default_factory=Counter)
    """Prefills run op by op, by reason."""

    def to_json(self) -> dict[str, Any]:
        return {"buckets": list(self.buckets), "why_not_graphed": self.why_not_graphed,
                "graphs": {str(k): v for k, v in self.graphs.items()}, "op_by_op": dict(self.op_by_op),
                "generations": dict(self.generations), "why_no_prefill_graph": self.why_no_prefill_graph,
                "prefill_graphs": dict(self.prefill_graphs), "prefill_op_by_op": dict(self.prefill_op_by_op)}

    def line(self) -> str:
        """The status in one line."""
        parts = []
        if self.graphs:
            parts.append("steps from CUDA graphs: " + ", ".join(f"bucket {b} x{n}" for b, n in sorted(self.graphs.items())))
        for why, n in self.op_by_op.items():
            parts.append(f"{n} steps op by op ({why})")
        if self.prefill_graphs:
            parts.append("prefills from CUDA graphs: " + ", ".join(f"{k} x{n}" for k, n in sorted(self.prefill_graphs.items())))
        for why, n in self.prefill_op_by_op.items():
            parts.append(f"{n} prefills op by op ({why})")
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
                 lengths: tuple[int, ...] = DEFAULT_LENGTHS, capture: Capture | str | None = "auto", warmup: int = 3,
                 sync_every: int = 16, eos_token_id: int | None = None, pad_token_id: int | None = None,
                 why: str | None = None) -> None:
        if not buckets or any(b < 1 for b in buckets):
            raise ForgeError(f"batch buckets must be positive sizes, got {buckets}")
        if any(n < 1 for n in lengths):
            raise ForgeError(f"prompt lengths must be positive, got {lengths}")
        self.adapter = adapter
        self.max_len = max_len
        self.buckets = tuple(sorted(set(buckets)))
        self.lengths = tuple(sorted(set(lengths)))
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
        self._prefills: dict[tuple[int, int], _Prefill] = {}

    # ---- state --------------------------------------------------------------------------------
    def status(self) -> RunnerStatus:
        return self._status

    def bucket(self, batch: int) -> int | None:
        """The smallest bucket that holds ``batch`` sequences; None above every bucket."""
        return next((b for b in self.buckets if b >= batch), None)

    def length(self, prompt_len: int) -> int | None:
        """The length a prompt of ``prompt_len`` tokens is padded to for its prefill's graph: the
        smallest of ``lengths`` that holds it (no more than the cache's slots), None above them."""
        at = next((n for n in self.lengths if n >= prompt_len), None)
        return None if at is None else min(at, self.max_len)

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
        self._first_token(slot, self.adapter.prefill(prompt, slot.cache))
        slot.pos.fill_(prompt.shape[1])

    @staticmethod
    def _first_token(slot: _Slot, logits: torch.Tensor) -> None:
        """Write the token a prefill's last logits choose as the slot's first and next input."""
        nxt = logits.argmax(-1, keepdim=True)
        slot.ids.copy_(nxt)
        slot.tokens.zero_()
        slot.tokens[:, :1].copy_(nxt)
        slot.count.fill_(1)

    def _load(self, pre: _Prefill, prompt: torch.Tensor) -> None:
        """Write a prompt into a captured prefill's inputs (padded with token 0 on the right)."""
        n = prompt.shape[1]
        pre.ids[:, :n].copy_(prompt)
        pre.ids[:, n:].zero_()
        pre.plen.fill_(n)
        pre.last.fill_(n - 1)

    def _prefill_padded(self, slot: _Slot, pre: _Prefill) -> None:
        """``_prefill`` from ``pre``'s buffers alone, no host value in it (what a prefill's graph
        holds). The padding's keys and values land in the slots after the prompt, which no query
        sees before a decode step writes its own there (a step's mask covers the slots up to its
        position), and a padded position's query attends only to the positions before it, so
        the prompt's logits are those of the prompt alone."""
        self.adapter.reset(slot.cache)
        self._first_token(slot, self.adapter.prefill_at(pre.ids, pre.last, slot.cache))
        slot.pos.copy_(pre.plen)
        self.adapter.rewind(slot.cache, pre.plen)

    def _try_capture_prefill(self, slot: _Slot, length: int, prompt: torch.Tensor) -> None:
        """Capture the prefill of the slot's batch at ``length``, or say why prefills cannot be
        captured (then none is tried again; decode steps are captured on their own)."""
        assert self.capture is not None
        dev = self.device
        pre = _Prefill(torch.zeros(slot.batch, length, dtype=torch.long, device=dev),
                       torch.zeros(1, dtype=torch.long, device=dev), torch.zeros(1, dtype=torch.long, device=dev))
        self._load(pre, prompt)

        def body() -> None:
            self._prefill_padded(slot, pre)

        why: str | None = None
        try:
            for _ in range(self.warmup):  # forge's first calls at this shape stay out of the scan
                body()
            found = host_syncs(body)
            if found is None:
                pre.replay = self.capture.capture(body, 1)
            else:
                why = f"the prefill {found}"
        except Exception as exc:  # noqa: BLE001 - a prefill that cannot be captured runs op by op
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            why = f"the prefill's capture failed: {type(exc).__name__}: {first}"
        if why is None:
            self._prefills[(slot.batch, length)] = pre
        else:
            self._status.why_no_prefill_graph = why

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
            length = self.length(prompt.shape[1])
            if bucket is not None and self.capture is not None and new_tokens > 1:
                if (length is not None and self._status.why_no_prefill_graph is None
                        and (size, length) not in self._prefills):
                    self._try_capture_prefill(slot, length, prompt)
                if slot.replay is None:
                    self._try_capture(slot, prompt)
            if bucket is None:
                why = f"batch {batch} above every bucket ({', '.join(map(str, self.buckets))})"
            else:
                why = self._status.why_not_graphed or ""
            replay = slot.replay if bucket is not None else None
            pre = self._prefills.get((size, length)) if bucket is not None and length is not None else None
            if pre is not None and pre.replay is not None:
                self._load(pre, prompt)
                pre.replay()
            else:
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
        prefill_graphed = pre is not None and pre.replay is not None
        if prefill_graphed:
            self._status.prefill_graphs[f"{size}x{length}"] += 1
        else:
            self._status.prefill_op_by_op[self._why_prefill_op_by_op(why, bucket, prompt.shape[1], new_tokens)] += 1
        if replay is not None:
            slot.replays += done_steps - 1
            self._status.graphs[size] = self._status.graphs.get(size, 0) + done_steps - 1
            self._status.generations[f"graph, bucket {size}"] += 1
        else:
            self._status.op_by_op[why] += done_steps - 1
            self._status.generations[f"op by op: {why}"] += 1
        return Generated(self._after_eos(tokens), replay is not None, bucket, time.perf_counter() - t0, prefill_graphed)

    def _why_prefill_op_by_op(self, why_steps: str, bucket: int | None, prompt_len: int, new_tokens: int) -> str:
        if bucket is None:
            return why_steps  # the batch is above every bucket
        if self.length(prompt_len) is None:
            return f"a prompt of {prompt_len} tokens above every length ({', '.join(map(str, self.lengths)) or 'none'})"
        if self._status.why_no_prefill_graph:
            return self._status.why_no_prefill_graph
        if self._status.why_not_graphed and not self._prefills:
            return self._status.why_not_graphed
        return "not captured yet (a generation of one token captures nothing)" if new_tokens == 1 else "not captured"

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
