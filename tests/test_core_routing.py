"""The pure decision of where a failed attempt on the holding worker's queue goes."""

from __future__ import annotations

import pytest

from boundloop.core.routing import lost_on_holder

HANDLED = ("ModelRequestRetryable", "ConversationMismatch")


@pytest.mark.parametrize("timeout", ["SCHEDULE_TO_START", "HEARTBEAT", "START_TO_CLOSE"])
def test_a_lost_or_wedged_worker_sends_the_activity_to_the_shared_queue(timeout: str) -> None:
    assert lost_on_holder(timeout, None, HANDLED)


def test_the_deadline_is_not_a_lost_worker() -> None:
    assert not lost_on_holder("SCHEDULE_TO_CLOSE", None, HANDLED)


def test_a_failure_the_workflow_counts_stays_a_failure() -> None:
    assert not lost_on_holder(None, "ModelRequestRetryable", HANDLED)


def test_a_failure_temporal_would_retry_goes_to_the_shared_queue() -> None:
    assert lost_on_holder(None, "SomethingElse", HANDLED)
    assert lost_on_holder(None, None, HANDLED)
