"""The worker's own threads for synchronous tools (docs/durability.md, "Hung tools").

Python cannot stop a thread. A sync tool that hangs past its timeout (or past a
cancel) keeps its thread until its function returns; the attempt itself ends at once
(timed out, or cancelled) and the tool can see that through `ToolContext.cancelled`.
So sync tools do not share asyncio's small default pool (6 threads on 2 cores, which a
few hung calls used up for every other tool): they get `size` threads, as many as the
worker's activity slots, so the calls the worker runs at once always have a thread
while fewer than `size` hung threads are left over. The threads are daemons: a hung one
does not keep the worker process from exiting.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


class ToolThreads:
    """A bounded pool of daemon threads, started as they are first needed."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("ToolThreads needs at least one thread")
        self.size = size
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = \
            queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._busy = 0

    @property
    def busy(self) -> int:
        with self._lock:
            return self._busy

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Run `fn` on a pool thread with the caller's context variables (the activity
        context, so `activity.logger` works inside a tool)."""
        future: Future[T] = Future()
        ctx = contextvars.copy_context()
        with self._lock:
            if self._busy + self._jobs.qsize() >= self._threads and self._threads < self.size:
                self._threads += 1
                threading.Thread(target=self._work, name=f"boundloop-tool-{self._threads}",
                                 daemon=True).start()
            elif self._busy >= self.size:
                log.warning("every tool thread is busy; the call waits for one",
                            extra={"threads": self.size})
        self._jobs.put((future, lambda: ctx.run(fn)))
        return future

    def _work(self) -> None:
        while True:
            future, fn = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue  # cancelled before it started: the body never runs
            with self._lock:
                self._busy += 1
            try:
                future.set_result(fn())
            except BaseException as exc:  # delivered to the awaiting activity
                future.set_exception(exc)
            finally:
                with self._lock:
                    self._busy -= 1
