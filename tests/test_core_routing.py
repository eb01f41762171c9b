"""The pure decisions of where a run's activities go: after a failed attempt on the holding
worker's queue, and after each model turn."""

from __future__ import annotations

import pytest

from boundloop.core.routing import follows_holder, lost_on_holder

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


# --- which queue a run's next activities go to, from its last model turn ---------------


def test_a_request_that_read_its_conversation_from_history_is_followed() -> None:
    """The run's first request (nothing to find) and any rebuild: its worker now holds
    the conversation, and nothing says the shared queue would find it there."""
    for on_holder in (False, True):
        for missed in (False, True):
            assert follows_holder(False, on_holder, missed)


def test_a_hit_on_the_holders_queue_tries_the_shared_queue_once() -> None:
    assert not follows_holder(True, True, shared_missed=False)
    assert follows_holder(True, True, shared_missed=True)


def test_a_hit_on_the_shared_queue_stays_on_the_shared_queue() -> None:
    """Eager activity execution put the request where the conversation was."""
    assert not follows_holder(True, False, shared_missed=False)
