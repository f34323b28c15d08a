"""The event loop's executor for the app's thread workers (``DaemonExecutor``)."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable


class DaemonExecutor(ThreadPoolExecutor):
    """The event loop's executor for the app's thread workers: each call on a daemon thread of its
    own, and a shutdown that waits for none of them. With asyncio's default executor the loop's
    end joins every worker still running (a model run, an evaluation), so ``q`` waited for them;
    here the app ends at once, and ``finish`` ends the process."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> "Future[Any]":
        fut: Future[Any] = Future()

        def run() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting worker
                fut.set_exception(exc)

        threading.Thread(target=run, daemon=True, name="forge-tui-worker").start()
        return fut

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        pass

