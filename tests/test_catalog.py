"""One per-queue registry: what a task queue serves in this process (toolset, approver
keys, budget admins), counted per worker, and refused when two workers of one queue
would serve different things (the workflow could not tell which apply)."""

from __future__ import annotations

import uuid

import pytest

from boundloop import Toolset
from boundloop.tools import catalog

KEY = "ed25519:" + "A" * 43 + "="


def test_a_queue_serves_one_thing_for_as_long_as_a_worker_serves_it() -> None:
    queue = f"catalog-{uuid.uuid4().hex[:8]}"
    mine, other = Toolset[None](), Toolset[None]()
    served = catalog.Served(mine, approver_keys={"alice": KEY})
    catalog.register(queue, served)
    catalog.register(queue, catalog.Served(mine, approver_keys={"alice": KEY}))  # 2nd worker
    for refused in (catalog.Served(other, approver_keys={"alice": KEY}),
                    catalog.Served(mine),  # the same tools without the keys
                    catalog.Served(mine, approver_keys={"alice": KEY}, budget_admins={})):
        with pytest.raises(ValueError, match="already serves another toolset"):
            catalog.register(queue, refused)
    catalog.unregister(queue, catalog.Served(other))  # not what it serves: no effect
    catalog.unregister(queue, served)
    found = catalog.served_on(queue)  # the other worker still serves it
    assert (found.toolset, dict(found.approver_keys)) == (mine, {"alice": KEY})
    catalog.unregister(queue, served)
    assert queue not in catalog._by_queue
    catalog.register(queue, catalog.Served(other))  # a later worker may serve another
    assert catalog.served_on(queue).toolset is other
    catalog.unregister(queue, catalog.Served(other))


def test_replayers_made_in_turn_each_replay_with_their_own_toolset() -> None:
    """Two replayers of one process with other toolsets (one agent's histories, then
    another's): the second was refused ("task queue None already serves another toolset"),
    which failed every replay test run after another module's replayer in one process."""
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Replayer

    from boundloop import Plugin
    from boundloop.tools import catalog
    from tests.support.crash_tools import tools as crash_tools
    from tests.support.tools import tools as test_tools

    for toolset in (test_tools, crash_tools):
        Replayer(workflows=[], data_converter=pydantic_data_converter,
                 plugins=[Plugin(toolset, deps=None)])
        assert catalog.served_on("a queue no worker serves").toolset is toolset
