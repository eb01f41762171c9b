"""Printing on a terminal: untrusted text made safe, events and RunResults (for the CLI
and the demo alike).

Rich reads `[...]` as markup and a terminal obeys escape sequences: model text such as
`[/INST]` would crash a print, `[link=…]` would become a hyperlink, and ANSI codes
would restyle the screen. Everything that did not come from boundloop goes through
`safe`.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from boundloop.core import model_failures as mf
from boundloop.core.reasons import NEXT_CHECK, StopReason
from boundloop.exit_codes import ExitCode
from boundloop.visible import escape_of, has_invisible, invisible

if TYPE_CHECKING:  # the run's types: loaded by whoever has a RunResult to print
    from boundloop.contracts import RunResult, RunStatus
    from boundloop.settings import Settings

# Piped output keeps long run ids whole (tables would cut them at 80 columns).
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)


def safe(text: object) -> str:
    """`text` with rich markup escaped and each invisible character (C0/C1 controls such
    as ANSI escapes, bidi overrides that make text read backwards, zero-width
    characters; boundloop/visible.py) written as its escape, highlighted: `\\u202e`.
    Newlines and tabs stay (an answer has lines)."""
    text = str(text)
    out: list[str] = []
    plain = ""
    for ch in text:
        if ch in "\n\t" or not invisible(ch):
            plain += ch
            continue
        # Escaped piece by piece: a piece ending in a backslash keeps the tag a tag.
        out += [escape(plain), f"[reverse]{escape_of(ch)}[/reverse]"]
        plain = ""
    return "".join([*out, escape(plain)])


def invisible_note(arguments: Any) -> str:
    """A line under a call's arguments when they hold invisible characters (`safe`
    shows each as its escape): the approver is told to look at them."""
    if not has_invisible(arguments):
        return ""
    return ("\n[bold yellow]contains invisible/control characters, shown as escapes such "
            "as \\u202e[/]")


def no_worker(task_queue: str) -> str:
    """The line for a run no worker has answered for a while (`client.follow`)."""
    from boundloop.errors import worker_hint

    return (f"[yellow]no worker is answering for this run: {safe(worker_hint(task_queue))}"
            "[/]")


def print_event(ev: Any) -> None:
    parts = [f"step {ev.step}", safe(ev.event)]
    if ev.tool:
        parts.append(safe(ev.tool))
    if ev.call_id:
        parts.append(f"call_id={safe(ev.call_id)}")
    if ev.fingerprint:
        parts.append(f"fp={ev.fingerprint.split(':')[-1][:8]}")
    if ev.detail:
        parts.append(safe(ev.detail))
    console.print("  " + " · ".join(parts), highlight=False)


def print_tool_failure(events: list[Any]) -> None:
    """Where the failed tool's traceback is: the worker's log line with its fingerprint."""
    for ev in reversed(events):
        if ev.event == "tool_failed" and ev.fingerprint:
            console.print(f"hint: the worker logged the traceback of {safe(ev.tool)} in the "
                          f"line with fingerprint={safe(ev.fingerprint)} (a worker of your "
                          "own logs it with boundloop.configure_logging())", highlight=False)
            return


def print_model_failure(events: list[Any]) -> None:
    """The last failed model request's kind, what happened and the hint that fixes it."""
    for ev in reversed(events):
        if ev.event.startswith(mf.EVENT_PREFIX):
            kind = ev.event.removeprefix(mf.EVENT_PREFIX)
            console.print(f"model request failed: {safe(kind)}"
                          + (f" — {safe(ev.detail)}" if ev.detail else ""), highlight=False)
            console.print(f"hint: {safe(mf.hint(kind))}", highlight=False)
            return


def print_context(events: list[Any]) -> None:
    """Why the run's context ran out: the estimate against the window, or the provider's
    refusal (with the hint)."""
    for ev in reversed(events):
        if ev.event == "context_exhausted":
            console.print(f"context: {safe(ev.detail or '')}", highlight=False)
            return
        if ev.event.startswith(mf.EVENT_PREFIX):
            print_model_failure([ev])
            return


def print_result(result: RunResult, settings: Settings) -> None:
    colour = "green" if result.reason == StopReason.COMPLETED else "yellow"
    console.print(f"[bold {colour}]reason: {result.reason.value}[/] — "
                  f"{NEXT_CHECK[result.reason]}")
    if result.reason == StopReason.MODEL_ERROR:
        print_model_failure(result.events)
    if result.reason == StopReason.TOOL_ERROR:
        print_tool_failure(result.events)
    if result.reason == StopReason.CONTEXT_EXHAUSTED:
        print_context(result.events)
    console.print(f"steps {result.steps} · tool executions {result.tool_executions} · "
                  f"tokens {result.total_tokens} (in {result.input_tokens}, out "
                  f"{result.output_tokens}{', estimated' if result.usage_estimated else ''}"
                  f"{', some unknown' if result.usage_unknown else ''})"
                  + (f" · cost ${result.cost_usd:.6f}" if result.cost_usd is not None else ""))
    if result.cancel_reason:
        console.print(f"[bold]cancelled:[/] {safe(result.cancel_reason)}")
    if result.text:
        console.print(f"[bold]answer:[/] {safe(result.text)}")
    if result.answer_looks_like_tool_call:
        console.print("[bold yellow]the answer looks like a tool call:[/] it was not "
                      "executed, and it is not an answer to the question")
    from boundloop._ops import ui_link

    console.print(f"Web UI: {ui_link(settings, result.workflow_id, result.run_id)}")


def exit_code(result: RunResult) -> ExitCode:
    """OK when the run completed, CONTEXT_EXHAUSTED when its context ran out, STOPPED
    when it stopped for any other reason."""
    if result.reason == StopReason.CONTEXT_EXHAUSTED:
        return ExitCode.CONTEXT_EXHAUSTED
    return ExitCode.OK if result.reason == StopReason.COMPLETED else ExitCode.STOPPED


def print_grants(status: RunStatus) -> None:
    """The approvals remembered for the rest of the run, one line each."""
    for g in status.grants:
        console.print(f"remembered: {safe(g.text)} (approved by {safe(g.approver)} on "
                      f"`{safe(g.call_id)}`; this {g.scope} only)")


def print_stuck(rows: list[dict[str, Any]]) -> None:
    """Under the table, each stuck run's cause and fix (too long for a column)."""
    for r in rows:
        if r["stuck"]:
            console.print(f"[red]stuck:[/] {safe(r['workflow_id'])}: {safe(r['stuck'])}",
                          soft_wrap=True)
