"""The judge's whole run of one candidate (``Evaluation``: its runner started, every input set
checked, then timed) and the worker's entry to it: a request in, the result's status, failure
and reason out."""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Callable

from .. import roofline
from ..cards import Card
from ..quiet import oversubscription
from ..tensorstore import TensorStore
from .accused import Accused, CandidateProcessError
from .harness import CandidateFailure, FatalDeviceError
from .request import JudgeRequest
from .timing_protocol import TimedEvaluation, timing_verdict


class Evaluation(TimedEvaluation):
    """One candidate on one card, judged here, run in its own process (see ``checks``)."""

    # ---- all ----------------------------------------------------------------------------------
    def run(self, ceil: dict, do_timing: bool = True) -> dict:
        import torch

        if self.device == "cpu":
            # the judge's own work (references, comparisons) on one thread where more threads are
            # ready to run than there are CPUs: a parallel op there waits for its slowest thread
            host = oversubscription()
            torch.set_num_threads(1 if host is not None and host > 1.0 else self.threads)
        self.phase("load")
        limit = self.opt.call_timeout_s
        self._acc = Accused(Path(self.runner), self.library, self.card.inputs, self.card.outputs, self.scalars,
                           self.device, threads=self.threads, call_limit_s=limit,
                           confinement=self.opt.confinement, landlock=self.opt.landlock,
                           sets=self.calls_per_sample(self.floor_us(ceil) if do_timing else None))
        with self.acc:
            timer = self._timer()
            self.acc.measure_overhead(max(11, self.tcfg.repeats), before=timer.prepare)
            self.acc.load()
            self.check_threads("once loaded")
            if self.acc.needs_workspace:
                self.acc.give_workspace(self.acc.size_workspace())
            self.phase("correctness")
            results = []
            for name, ins in self.input_sets():
                self.phase("correctness")  # one heartbeat per set: the client's limit is per set
                results.append(self.check_set(name, ins))
                self.sets_passed.append(name)
            state = self.check_state()
            correctness = {"sets": results, "seed": self.seed,
                           "degenerate_card": bool(results) and all(r["degenerate"] for r in results),
                           "scalars": [[s.name, s.value] for s in self.scalars], "state_calls": state["calls"]}
            timing = self.time(ceil) if do_timing else None
            confinement = dict(self.acc.confined)
        self.phase("done")
        return {"correctness": correctness, "timing": timing, "confinement": confinement,
                "runner_pid": self.runner_pid(), "phase_seconds": self.phase_seconds}


PROCESS_FAILURES = {"crash": ("crash", "crash"), "device_error": ("crash", "device_error"),
                    "timeout": ("timeout", "timeout"), "load": ("rejected", "load"),
                    "workspace": ("rejected", "workspace"), "confinement": ("error", "confinement"),
                    "harness": ("error", "harness")}


def evaluate_in_worker(request: dict, phase: Callable[[str], None], state: dict) -> dict:
    """Entry point used by the worker loop. Returns the correctness/timing part of a result."""
    t0 = time.perf_counter()
    req = JudgeRequest.model_validate({k: v for k, v in request.items() if k != "cmd"})
    card = Card.model_validate(req.card)
    device = req.device
    if "ceilings" not in state:
        state["ceilings"] = roofline.ceilings(device)
    ev = Evaluation(card, req, TensorStore(Path(req.store)), device, phase, state)
    try:
        body = ev.run(state["ceilings"], do_timing=req.options.timing)
    except CandidateFailure as fail:
        return {"status": "rejected", "failure": fail.kind, "reason": str(fail),
                "detail": {**fail.detail, "sets_passed": list(ev.sets_passed)}, "seed": ev.seed,
                "phase": ev.current_phase, "runner_pid": ev.runner_pid(), "seconds": time.perf_counter() - t0}
    except CandidateProcessError as exc:
        status, failure = PROCESS_FAILURES.get(exc.kind, ("error", exc.kind))
        return {"status": status, "failure": failure, "reason": str(exc), "seed": ev.seed,
                "detail": {"sets_passed": list(ev.sets_passed)}, "phase": ev.current_phase,
                "runner_pid": ev.runner_pid(), "seconds": time.perf_counter() - t0}
    except FatalDeviceError:
        raise
    except Exception as exc:  # noqa: BLE001 - an exception from the harness itself, reported as such
        return {"status": "error", "failure": "harness", "reason": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(limit=6), "seed": ev.seed}
    verdict, why, broke = timing_verdict(body.get("timing"))
    if broke:
        body["failure"] = broke
    return {"status": verdict, "reason": why, **body, "seconds": time.perf_counter() - t0}

