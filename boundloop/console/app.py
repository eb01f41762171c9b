"""`boundloop console`: the runs, their approvals and the sessions, in a browser.

Every page needs a signed-in approver; every decision is a POST carrying the session's
CSRF token, made through the public client API (`Run.approve` / `Run.reject`) as the
signed-in approver, and signed with that approver's key when the console holds one.
Every response carries a Content-Security-Policy that allows the console's own
scripts and style sheet only (`/static/…`, no inline script) and no framing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, urlencode

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.service import RPCError

from boundloop import _ops as ops
from boundloop.console import auth
from boundloop.console import html as h
from boundloop.contracts import SESSION_WORKFLOW, RunResult, RunStatus, SessionStatus
from boundloop.core.canonical import preview
from boundloop.core.loop import Approval, Event
from boundloop.core.place import TreePlace
from boundloop.core.reasons import StopReason
from boundloop.errors import (
    DecisionRefused,
    InvalidDecision,
    RunEnded,
    RunNotFound,
    SessionRefused,
)

if TYPE_CHECKING:
    from boundloop.signing import Signer

log = logging.getLogger("boundloop.console")

#: How long a page waits for a worker to answer a query or take a decision.
QUERY_TIMEOUT = 10.0
DECISION_TIMEOUT = 30.0
#: The largest form body read (edited arguments included).
MAX_FORM_BYTES = 256 * 1024
STATES = ["running", "waiting_approval", "stopped", "completed"]
#: How long a refused sign-in waits before its answer (a guesser gets one try a second
#: per connection; the lockout does the rest).
FAILED_SIGN_IN_DELAY = 1.0
#: The sign-in page's errors: `?error=CODE` shows one of these, an unknown code nothing.
SIGN_IN_ERRORS = {
    "credential": "wrong approver or credential",
    "locked": "too many failed sign-ins for this approver or from this address: "
              "sign-in is refused for a while, try again later",
}
#: Turns a session's chat view shows (the latest; older ones by their run pages).
SESSION_TURNS_SHOWN = 20
#: How much of a run's question the runs list and the inbox show (its page: all of it).
QUESTION_SHOWN = 160
#: Runs whose question the runs list reads at once (one describe each).
DESCRIBES_AT_ONCE = 16


@dataclass
class Console:
    """What the console serves with: a connected client, the approvers and their keys."""

    client: Client
    approvers: dict[str, auth.Credential]
    sessions: auth.Sessions
    #: approver name -> private key, kept server-side (docs/console.md, "Signing").
    signers: dict[str, Signer] = field(default_factory=dict)
    #: Set the cookie's Secure flag (the console is served over HTTPS, or behind a proxy
    #: that is).
    secure_cookie: bool = False
    #: Failed sign-ins per name and address, and their lockouts.
    guard: auth.SignInGuard = field(default_factory=auth.SignInGuard)
    #: Turns started from the chat view, kept so the task is not collected mid-turn.
    _turns: set[asyncio.Task[Any]] = field(default_factory=set)
    #: Credential checks at once (each is an scrypt: some 50 ms of CPU and 16 MiB).
    _scrypts: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(2))


# --- what the run page shows --------------------------------------------------------------


async def snapshot(client: Client, workflow_id: str) -> dict[str, Any]:
    """The run as its page draws it: status, counters against their caps, the event log,
    waiting calls and, once it has ended, its answer. Polled by the page; the one place
    that reads a run's progress."""
    handle = client.get_workflow_handle(workflow_id, result_type=RunResult)
    desc = await handle.describe()
    closed = desc.status != WorkflowExecutionStatus.RUNNING
    status: RunStatus | None = None
    with contextlib.suppress(RPCError, TimeoutError):
        status = await asyncio.wait_for(ops.query_status(handle), timeout=QUERY_TIMEOUT)
    result: RunResult | None = None
    if closed:
        with contextlib.suppress(Exception):  # terminated / timed out: no RunResult
            result = await ops.result_of(handle)
    events = (status.events if status else result.events if result else [])
    limits = status.limits if status else None
    children = ([c.model_dump(mode="json") for c in await ops.children_now(client, status)]
                if status is not None else await _listed_children(client, workflow_id))
    return {
        "workflow_id": workflow_id,
        "closed": closed,
        "execution": desc.status.name.lower() if desc.status else "",
        "answered": status is not None,
        "status": (status.status if status else
                   ("completed" if result and result.reason == StopReason.COMPLETED else
                    "stopped" if result else (desc.status.name.lower() if desc.status
                                              else ""))),
        "reason": (result.reason.value if result else
                   status.reason.value if status and status.reason else None),
        "question": status.question if status else "",
        "model": status.model if status else "",
        "steps": result.steps if result else status.steps if status else 0,
        "tool_executions": (result.tool_executions if result else
                            status.tool_executions if status else 0),
        "total_tokens": result.total_tokens if result else status.total_tokens if status else 0,
        "cost_usd": result.cost_usd if result else status.cost_usd if status else None,
        "limits": limits.model_dump(mode="json") if limits else None,
        "events": [ev.model_dump(mode="json", exclude_none=True) for ev in events],
        "pending": [a.model_dump(mode="json") for a in (status.pending if status else [])],
        # The run the waiting calls belong to (first execution run id): a decision names it.
        "run": status.run if status else "",
        "text": result.text if result else None,
        "cancel_reason": result.cancel_reason if result else None,
        # Its place in an agent tree (a sub-agent's run), the workflow that started it
        # (Temporal's parent: a sub-agent's caller, a turn's session) and its sub-agents.
        "tree": status.tree.model_dump(mode="json") if status and status.tree else None,
        "parent": desc.parent_id,
        "root": desc.root_id,
        "children": children,
    }


async def _listed_children(client: Client, workflow_id: str) -> list[dict[str, Any]]:
    """A run's sub-agents as the server lists them, when no worker answered its status
    query: their states, not their spend."""
    with contextlib.suppress(RPCError):
        return [{"workflow_id": r["workflow_id"], "tool": r["tool"],
                 "state": r["reason"] or r["status"]}
                for r in await ops.child_runs(client, workflow_id)]
    return []


#: What the run says asked for a person (`Approval.asked_by`), as the inbox says it.
ASKED_BY = {
    "policy": 'the run\'s approval policy (approval "always": every side-effecting tool '
              "asks)",
    "declaration": "the tool's declaration (needs_approval=True: every call asks)",
    "predicate": "the tool's needs_approval predicate, for these arguments (a predicate "
                 "that raises asks too)",
}


def asked_because(approval: Approval) -> str:
    """Why the call waits for a person: the policy rule that asked, the tool's
    declaration, its predicate, or the run's approval policy, as the run names it."""
    rule = getattr(approval, "asked_because", None)
    if rule:
        return f"a policy rule: {rule}"
    named = ASKED_BY.get(getattr(approval, "asked_by", None) or "")
    if named is not None:
        return named
    # A worker from before runs record which: one of the two, not said which.
    return "the tool requires approval (its needs_approval flag, or the run's policy)"


# --- requests ------------------------------------------------------------------------------


Handler = Callable[[Request, Console, auth.SignedIn], Awaitable[Response]]


async def form_of(request: Request) -> dict[str, str]:
    """An urlencoded form (the only kind the console's pages send), first value of each
    field; refused past MAX_FORM_BYTES."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return {}
    parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[0] for k, v in parsed.items()}


def local(url: str | None, default: str = "/") -> str:
    """A redirect target on this console only (never another site)."""
    if not url or not url.startswith("/") or url.startswith("//") or "\\" in url:
        return default
    return url


def signed_in(console: Console, request: Request) -> auth.SignedIn | None:
    who = console.sessions.read(request.cookies.get(auth.COOKIE))
    return who if who is not None and who.approver in console.approvers else None


def guarded(console: Console, handler: Handler, *, json_api: bool = False
            ) -> Callable[[Request], Awaitable[Response]]:
    """Refuse a request without a valid session (GET pages redirect to sign-in) and a
    POST without the session's CSRF token; nothing runs for either."""

    async def endpoint(request: Request) -> Response:
        who = signed_in(console, request)
        if who is None:
            if request.method == "GET" and not json_api:
                return RedirectResponse(f"/login?{urlencode({'next': request.url.path})}",
                                        303)
            return JSONResponse({"error": "sign in first"}, 401)
        if request.method == "POST":
            form = await form_of(request)
            if not auth.csrf_ok(who, form.get("csrf")):
                return JSONResponse({"error": "missing or wrong CSRF token"}, 403)
            request.state.form = form
        return await handler(request, console, who)

    return endpoint


def _page(who: auth.SignedIn, title: str, body: str, request: Request,
          script: str = "", body_attrs: dict[str, str] | None = None) -> HTMLResponse:
    q = request.query_params
    note, error = q.get("note"), q.get("error")
    # Only what this console said after this session's own request (a link made
    # elsewhere cannot put words into a console page).
    if not auth.flash_ok(who, f"{note or ''}\0{error or ''}", q.get("mac")):
        note = error = None
    return HTMLResponse(h.page(title, body, approver=who.approver, csrf=who.csrf,
                               note=note, error=error, script=script,
                               body_attrs=body_attrs))


def _back(who: auth.SignedIn, target: str, *, note: str | None = None,
          error: str | None = None) -> RedirectResponse:
    """Back to `target`, with a note or an error its page shows (under a MAC)."""
    params = {k: v for k, v in (("note", note), ("error", error)) if v is not None}
    if params:
        params["mac"] = auth.flash_mac(who, f"{note or ''}\0{error or ''}")
    sep = "&" if "?" in target else "?"
    return RedirectResponse(f"{target}{sep}{urlencode(params)}" if params else target, 303)


# --- sign-in -----------------------------------------------------------------------------


async def login_page(request: Request) -> Response:
    nxt = local(request.query_params.get("next"))
    error = SIGN_IN_ERRORS.get(request.query_params.get("error") or "")
    body = (f'<form method="post" action="/login" class="card">'
            f'<input type="hidden" name="next" value="{h.e(nxt)}">'
            f'<p><label>Approver <input name="approver" autocomplete="username"></label></p>'
            f'<p><label>Password or token <input name="credential" type="password" '
            f'autocomplete="current-password"></label></p>'
            f'<p><button name="signin">Sign in</button></p></form>')
    return HTMLResponse(h.page("Sign in", body, error=error))


def login(console: Console) -> Callable[[Request], Awaitable[Response]]:
    _dummy()  # hashed as the console starts: the first unknown name costs what others do

    async def endpoint(request: Request) -> Response:
        form = await form_of(request)
        name, secret = form.get("approver", ""), form.get("credential", "")
        nxt = local(form.get("next"))
        keys = console.guard.keys(name, request.client.host if request.client else None)
        if not console.guard.begin(keys):
            # Locked out: refused before any scrypt, the right credential included.
            log.warning("console sign-in refused: locked out")
            await asyncio.sleep(FAILED_SIGN_IN_DELAY)
            return RedirectResponse(f"/login?{urlencode({'error': 'locked', 'next': nxt})}",
                                    303)
        ok = False
        try:
            credential = console.approvers.get(name)
            async with console._scrypts:
                # The same work whether or not the name exists: no telling names apart.
                matched = await asyncio.to_thread((credential or _dummy()).matches, secret)
            ok = matched and credential is not None
        finally:
            console.guard.end(keys, ok)
        if not ok:
            log.warning("console sign-in refused")  # never the name or the credential
            await asyncio.sleep(FAILED_SIGN_IN_DELAY)
            query = urlencode({"error": "credential", "next": nxt})
            return RedirectResponse(f"/login?{query}", 303)
        cookie, _ = console.sessions.issue(name)
        response = RedirectResponse(nxt, 303)
        response.set_cookie(auth.COOKIE, cookie, max_age=auth.SESSION_SECONDS, httponly=True,
                            samesite="strict", secure=console.secure_cookie)
        log.info("console sign-in", extra={"approver": name})
        return response

    return endpoint


@functools.cache
def _dummy() -> auth.Credential:
    """What a sign-in with an unknown name is checked against: hashed when a console
    starts, not when the CLI is imported (scrypt costs some 50 ms and 16 MiB)."""
    return auth.Credential.parse(auth.hash_credential("not a credential anyone has"))


async def logout(request: Request, console: Console, who: auth.SignedIn) -> Response:
    response = RedirectResponse("/login", 303)
    response.delete_cookie(auth.COOKIE)
    return response


# --- the runs list -----------------------------------------------------------------------


async def events_of(client: Client, row: dict[str, Any]) -> list[Event]:
    """A listed run's event log: from its result once closed (no worker needed), else
    its status query."""
    handle = client.get_workflow_handle(row["workflow_id"], result_type=RunResult)
    with contextlib.suppress(Exception):
        if row["status"] in ("completed", "stopped"):
            return (await ops.result_of(handle)).events
        return (await asyncio.wait_for(ops.query_status(handle), timeout=QUERY_TIMEOUT)).events
    return []


def decided_by(events: list[Event]) -> set[str]:
    return {ev.detail.removeprefix("by ").split(",")[0] for ev in events
            if ev.event in ("approval_approved", "approval_rejected") and ev.detail}


async def questions_of(client: Client, rows: list[dict[str, Any]]) -> list[str]:
    """Each listed run's question, from the summary it was started with (the server
    alone, no worker; decoded with the console's codec keys): "" where there is none."""
    limit = asyncio.Semaphore(DESCRIBES_AT_ONCE)

    async def one(row: dict[str, Any]) -> str:
        handle = client.get_workflow_handle(row["workflow_id"], run_id=row.get("run_id"))
        with contextlib.suppress(Exception):  # gone since it was listed, a key missing
            async with limit:
                summary = await (await handle.describe()).static_summary()
            return preview(summary or "", QUESTION_SHOWN)
        return ""

    return list(await asyncio.gather(*(one(r) for r in rows)))


async def runs_page(request: Request, console: Console, who: auth.SignedIn) -> Response:
    q = request.query_params
    state, reason = q.get("state") or None, q.get("reason") or None
    tool, approver = q.get("tool") or None, q.get("approver") or None
    root = q.get("root") or None  # one agent tree (a run page's "every run of this tree")
    rows = await ops.list_runs(console.client, state, reason, limit=100, root=root)
    if tool or approver:
        logs = await asyncio.gather(*(events_of(console.client, r) for r in rows))
        rows = [r for r, events in zip(rows, logs, strict=True)
                if (not tool or any(ev.tool == tool for ev in events))
                and (not approver or approver in decided_by(events))]
    filters = (
        '<form method="get" action="/" class="card" id="filters">'
        f'<label>state <select name="state">{h.options(STATES, state)}</select></label> '
        f'<label>reason <select name="reason">'
        f'{h.options([r.value for r in StopReason], reason)}</select></label> '
        f'<label>tool <input name="tool" value="{h.e(tool)}" size="14"></label> '
        f'<label>approver <input name="approver" value="{h.e(approver)}" size="12"></label> '
        + (f'<input type="hidden" name="root" value="{h.e(root)}">' if root else "")
        + '<button>Filter</button> <a href="/">clear</a>'
        + (f' · the agent tree of {h.run_link(root)}' if root else "") + '</form>')
    questions = await questions_of(console.client, rows)
    lines = "".join(
        f'<tr class="{h.e(r["status"])}" data-run="{h.e(r["workflow_id"])}">'
        f'<td>{h.run_link(r["workflow_id"])}'
        # A sub-agent's run (or a session's turn): the run that started it.
        + (f'<br><span class="parent">started by {h.run_link(r["parent"])}</span>'
           if r["parent"] else "") + '</td>'
        f'<td class="question">{h.prose(q)}</td>'
        f'<td>{h.state_badge(r["status"], r["reason"])}</td>'
        f'<td>{r["steps"]}</td><td>{r["tool_executions"]}</td>'
        f'<td>{r["pending_approvals"] or ""}</td><td>{h.e(h.when(r["start_time"]))}</td></tr>'
        for r, q in zip(rows, questions, strict=True))
    table = ('<table id="runs"><thead><tr><th>run</th><th>question</th><th>state</th>'
             '<th>steps</th><th>tool executions</th><th>waiting</th><th>started</th></tr>'
             f'</thead><tbody>{lines}</tbody></table>' if rows
             else '<p id="runs">no runs match</p>')
    return _page(who, "Runs", filters + table, request)


# --- one run ----------------------------------------------------------------------------


def decision_forms(workflow_id: str, a: Approval | dict[str, Any], csrf: str,
                   back: str, first_run: str = "") -> str:
    """Approve / reject with a reason / edit the arguments, for one waiting call. Each form
    carries the run (`first_run`) and the arguments' fingerprint shown here: the run
    refuses the decision if the call changed since (a new run under the same workflow id,
    other arguments under the same call id)."""
    call_id = a["call_id"] if isinstance(a, dict) else a.call_id
    arguments = a["arguments"] if isinstance(a, dict) else a.arguments
    fp = a["fingerprint"] if isinstance(a, dict) else a.fingerprint
    hidden = (h.csrf_field(csrf) + f'<input type="hidden" name="run" value="{h.e(workflow_id)}">'
              f'<input type="hidden" name="call_id" value="{h.e(call_id)}">'
              f'<input type="hidden" name="fingerprint" value="{h.e(fp)}">'
              f'<input type="hidden" name="first_run" value="{h.e(first_run)}">'
              f'<input type="hidden" name="back" value="{h.e(back)}">')
    return (
        f'<form class="inline" method="post" action="/decide">{hidden}'
        '<input type="hidden" name="action" value="approve">'
        '<button name="approve">Approve</button></form> '
        f'<form class="inline" method="post" action="/decide">{hidden}'
        '<input type="hidden" name="action" value="reject">'
        '<input name="reason" placeholder="reason (the model reads it)" required size="40">'
        '<button name="reject">Reject</button></form>'
        f'<details><summary>Edit arguments</summary>'
        f'<form method="post" action="/approvals/edit">{hidden}'
        f'<textarea name="arguments" rows="8">{h.e(h.pretty(arguments))}</textarea>'
        '<button name="review">Review the edit</button></form></details>')


def approval_card(workflow_id: str, a: Approval, csrf: str, back: str,
                  first_run: str = "", *, question: str | None = None,
                  tree: TreePlace | None = None) -> str:
    """One waiting call; `question`: the run's, on a page that is not the run's own;
    `tree`: the place of a sub-agent's run (the card shows the call's path from the root
    run: `ROOT → research → create_ticket`)."""
    asked = ("" if question is None else
             f'<p class="question">{h.prose(preview(question, QUESTION_SHOWN))}</p>')
    if tree is not None:
        asked = (f'<p class="path">asked in an agent tree: '
                 f'{h.tree_path(tree.root, [*tree.path, a.tool])}</p>{asked}')
    return (f'<div class="card approval" data-run="{h.e(workflow_id)}" '
            f'data-call="{h.e(a.call_id)}">'
            f'<p><b>{h.visible(a.tool)}</b> · call <code>{h.visible(a.call_id)}</code> · '
            f'step {a.step} · run {h.run_link(workflow_id)} · waiting since '
            f'{h.e(h.when(a.requested_at))}</p>{asked}'
            f'<p class="why">asked because: {h.visible(asked_because(a))}</p>'
            f'{h.arguments_view(a.arguments)}'
            f'{decision_forms(workflow_id, a, csrf, back, first_run)}</div>')


RUN_SCRIPT = "run.js"  # follows the run: its stream, counters and waiting calls


async def run_page(request: Request, console: Console, who: auth.SignedIn) -> Response:
    workflow_id = request.path_params["workflow_id"]
    try:
        s = await snapshot(console.client, workflow_id)
    except RPCError:
        return _page(who, "Run not found", f"<p>no run {h.e(workflow_id)}</p>", request)
    back = f"/runs/{quote(workflow_id, safe='')}"
    lim = s["limits"] or {}
    badge = h.state_badge(s["status"], s["reason"]).replace("<span", '<span id="state"', 1)
    steps = h.meter(s["steps"], lim.get("max_steps"), str(s["steps"]))
    counters = (
        '<table id="counters">'
        f'<tr><th>state</th><td>{badge}</td></tr>'
        f'<tr><th>steps</th><td id="steps">{steps}</td></tr>'
        f'<tr><th>tool executions</th><td id="tools">{s["tool_executions"]}</td></tr>'
        f'<tr><th>tokens</th><td id="tokens">{s["total_tokens"]}</td></tr>'
        f'<tr><th>cost</th><td id="cost"></td></tr>'
        f'<tr><th>model</th><td>{h.e(s["model"])}</td></tr></table>')
    pending = [Approval.model_validate(a) for a in s["pending"]]
    place = TreePlace.model_validate(s["tree"]) if s["tree"] else None
    waiting = "".join(approval_card(workflow_id, a, who.csrf, back, s.get("run", ""),
                                    tree=place)
                      for a in pending)
    not_answered = ("" if s["answered"] or s["closed"] else
                    '<p class="error">no worker answered this run\'s status query: is '
                    '`boundloop worker` running?</p>')
    body = (f'{not_answered}{tree_of(s, place)}<div class="card">'
            f'<p class="msg-user" id="question">{h.prose(s["question"])}</p>'
            '<div class="answer" id="answer"></div></div>'
            f'{counters}'
            + (f'<h2>Waiting for approval</h2>{waiting}' if waiting else "")
            + children_table(s["children"])
            + (tree_list_link(s) if s["children"] or s["tree"] else "")
            + '<h2>Timeline</h2><ol id="timeline"></ol>')
    return _page(who, f"Run {workflow_id}", body, request, script=RUN_SCRIPT,
                 body_attrs={"run": workflow_id,
                             "pending": ",".join(a.call_id for a in pending),
                             "children": children_sig(s["children"])})


def tree_of(s: dict[str, Any], place: TreePlace | None) -> str:
    """A sub-agent's run: its path from the root run and the run that started it."""
    if place is not None:
        return (f'<p class="card" id="tree">sub-agent run: '
                f'{h.tree_path(place.root, place.path)} · started by '
                f'{h.run_link(place.parent)}</p>')
    if s["parent"]:  # no worker answered: the server still knows its parent
        return f'<p class="card" id="tree">started by {h.run_link(s["parent"])}</p>'
    return ""


def children_table(children: list[dict[str, Any]]) -> str:
    """The sub-agents' runs a run started: each one's state and spend against its
    allowance, a link to its page."""
    if not children:
        return ""
    rows = []
    for c in children:
        tokens = ("" if "total_tokens" not in c else
                  h.meter(c["total_tokens"], c["token_allowance"],
                          f'{c["total_tokens"]} / {c["token_allowance"]}'))
        cost = ("" if c.get("cost_usd") is None else
                f'${c["cost_usd"]:.6f}' + (f' / ${c["usd_allowance"]:.4f}'
                                           if c.get("usd_allowance") is not None else ""))
        # Its own status while it runs (as its status query says), its stop reason
        # ("failed": no RunResult) once it ended.
        state = c["state"]
        badge = (h.state_badge(state) if state in ("running", "waiting_approval", "completed")
                 else h.state_badge("stopped", state))
        rows.append(f'<tr data-run="{h.e(c["workflow_id"])}"><td>{h.visible(c["tool"])}</td>'
                    f'<td>{badge}</td><td>{tokens}</td><td>{h.e(cost)}</td>'
                    f'<td>{h.run_link(c["workflow_id"])}</td></tr>')
    return ('<h2>Sub-agents</h2><table id="children"><thead><tr><th>sub-agent</th>'
            '<th>state</th><th>tokens / allowance</th><th>cost</th><th>run</th></tr>'
            f'</thead><tbody>{"".join(rows)}</tbody></table>')


def tree_list_link(s: dict[str, Any]) -> str:
    """Every run of the tree this run is in, on the runs list."""
    root = s["root"] or s["workflow_id"]
    return (f'<p><a id="tree-runs" href="/?{urlencode({"root": root})}">every run of this '
            'tree</a></p>')



def children_sig(children: list[dict[str, Any]]) -> str:
    """What the run page reloads on when it changes (run.js): each sub-agent and its
    state."""
    return ",".join(f'{c["workflow_id"]}:{c["state"]}' for c in children)


async def live(client: Client, workflow_id: str, from_offset: int) -> AsyncIterator[str]:
    """The run's stream (`Run.stream`) as Server-Sent Events: `id` is the item's offset
    (a browser reconnecting sends it back as Last-Event-ID), `data` the item as JSON;
    an `end` event after the last item."""
    run = await ops.get_run(client, workflow_id)
    async for item in run.stream(from_offset=from_offset):
        data = item.model_dump_json(exclude={"result": {"continuation"}}
                                    if item.kind == "result" else None)
        yield f"id: {item.offset}\nevent: item\ndata: {data}\n\n"
    yield "event: end\ndata: {}\n\n"


async def run_stream(request: Request, console: Console, who: auth.SignedIn) -> Response:
    last = request.headers.get("last-event-id") or request.query_params.get("after")
    start = int(last) + 1 if last and last.isdigit() else 0
    return StreamingResponse(live(console.client, request.path_params["workflow_id"], start),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-store"})


async def run_api(request: Request, console: Console, who: auth.SignedIn) -> Response:
    try:
        return JSONResponse(await snapshot(console.client, request.path_params["workflow_id"]))
    except RPCError as exc:
        return JSONResponse({"error": exc.message}, 404)


# --- the approvals inbox -------------------------------------------------------------------


async def approvals_page(request: Request, console: Console, who: auth.SignedIn) -> Response:
    unanswered: list[str] = []
    rows = await ops.pending_runs(console.client, unanswered)
    cards = "".join(approval_card(wf, a, who.csrf, "/approvals", status.run,
                                  question=status.question, tree=status.tree)
                    for wf, status in rows for a in status.pending)
    notes = "".join(f'<p class="error">{h.run_link(wf)} waits for approval but no worker '
                    'answered its status query</p>' for wf in unanswered)
    body = notes + (cards or '<p id="inbox-empty">no calls are waiting for approval</p>')
    return _page(who, "Approvals", f'<div id="inbox">{body}</div>', request)


async def edit_review(request: Request, console: Console, who: auth.SignedIn) -> Response:
    """The edited arguments as a diff against the proposed ones, to confirm or drop."""
    form = request.state.form
    workflow_id, call_id = form.get("run", ""), form.get("call_id", "")
    back = local(form.get("back"), "/approvals")
    try:
        edited = json.loads(form.get("arguments", ""))
    except json.JSONDecodeError as exc:
        return _back(who, back, error=f"the edited arguments are not JSON: {exc.msg} "
                                 f"(line {exc.lineno})")
    if not isinstance(edited, dict):
        return _back(who, back, error="the edited arguments must be a JSON object")
    try:
        run = await ops.get_run(console.client, workflow_id)
        pending = await asyncio.wait_for(run.pending(), timeout=QUERY_TIMEOUT)
    except RunNotFound as exc:
        return _back(who, back, error=f"refused: {exc}")
    except (RPCError, TimeoutError):
        return _back(who, back, error=f"run {workflow_id}: no worker answered")
    waiting = next((a for a in pending if a.call_id == call_id), None)
    if waiting is None:
        return _back(who, back, error=f"call {call_id} is no longer waiting for approval")
    body = (f'<div class="card"><p><b>{h.visible(waiting.tool)}</b> · call '
            f'<code>{h.visible(call_id)}</code> · run {h.run_link(workflow_id)}</p>'
            f'<p>Your edit:</p>{h.diff(waiting.arguments, edited)}'
            f'<form method="post" action="/decide">{h.csrf_field(who.csrf)}'
            f'<input type="hidden" name="run" value="{h.e(workflow_id)}">'
            f'<input type="hidden" name="call_id" value="{h.e(call_id)}">'
            f'<input type="hidden" name="fingerprint" value="{h.e(form.get("fingerprint", ""))}">'
            f'<input type="hidden" name="first_run" value="{h.e(form.get("first_run", ""))}">'
            f'<input type="hidden" name="back" value="{h.e(back)}">'
            '<input type="hidden" name="action" value="approve">'
            f'<input type="hidden" name="arguments" value="{h.e(json.dumps(edited))}">'
            '<button name="confirm">Approve with these arguments</button> '
            f'<a href="{h.e(back)}">cancel</a></form></div>')
    return _page(who, "Review the edit", body, request)


async def decide(request: Request, console: Console, who: auth.SignedIn) -> Response:
    form = request.state.form
    workflow_id, call_id = form.get("run", ""), form.get("call_id", "")
    back = local(form.get("back"), "/approvals")
    action = form.get("action")
    try:
        run = await ops.get_run(console.client, workflow_id)
    except RunNotFound as exc:
        return _back(who, back, error=f"refused: {exc}")
    signer = console.signers.get(who.approver)
    # What the approver was shown: the run refuses the decision if the call changed since.
    shown, first_run = form.get("fingerprint") or None, form.get("first_run") or None
    args: dict[str, Any] | None = None
    if form.get("arguments"):
        try:
            args = json.loads(form["arguments"])
        except json.JSONDecodeError:
            return _back(who, back, error="the edited arguments are not JSON")
        if not isinstance(args, dict):
            return _back(who, back, error="the edited arguments must be a JSON object")
    try:
        if action == "approve":
            deciding = run.approve(call_id, approver=who.approver, args=args, signer=signer,
                                   fingerprint=shown, run=first_run)
        elif action == "reject":
            reason = form.get("reason", "").strip()
            if not reason:
                return _back(who, back, error="a rejection needs a reason (the model reads it)")
            deciding = run.reject(call_id, reason=reason, approver=who.approver,
                                  signer=signer, fingerprint=shown, run=first_run)
        else:
            return _back(who, back, error="unknown action")
        await asyncio.wait_for(deciding, timeout=DECISION_TIMEOUT)
    except (DecisionRefused, InvalidDecision, RunEnded, RunNotFound) as exc:
        return _back(who, back, error=f"refused: {exc}")
    except (TimeoutError, WorkflowUpdateFailedError, RPCError) as exc:
        why = ("no worker took the decision in time; it may still apply: look before "
               "deciding again" if isinstance(exc, TimeoutError)
               else getattr(getattr(exc, "cause", None), "message", None)
               or getattr(exc, "message", "") or type(exc).__name__)
        return _back(who, back, error=f"run {workflow_id}: {why}")
    log.info("console decision", extra={"approver": who.approver, "call_id": call_id,
                                        "decision": action, "signed": signer is not None})
    done = "approved" if action == "approve" else "rejected"
    # Every run may have a call of this id: the note names the run too.
    return _back(who, back, note=f"run {workflow_id} · call {call_id}: {done}"
                 + (" with edited arguments" if args else "")
                 + (f" (signed by {who.approver})" if signer is not None else ""))


# --- sessions ---------------------------------------------------------------------------


async def sessions_page(request: Request, console: Console, who: auth.SignedIn) -> Response:
    rows = []
    async for wf in console.client.list_workflows(f"WorkflowType = '{SESSION_WORKFLOW}'",
                                                  limit=100):
        rows.append(wf)
    lines = "".join(
        f'<tr><td><a href="/sessions/{quote(wf.id, safe="")}">{h.e(wf.id)}</a></td>'
        f'<td>{h.e(wf.status.name.lower() if wf.status else "")}</td>'
        f'<td>{h.e(wf.start_time.isoformat(timespec="seconds"))}</td></tr>' for wf in rows)
    body = ('<table id="sessions"><thead><tr><th>session</th><th>state</th><th>started</th>'
            f'</tr></thead><tbody>{lines}</tbody></table>' if rows
            else '<p>no sessions (start one with `boundloop session start`)</p>')
    return _page(who, "Sessions", body, request)


async def session_snapshot(console: Console, session_id: str) -> dict[str, Any]:
    """A session's turns as a chat: each turn's message and answer, the running turn's
    waiting calls."""
    session = await ops.get_session(console.client, session_id)
    st: SessionStatus = await asyncio.wait_for(session.show(), timeout=QUERY_TIMEOUT)
    turns = []
    # The latest turns only: each is read from its own run (a long session stays quick).
    for n in range(max(1, st.turns - SESSION_TURNS_SHOWN + 1), st.turns + 1):
        turn = session.turn(n)
        snap: dict[str, Any] = {"turn": n, "workflow_id": turn.id}
        with contextlib.suppress(Exception):
            snap.update(await snapshot(console.client, turn.id))
        turns.append(snap)
    return {"session": st.model_dump(mode="json"), "turns": turns}


SESSION_SCRIPT = "session.js"  # reloads the chat as its turns change


async def session_page(request: Request, console: Console, who: auth.SignedIn) -> Response:
    session_id = request.path_params["session_id"]
    try:
        s = await session_snapshot(console, session_id)
    except (RPCError, TimeoutError, RunNotFound):
        return _page(who, "Session", f"<p class=\"error\">session {h.e(session_id)} not found "
                     "or no worker answered</p>", request)
    back = f"/sessions/{quote(session_id, safe='')}"
    chat = []
    for t in s["turns"]:
        chat.append(f'<div class="msg-user">{h.prose(t.get("question"))}</div>')
        for a in t.get("pending", []):
            chat.append(approval_card(t["workflow_id"], Approval.model_validate(a), who.csrf,
                                      back, t.get("run", "")))
        if t.get("closed"):
            chat.append(f'<div class="msg-bot">{h.e(t.get("text") or "")}</div>'
                        f'<p>{h.state_badge(t.get("status", ""), t.get("reason"))} '
                        f'{h.run_link(t["workflow_id"])}</p>')
        else:  # the running turn: its answer streams in (SESSION_SCRIPT)
            chat.append(f'<div class="msg-bot" id="live-answer" '
                        f'data-turn="{h.e(t["workflow_id"])}">…</div>'
                        f'<p>{h.state_badge(t.get("status", "running"))} '
                        f'{h.run_link(t["workflow_id"])}</p>')
    st = s["session"]
    say = ("" if st["status"] == "ended" else
           f'<form method="post" action="/sessions/say" class="card">{h.csrf_field(who.csrf)}'
           f'<input type="hidden" name="session" value="{h.e(session_id)}">'
           '<input name="message" size="80" placeholder="your message" required> '
           '<button name="say">Say</button></form>')
    body = (f'<p id="session-state">{h.e(st["status"])} · {st["turns"]} turn(s) · '
            f'{st["total_tokens"]} tokens · a message during a turn: '
            f'{h.e(st["limits"]["busy"])}'
            + (f' · {st["waiting"]} waiting' if st["waiting"] else "")
            + (f' · ended: {h.e(st["ended"])}' if st["ended"] else "") + '</p>'
            + f'<div id="chat">{"".join(chat)}</div>{say}')

    sig = "|".join(f'{t["workflow_id"]}:{str(t.get("closed", False)).lower()}:'
                   f'{len(t.get("pending", []))}' for t in s["turns"]) + f'|{st["status"]}'
    return _page(who, f"Session {session_id}", body, request, script=SESSION_SCRIPT,
                 body_attrs={"session": session_id, "sig": sig,
                             "live": "1" if st["status"] == "running" else "0"})


async def session_api(request: Request, console: Console, who: auth.SignedIn) -> Response:
    try:
        return JSONResponse(await session_snapshot(console, request.path_params["session_id"]))
    except (RPCError, TimeoutError, RunNotFound):
        return JSONResponse({"error": "not found or no worker answered"}, 404)


async def say(request: Request, console: Console, who: auth.SignedIn) -> Response:
    form = request.state.form
    session_id, message = form.get("session", ""), form.get("message", "").strip()
    back = f"/sessions/{quote(session_id, safe='')}"
    if not message:
        return _back(who, back, error="the message is empty")
    try:
        session = await ops.get_session(console.client, session_id)
        outcome = await asyncio.wait_for(session.send(message), timeout=DECISION_TIMEOUT)
    except (SessionRefused, RunEnded, RunNotFound) as exc:
        return _back(who, back, error=f"refused: {exc}")
    except (TimeoutError, RPCError):
        return _back(who, back, error="no worker took the message in time")
    return _back(who, back, note=outcome)


# --- the application ------------------------------------------------------------------


def app(console: Console) -> Starlette:
    def g(handler: Handler, **kw: bool) -> Callable[[Request], Awaitable[Response]]:
        return guarded(console, handler, **kw)

    routes = [
        Route("/static/{name}", static_file, methods=["GET"]),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login(console), methods=["POST"]),
        Route("/logout", g(logout), methods=["POST"]),
        Route("/", g(runs_page), methods=["GET"]),
        Route("/runs/{workflow_id:path}", g(run_page), methods=["GET"]),
        Route("/api/runs/{workflow_id:path}", g(run_api, json_api=True), methods=["GET"]),
        Route("/api/stream/runs/{workflow_id:path}", g(run_stream, json_api=True),
              methods=["GET"]),
        Route("/approvals", g(approvals_page), methods=["GET"]),
        Route("/approvals/edit", g(edit_review), methods=["POST"]),
        Route("/decide", g(decide), methods=["POST"]),
        Route("/sessions", g(sessions_page), methods=["GET"]),
        Route("/sessions/say", g(say), methods=["POST"]),
        Route("/sessions/{session_id:path}", g(session_page), methods=["GET"]),
        Route("/api/sessions/{session_id:path}", g(session_api, json_api=True),
              methods=["GET"]),
    ]
    return Starlette(routes=routes, middleware=[Middleware(FramesRefused)])


async def static_file(request: Request) -> Response:
    """The style sheet and the scripts (no sign-in: the sign-in page uses the sheet)."""
    from boundloop.console.static import FILES

    found = FILES.get(request.path_params["name"])
    if found is None:
        return Response("not found", 404, media_type="text/plain")
    return Response(found[0], media_type=found[1],
                    headers={"Cache-Control": "no-cache"})


#: What a console page may load and do: its own scripts, style sheet and API (the live
#: stream included), forms posted to itself, and nothing inline, framed or elsewhere.
#: A value that ever reached a page unescaped could still run no script.
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; "
                           "img-src 'self'; connect-src 'self'; form-action 'self'; "
                           "base-uri 'none'; frame-ancestors 'none'")


class FramesRefused:
    """Every response: the Content-Security-Policy; no page of the console inside
    another site's frame (a decision button under a decoy is clickjacking); no referrer
    to elsewhere (URLs hold run ids); no content-type sniffing. Plain ASGI, so the live
    stream is not buffered."""

    HEADERS = ((b"x-frame-options", b"DENY"),
               (b"content-security-policy", CONTENT_SECURITY_POLICY.encode("ascii")),
               (b"referrer-policy", b"same-origin"),
               (b"x-content-type-options", b"nosniff"))

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)
