"""`boundloop replay-check`: replay the histories of open runs, sessions and budget
ledgers (and optionally the latest closed runs) against the local workflow code and
toolset before deploying it (docs/deploying.md).

A history the local code does not replay is a run that the new workers would fail
forever: its first divergent command is in the replay failure's message.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import temporalio.worker
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer

from boundloop.contracts import BUDGET_WORKFLOW, SESSION_WORKFLOW, WORKFLOW_NAME
from boundloop.core.canonical import preview

__all__ = ["Divergence", "replay_check"]

#: Every boundloop workflow type: a run, a session, a budget ledger.
TYPES = (WORKFLOW_NAME, SESSION_WORKFLOW, BUDGET_WORKFLOW)


@dataclass(frozen=True)
class Divergence:
    """A history the local code does not replay."""

    workflow_id: str
    run_id: str
    workflow_type: str
    #: The replay failure: for a nondeterminism error, the first command that diverges.
    message: str


def _types() -> str:
    return ", ".join(f"'{t}'" for t in TYPES)


async def replay_check(client: Client, plugins: Sequence[temporalio.worker.Plugin], *,
                       closed: int = 0) -> tuple[int, list[Divergence]]:
    """Replay every open boundloop workflow and the `closed` latest closed runs with
    `plugins` (boundloop's Plugin with the local toolset). Returns how many histories
    were replayed and those that diverged."""
    replayer = Replayer(workflows=[], data_converter=client.data_converter,
                        plugins=list(plugins))
    open_ones = f"WorkflowType IN ({_types()}) AND ExecutionStatus = 'Running'"
    queries: list[tuple[str, int | None]] = [(open_ones, None)]
    if closed > 0:
        queries.append((f"WorkflowType = '{WORKFLOW_NAME}' AND ExecutionStatus != 'Running'",
                        closed))
    replayed, diverged = 0, list[Divergence]()
    for query, limit in queries:
        kinds: dict[str, str] = {}
        histories = client.list_workflows(query, limit=limit)
        async with replayer.workflow_replay_iterator(
                _remember(histories.map_histories(), kinds)) as results:
            async for result in results:
                replayed += 1
                failure = result.replay_failure
                if failure is not None:
                    wf_id = result.history.workflow_id
                    diverged.append(Divergence(
                        workflow_id=wf_id, run_id=result.history.run_id,
                        workflow_type=kinds.get(wf_id, "?"), message=_first_line(failure)))
    return replayed, diverged


async def _remember(histories: AsyncIterator[WorkflowHistory],
                    kinds: dict[str, str]) -> AsyncIterator[WorkflowHistory]:
    """The histories, noting each one's workflow type (from its first event)."""
    async for history in histories:
        first = history.events[0] if history.events else None
        if first is not None:
            kinds[history.workflow_id] = (
                first.workflow_execution_started_event_attributes.workflow_type.name)
        yield history


def _first_line(failure: Exception) -> str:
    """The nondeterminism message (`[TMPRL1100] Nondeterminism error: …`), without the
    SDK's wrapping."""
    text = str(failure)
    start = text.find("[TMPRL")
    if start >= 0:
        text = text[start:]
        end = text.find('", source')
        text = text[:end] if end > 0 else text
    elif (at := text.find('message: "')) >= 0:
        # The workflow code raised (say, a tool the local toolset no longer has): the
        # exception's own message, not the SDK's dump of the failure with its stack.
        message = text[at + len('message: "'):]
        end = message.find('", ')
        text = "the workflow code raised: " + (message[:end] if end > 0 else message)
    return preview(text.splitlines()[0], 300) if text else type(failure).__name__
