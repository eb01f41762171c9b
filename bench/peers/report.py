"""The bench's ~4 KB tool result, the same for boundloop, bare Temporal and the peers.

Plain Python (no boundloop import): the peers' workers import it from their own venv.
"""

from __future__ import annotations

import json
from typing import Any

#: UTF-8 JSON bytes of `report()`'s data (boundloop's envelope adds ~60 bytes).
REPORT_BYTES = 3900


def _bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def report(part: int) -> dict[str, Any]:
    """Rows of an inventory report, trimmed to REPORT_BYTES of compact JSON."""
    rows: list[dict[str, Any]] = []
    data: dict[str, Any] = {"part": part, "rows": rows}
    i = 0
    while True:
        row = {"sku": f"{chr(65 + (part + i) % 26)}-{(part * 37 + i) % 1000:03d}",
               "warehouse": f"WH-{(part + i) % 9}", "quantity": (part * 13 + i * 7) % 500,
               "note": "restock scheduled; supplier confirmed lead time"}
        rows.append(row)
        if _bytes(data) > REPORT_BYTES:
            rows.pop()
            break
        i += 1
    pad = REPORT_BYTES - _bytes(data) - len(',"pad":""')
    if pad > 0:
        data["pad"] = "." * pad
    return data


def report_json(part: int) -> str:
    """`report(part)` as compact JSON, what a tool hands the model."""
    return json.dumps(report(part), ensure_ascii=False, separators=(",", ":"))
