"""The demo tools over their real SQLite store."""

from __future__ import annotations

from pathlib import Path

import pytest

from boundloop.core.envelope import ToolStatus
from boundloop.tools.demo import (
    CreateTicketArgs,
    LookupStockArgs,
    SearchDocsArgs,
    create_ticket,
    list_tickets,
    lookup_stock,
    search_docs,
)
from boundloop.tools.registry import ToolContext, ToolFailure


def ctx(tmp_path: Path, key: str = "wf/step-1/call-0") -> ToolContext:
    return ToolContext(idempotency_key=key, workflow_id="wf", call_id="c", step=1,
                       data_dir=tmp_path, max_result_bytes=4096)


def test_lookup_stock_seed_values(tmp_path: Path) -> None:
    assert lookup_stock(LookupStockArgs(sku="A-001"), ctx(tmp_path))["quantity"] == 12
    assert lookup_stock(LookupStockArgs(sku="B-002"), ctx(tmp_path))["quantity"] == 0
    assert lookup_stock(LookupStockArgs(sku="Z-999"), ctx(tmp_path)) == {
        "sku": "Z-999", "found": False}


def test_search_docs_finds_and_reports_not_found(tmp_path: Path) -> None:
    found = search_docs(SearchDocsArgs(query="refund", limit=1), ctx(tmp_path))
    assert [r["doc"] for r in found["results"]] == ["returns.md"]
    with pytest.raises(ToolFailure) as info:
        search_docs(SearchDocsArgs(query="zzzz-nothing", limit=3), ctx(tmp_path))
    assert info.value.envelope.status == ToolStatus.NOT_FOUND


def test_retried_ticket_returns_the_first_and_changes_nothing(tmp_path: Path) -> None:
    args = CreateTicketArgs(title="t", description="d", priority="high")
    first = create_ticket(args, ctx(tmp_path))
    again = create_ticket(args, ctx(tmp_path))
    assert (first["already_existed"], again["already_existed"]) == (False, True)
    assert first["ticket_id"] == again["ticket_id"]
    assert len(list_tickets(tmp_path)) == 1


def test_other_content_at_the_same_position_is_a_conflict(tmp_path: Path) -> None:
    create_ticket(CreateTicketArgs(title="t", description="d", priority="high"), ctx(tmp_path))
    with pytest.raises(ToolFailure) as info:
        create_ticket(CreateTicketArgs(title="other", description="d", priority="high"),
                      ctx(tmp_path))
    assert info.value.envelope.error_code == "IDEMPOTENCY_CONFLICT"
    assert len(list_tickets(tmp_path)) == 1
