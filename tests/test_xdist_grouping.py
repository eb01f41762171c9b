"""`make test` runs under pytest-xdist with `--dist loadgroup`: the tests of a module with a
module-scoped fixture must share one worker process (and so one fixture), or a test that
builds on the one before it sees a fresh fixture instead. pytest 9.2 broke this silently
(xdist's group suffix on the test id was ignored), which failed the console tests in CI."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

MODULE = __name__.replace(".", "/") + ".py"


@pytest.fixture(scope="module")
def shared() -> Iterator[list[str]]:
    yield []


@pytest.mark.skipif("PYTEST_XDIST_WORKER" not in os.environ, reason="not under pytest-xdist")
@pytest.mark.parametrize("n", range(4))
def test_a_module_scoped_fixtures_tests_share_one_worker(
        n: int, shared: list[str], request: pytest.FixtureRequest) -> None:
    # xdist groups by the suffix it adds to the test id; without it each test is sent on its own.
    assert request.node.nodeid.endswith(f"@{MODULE}"), request.node.nodeid
    # In order, on one fixture: each test sees the ones before it.
    assert shared == [str(i) for i in range(n)]
    shared.append(str(n))
