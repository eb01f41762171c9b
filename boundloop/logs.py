"""Structured worker logs: message + workflow id, step, tool, fingerprint.

Only allow-listed fields are printed, so a raw argument, tool output, prompt or key
that reached a log record's attributes still never reaches the log line.

Ids and values come from whoever starts a run (a workflow id, a tool name the model
wrote): a newline in one would write a line of its own, a bidi override would make the
line read otherwise. So every control and invisible character of a message or field is
written as its escape (`\\n`, `\\u202e`; boundloop/visible.py), and the lines after a
record's first (a traceback) are indented: each line that starts at the margin is a
record's own.
"""

from __future__ import annotations

import json
import logging
import traceback
from typing import Any, Literal

from boundloop.visible import escaped, json_visible

FIELDS = ("step", "tool", "fingerprint", "call_id", "status", "reason", "attempt", "error",
          "failure", "detail", "api", "items", "problem", "task_queue", "traceback")


def traceback_text(exc: BaseException, *, messages: bool = False) -> str:
    """The exception's traceback for the worker's log: frames (file, line, function,
    source line) and exception types, through its causes. Messages are left out unless
    `messages` is set: they may carry raw arguments, rows or credentials."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        frames = "".join(traceback.format_list(traceback.extract_tb(current.__traceback__)))
        name = type(current).__qualname__
        head = f"{name}: {escaped(str(current))}" if messages else name
        parts.append(f"Traceback (most recent call last):\n{frames}{head}")
        chained = current.__cause__ or (None if current.__suppress_context__
                                        else current.__context__)
        current = chained
    return "\n\nThe above exception caused or preceded this one:\n\n".join(reversed(parts))


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    out: dict[str, Any] = {}
    wf = getattr(record, "temporal_workflow", None) or {}
    act = getattr(record, "temporal_activity", None) or {}
    if isinstance(wf, dict) and wf.get("workflow_id"):
        out["workflow_id"] = wf["workflow_id"]
    elif isinstance(act, dict) and act.get("workflow_id"):
        out["workflow_id"] = act["workflow_id"]
    if isinstance(act, dict) and act.get("activity_type"):
        out["activity"] = act["activity_type"]
    for name in FIELDS:
        value = getattr(record, name, None)
        if value is not None:
            out[name] = value
    if record.exc_info and record.exc_info[0] is not None and "error" not in out:
        out["error"] = record.exc_info[0].__name__  # the type only: messages may hold data
    return out


def message(record: logging.LogRecord) -> str:
    """The formatted message without Temporal's info dict (carried as fields instead)."""
    try:
        text = record.getMessage()
    except (TypeError, ValueError):
        text = str(record.msg)
    return text.split(" ({'")[0]


class TextFormatter(logging.Formatter):
    """`time level logger message key=value …`"""

    def format(self, record: logging.LogRecord) -> str:
        # The fields go on the first line, so the line to look for (fingerprint=…, a
        # workflow id) is the one that says what happened; a traceback follows it.
        text = message(record)
        head, _, rest = text.partition("\n")
        fields = fields_of(record)
        trace = fields.pop("traceback", None)
        if trace and trace not in text:
            rest = f"{rest}\n{trace}" if rest else trace
        extra = " ".join(f"{k}={escaped(str(v))}" for k, v in fields.items())
        line = (f"{self.formatTime(record)} {record.levelname} {escaped(record.name)} "
                f"{escaped(head)} {extra}")
        if not rest:
            return line.rstrip()
        more = "\n".join(f"  {escaped(x)}" for x in rest.split("\n"))
        return f"{line.rstrip()}\n{more}"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json_visible(json.dumps(
            {"time": self.formatTime(record), "level": record.levelname,
             "logger": record.name, "message": message(record), **fields_of(record)},
            ensure_ascii=False, default=str))


def tool_error_messages_from_env() -> bool:
    """BOUNDLOOP_LOG_TOOL_ERRORS (`1`/`true`/`yes`/`on`, default off): whether a worker logs
    an unexpected tool exception's message with its traceback. Raises ValueError."""
    from boundloop.settings import log_settings

    return log_settings().log_tool_error_messages


def configure(fmt: Literal["text", "json"] | None = None,
              level: int | str = logging.INFO) -> None:
    """Log as `boundloop worker` does, in a worker (or any process) of your own: one line
    per record, `text` (`time level logger message key=value …`) or `json`, with the
    run's fields (workflow_id, step, tool, fingerprint, …) and never an argument, tool
    output, prompt or key. `fmt` defaults to BOUNDLOOP_LOG_FORMAT, else `text`. Replaces
    the root logger's handlers; call it once, before starting the worker.

        boundloop.configure_logging()
        async with boundloop.Worker(client, agent, deps=..., model=...):
            ...
    """
    if fmt is None:
        from boundloop.settings import log_settings

        fmt = log_settings().log_format
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # openai/httpx print request bodies (prompts, arguments) at DEBUG, and the MCP SDK
    # (`mcp`) its requests and responses (tool arguments and results): keep them quiet.
    for name in ("openai", "httpx", "httpx2", "httpcore", "mcp"):
        logging.getLogger(name).setLevel(logging.WARNING)
