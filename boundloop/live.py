"""Live progress of a run for `boundloop watch` and `boundloop run --wait` on a terminal."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from rich.console import Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from temporalio.client import WorkflowFailureError

from boundloop import _ops as ops
from boundloop.contracts import (
    ChildRun,
    Reset,
    RunResult,
    RunStatus,
    StreamItem,
    TextDelta,
)
from boundloop.core import tree
from boundloop.core.reasons import StopReason
from boundloop.terminal import invisible_note, no_worker, safe

#: How often the live view asks running sub-agents for their own status.
CHILDREN_SECONDS = 1.0
#: The events whose detail the live view shows (boundloop.core.tree).
TREE_EVENTS = frozenset({tree.STARTED, tree.ENDED, tree.NOT_STARTED, tree.ALLOWANCE_SPENT})


def render(workflow_id: str, st: RunStatus, answer: str = "") -> Panel:
    """One frame: counters against their limits, waiting approvals, the latest events,
    and the answer as the model writes it."""
    lim = st.limits
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("status", st.status + (f" · {st.reason.value}" if st.reason else ""))
    table.add_row("steps", f"{st.steps}" + (f" / {lim.max_steps}" if lim else ""))
    table.add_row("tool executions",
                  f"{st.tool_executions}" + (f" / {lim.max_tool_executions}" if lim else ""))
    table.add_row("tokens", f"{st.total_tokens}" + (f" / {lim.token_threshold}" if lim else ""))
    window = lim.max_input_tokens if lim else None
    if st.context_tokens is not None and window is not None:
        # The next request's input, estimated, against the model's context window.
        table.add_row("context", f"~{st.context_tokens} / {window} tokens" + (
            f" · summarized {st.summarized}×" if st.summarized else ""))
    if st.cost_usd is not None:
        table.add_row("cost", f"${st.cost_usd:.6f}")
    if st.tree is not None:  # a sub-agent's run: where it is in its tree
        table.add_row("tree", safe(st.tree.line()))
    parts: list[Any] = [table]
    if st.children:
        children = Table()
        for header in ("sub-agent", "state", "tokens / allowance", "cost", "run"):
            children.add_column(header, overflow="fold")
        for c in st.children:
            # A running sub-agent's spend reaches this run when it ends (`watch` asks
            # the sub-agent's own run meanwhile).
            used = "…" if c.state == "running" and not c.total_tokens else c.total_tokens
            children.add_row(safe(c.tool), safe(c.state), f"{used} / {c.token_allowance}",
                             "" if c.cost_usd is None else f"${c.cost_usd:.6f}",
                             safe(c.workflow_id))
        parts.append(children)
    if st.pending:
        waiting = Table()
        for header in ("waiting for approval", "call id", "since", "arguments (in full)"):
            waiting.add_column(header, overflow="fold")  # wrapped, never cut
        for a in st.pending:
            waiting.add_row(safe(a.tool), safe(a.call_id), a.requested_at,
                            safe(ops.argument_text(a)) + invisible_note(a.arguments))
        parts.append(waiting)
    recent = st.events[-5:]
    if recent:
        parts.append(Text("\n".join(
            f"step {e.step} · {safe(e.event)}" + (f" · {safe(e.tool)}" if e.tool else "")
            # A sub-agent's start and end say what it may spend and what it spent.
            + (f" · {safe(e.detail)}" if e.detail and e.event in TREE_EVENTS else "")
            for e in recent), style="dim"))
    if answer:
        parts.append(Panel(Text(safe(answer)), title="answer", title_align="left"))
    return Panel(Group(*parts), title=f"{safe(workflow_id)} — {safe(st.question[:60])}")


def ended(last: RunStatus, result: RunResult | None) -> RunStatus:
    """The frame of a closed run: its RunResult's counters and events, nothing waiting
    (the last status a query answered may predate the end by a poll)."""
    if result is None:  # closed without a RunResult (terminated, timed out)
        return last.model_copy(update={"pending": []})
    return last.model_copy(update={
        "status": "completed" if result.reason == StopReason.COMPLETED else "stopped",
        "reason": result.reason, "steps": result.steps,
        "tool_executions": result.tool_executions, "total_tokens": result.total_tokens,
        "cost_usd": result.cost_usd, "pending": [], "events": list(result.events)})


async def watch(handle: Any, interval: float = 0.3, warn_silence: bool = True) -> None:
    """Redraw until the run closes; the last frame is the run's end. `warn_silence`:
    say when no worker answers (not when the run's worker is this process's own)."""
    with Live(refresh_per_second=8, transient=False) as live:
        def silence(task_queue: str) -> None:
            live.console.print(no_worker(task_queue))

        def stuck(line: str) -> None:
            live.console.print(f"[red]{safe(handle.id)}: running, but {safe(line)}[/]")

        last: RunStatus | None = None
        answer = Answer()

        # Running sub-agents as their own status queries say (their state, waiting for
        # approval included, and their spend so far), by workflow id.
        kids: dict[str, ChildRun] = {}

        def frame(status: RunStatus) -> Panel:
            shown = [kids.get(c.workflow_id, c) if c.state == "running" else c
                     for c in status.children]
            return render(handle.id, status.model_copy(update={"children": shown}),
                          answer.text)

        async def read_stream() -> None:
            async for item in ops.stream_items(handle):
                if answer.add(item) and last is not None:
                    live.update(frame(last))

        async def read_children() -> None:
            # Apart from the status polls: a sub-agent no worker answers for would hold
            # the frames up for the query's timeout.
            while True:
                if last is not None and any(c.state == "running" for c in last.children):
                    kids.update((c.workflow_id, c)
                                for c in await ops.children_now(handle._client, last))
                    live.update(frame(last))
                await asyncio.sleep(CHILDREN_SECONDS)

        # The answer comes from the run's stream; counters and approvals from the status
        # query. A run on a worker without streams still shows all but the live text.
        readers = [asyncio.create_task(read_stream()), asyncio.create_task(read_children())]
        try:
            async for status, _new in ops.follow(handle, interval=interval,
                                                 on_silence=silence if warn_silence else None,
                                                 on_stuck=stuck):
                last = status
                live.update(frame(status))
        finally:
            for reader in readers:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await reader
        if last is not None:
            result: RunResult | None = None
            with contextlib.suppress(WorkflowFailureError):
                result = await ops.result_of(handle)
            live.update(render(handle.id, ended(last, result),
                               result.text if result is not None else answer.text))
    if not live.console.is_terminal:
        # Off a terminal, Live writes its last frame without ending the line: what the
        # command prints next would start on the frame's bottom edge.
        live.console.line()


class Answer:
    """The answer text a reader of the stream shows: the latest step's deltas, less those
    of every attempt a `Reset` voided (a voided attempt's text that arrives late is
    dropped too)."""

    def __init__(self) -> None:
        self.step = 0
        self._texts: dict[str, str] = {}  # attempt -> its text, in the order they came
        self._void: set[tuple[int, str]] = set()

    @property
    def text(self) -> str:
        return "".join(self._texts.values())

    def add(self, item: StreamItem) -> bool:
        """Take one stream item in; True when the text changed."""
        if isinstance(item, TextDelta):
            if (item.step, item.attempt) in self._void or item.step < self.step:
                return False
            if item.step != self.step:
                self.step, self._texts = item.step, {}
            self._texts[item.attempt] = self._texts.get(item.attempt, "") + item.text
            return True
        if isinstance(item, Reset):
            voided = [item.attempt] if item.attempt is not None else (
                list(self._texts) if item.step == self.step else [])
            self._void.update((item.step, a) for a in voided)
            if item.step == self.step and any(self._texts.pop(a, "") for a in voided):
                return True
        return False
