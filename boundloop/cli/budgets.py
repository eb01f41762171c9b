"""Shared budgets: `budget set`, `budget show`, `budget reset`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from boundloop.cli.common import (
    QUERY_TIMEOUT,
    UPDATE_TIMEOUT,
    _run,
    app,
    connect,
    fail,
    load_settings,
    validation_lines,
)
from boundloop.exit_codes import ExitCode
from boundloop.terminal import console, safe

budget_app = typer.Typer(no_args_is_help=True,
                         help="Budgets shared by many runs: set a key's limits, show it.")


app.add_typer(budget_app, name="budget")


def _budget_key(key: str) -> str:
    from boundloop.budgets import check_key

    try:
        return check_key(key)
    except ValueError as exc:
        raise fail(str(exc)) from None


def _print_view(view: Any, as_json: bool) -> None:
    from boundloop.budgets import view_lines

    if as_json:
        console.print_json(view.model_dump_json())
    else:
        for line in view_lines(view):
            console.print(safe(line), highlight=False)


@budget_app.command("set")
def budget_set(
    key: Annotated[str, typer.Argument(help="Budget key (a tenant, project, API key)")],
    usd: Annotated[float | None, typer.Option("--usd", help="USD limit")] = None,
    tokens: Annotated[int | None, typer.Option("--tokens", help="Token limit")] = None,
    period: Annotated[str, typer.Option("--period", help="total | day (UTC)")] = "total",
    admin: Annotated[str, typer.Option("--as", help="Budget admin name")] = "operator",
    key_file: Annotated[Path | None, typer.Option(
        "--key", help="Sign the change with this private key (NAME.key from `keys new`)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
) -> None:
    """Start the ledger of KEY with these limits, or change them (spent and reserved stay).
    Where the workers have approver keys, only a budget admin's signed change counts."""
    from boundloop.budgets import set_budget
    from boundloop.cli.approvals import load_signer
    from boundloop.core.budget import BudgetLimits
    from boundloop.errors import BudgetRefused

    settings = load_settings()
    _budget_key(key)
    signer = load_signer(admin, key_file)
    try:
        limits = BudgetLimits.model_validate({"usd": usd, "tokens": tokens, "period": period})
    except ValidationError as exc:
        raise fail("invalid budget:\n" + validation_lines(exc)) from None

    async def go() -> None:
        client = await connect(settings)
        try:
            view = await asyncio.wait_for(
                set_budget(client, key, limits, task_queue=settings.task_queue,
                           signer=signer), UPDATE_TIMEOUT)
        except BudgetRefused as exc:
            raise fail(str(exc), ExitCode.FAILED) from None
        except TimeoutError:
            raise fail(f"no worker answered within {UPDATE_TIMEOUT:g} s: is `boundloop "
                       f"worker` running on task queue {settings.task_queue!r}? (the ledger "
                       "takes the limits when one starts)", ExitCode.FAILED) from None
        _print_view(view, as_json)

    _run(go())


@budget_app.command("reset")
def budget_reset(
    key: Annotated[str, typer.Argument(help="Budget key")],
    drop: Annotated[list[str] | None, typer.Option(
        "--drop", help="Drop this run's reservation (repeat for several runs)")] = None,
    keep_spent: Annotated[bool, typer.Option(
        "--keep-spent", help="Keep the spent total (only drop reservations)")] = False,
    admin: Annotated[str, typer.Option("--as", help="Budget admin name")] = "operator",
    key_file: Annotated[Path | None, typer.Option(
        "--key", help="Sign the reset with this private key (NAME.key from `keys new`)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
) -> None:
    """Recover KEY's ledger after an incident: spent back to zero, and the reservations
    of the runs named by --drop dropped (the limits stay). Where the workers have approver
    keys, only a budget admin's signed reset counts."""
    from temporalio.service import RPCError, RPCStatusCode

    from boundloop.budgets import reset_budget
    from boundloop.cli.approvals import load_signer
    from boundloop.core.budget import BudgetReset
    from boundloop.errors import BudgetRefused

    settings = load_settings()
    _budget_key(key)
    signer = load_signer(admin, key_file)
    change = BudgetReset(spent=not keep_spent, drop=drop or [])

    async def go() -> None:
        client = await connect(settings)
        try:
            view = await asyncio.wait_for(reset_budget(client, key, change, signer=signer),
                                          UPDATE_TIMEOUT)
        except BudgetRefused as exc:
            raise fail(str(exc), ExitCode.FAILED) from None
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
            raise fail(f"no budget {key!r}: nothing to reset") from None
        except TimeoutError:
            raise fail(f"no worker answered within {UPDATE_TIMEOUT:g} s: is `boundloop "
                       "worker` running?", ExitCode.FAILED) from None
        _print_view(view, as_json)

    _run(go())


@budget_app.command("show")
def budget_show(
    key: Annotated[str, typer.Argument(help="Budget key")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
) -> None:
    """Spent, reserved and left, and the runs holding reservations."""
    from boundloop.budgets import show_budget

    settings = load_settings()
    _budget_key(key)

    async def go() -> None:
        client = await connect(settings)
        try:
            view = await asyncio.wait_for(show_budget(client, key), QUERY_TIMEOUT)
        except TimeoutError:
            raise fail(f"no worker answered within {QUERY_TIMEOUT:g} s: is `boundloop "
                       "worker` running?", ExitCode.FAILED) from None
        if view is None:
            raise fail(f"no budget {key!r}: set it with `boundloop budget set {key} "
                       "--usd AMOUNT`")
        _print_view(view, as_json)

    _run(go())
