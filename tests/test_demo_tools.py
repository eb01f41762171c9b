"""The demo tools over their real SQLite store (tool functions stay plain functions)."""

from __future__ import annotations

from pathlib import Path

import pytest

from boundloop import ToolContext, ToolFailure, ToolStatus
from boundloop.tools.demo import (
    DemoDeps,
    create_ticket,
    list_tickets,
    lookup_stock,
    search_docs,
)


def ctx(tmp_path: Path, key: str = "wf/step-1/call-0") -> ToolContext[DemoDeps]:
    return ToolContext(deps=DemoDeps(data_dir=tmp_path), idempotency_key=key,
                       workflow_id="wf", call_id="c", step=1, max_result_bytes=4096)


def test_lookup_stock_seed_values(tmp_path: Path) -> None:
    assert lookup_stock(ctx(tmp_path), sku="A-001")["quantity"] == 12
    assert lookup_stock(ctx(tmp_path), sku="B-002")["quantity"] == 0
    assert lookup_stock(ctx(tmp_path), sku="Z-999") == {"sku": "Z-999", "found": False}


def test_search_docs_finds_and_reports_not_found(tmp_path: Path) -> None:
    found = search_docs(query="refund", limit=1)
    assert [r["doc"] for r in found["results"]] == ["returns.md"]
    with pytest.raises(ToolFailure) as info:
        search_docs(query="zzzz-nothing", limit=3)
    assert info.value.envelope.status == ToolStatus.NOT_FOUND


def test_retried_ticket_returns_the_first_and_changes_nothing(tmp_path: Path) -> None:
    first = create_ticket(ctx(tmp_path), title="t", description="d", priority="high")
    again = create_ticket(ctx(tmp_path), title="t", description="d", priority="high")
    assert (first["already_existed"], again["already_existed"]) == (False, True)
    assert first["ticket_id"] == again["ticket_id"]
    assert len(list_tickets(tmp_path)) == 1


def test_other_content_at_the_same_position_is_a_conflict(tmp_path: Path) -> None:
    create_ticket(ctx(tmp_path), title="t", description="d", priority="high")
    with pytest.raises(ToolFailure) as info:
        create_ticket(ctx(tmp_path), title="other", description="d", priority="high")
    assert info.value.envelope.error_code == "IDEMPOTENCY_CONFLICT"
    assert len(list_tickets(tmp_path)) == 1
