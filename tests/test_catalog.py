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
