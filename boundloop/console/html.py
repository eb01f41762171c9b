"""The console's pages: server-rendered HTML, every value escaped, a little vanilla JS.

No template engine: the pages are few and small, and `html.escape` on every value
(through `e`) is the whole of the escaping rule. Text from a run (arguments, ids, tool
names) also goes through `visible`: a bidi override or zero-width character in it is
shown as its escape, highlighted, never applied.

The style sheet and the scripts are files of their own (`/static/…`), so the
Content-Security-Policy allows no inline script or style at all.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import quote

from boundloop.visible import escape_of, escaped, has_invisible, invisible, json_text

STYLE = """
body{font-family:system-ui,sans-serif;margin:0;color:#1b1f24;background:#f6f7f9}
header{background:#1b2a41;color:#fff;padding:.6rem 1.2rem;display:flex;gap:1.2rem;
 align-items:center}
header a{color:#cfe0ff;text-decoration:none}header .who{margin-left:auto}
main{padding:1rem 1.4rem;max-width:1250px}
table{border-collapse:collapse;width:100%;background:#fff}
th,td{border-bottom:1px solid #e2e5ea;padding:.35rem .5rem;text-align:left;
 vertical-align:top;font-size:.92rem}
.badge{display:inline-block;padding:.05rem .45rem;border-radius:.6rem;font-size:.8rem;
 font-weight:600}
.state-completed{background:#d7f5de;color:#145a26}
.state-stopped{background:#fde2e0;color:#8a1c12}
.state-running{background:#dde9ff;color:#173e8a}
.state-waiting_approval{background:#fff1c7;color:#7a5200}
.state-other{background:#e6e6e6;color:#333}
tr.stopped td{background:#fff8f7}tr.completed td{background:#f6fff8}
pre{background:#f1f3f6;padding:.5rem;white-space:pre-wrap;word-break:break-word;margin:.2rem 0}
.card{background:#fff;border:1px solid #e2e5ea;border-radius:.4rem;padding:.8rem 1rem;
 margin:.8rem 0}
.note{background:#eef6ff;border:1px solid #b8d4ff;padding:.5rem .8rem;border-radius:.3rem}
.error{background:#fff0f0;border:1px solid #f2b8b5;padding:.5rem .8rem;border-radius:.3rem}
.answer{white-space:pre-wrap;background:#fff;border-left:4px solid #1b2a41;padding:.5rem .8rem}
.meter{display:inline-block;width:120px;height:.6rem;background:#e2e5ea;border-radius:.3rem;
 vertical-align:middle}.meter span{display:block;height:100%;background:#3b6fd8;
 border-radius:.3rem}
form.inline{display:inline}
textarea{width:100%;font-family:monospace}
.diff .add{background:#dcfce4}.diff .del{background:#fde4e4}
.msg-user{background:#e8f0ff;border-radius:.4rem;padding:.4rem .7rem;margin:.4rem 0}
.msg-bot{background:#fff;border:1px solid #e2e5ea;border-radius:.4rem;padding:.4rem .7rem;
 margin:.4rem 0;white-space:pre-wrap}
.invisible{background:#ffd43b;color:#7a0000;font-weight:700;border-radius:.2rem;
 padding:0 .1rem}
.invisible-note{background:#fff4cc;border:1px solid #e0b400;padding:.3rem .6rem;
 border-radius:.3rem;font-weight:600}
""" + "".join(f".meter span.w{n}{{width:{n}%}}" for n in range(101))  # no inline style


def e(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def page(title: str, body: str, *, approver: str | None = None, csrf: str | None = None,
         note: str | None = None, error: str | None = None, script: str = "",
         body_attrs: dict[str, str] | None = None) -> str:
    """A page; `script`: the name of a script under /static/ (run.js, session.js)."""
    nav = ""
    if approver is not None:
        nav = (f'<a href="/">Runs</a><a href="/approvals">Approvals</a>'
               f'<a href="/sessions">Sessions</a>'
               f'<span class="who">signed in as <b id="approver">{e(approver)}</b> '
               f'<form class="inline" method="post" action="/logout">{csrf_field(csrf)}'
               f'<button>Sign out</button></form></span>')
    flash = (f'<p class="note" id="note">{visible(note)}</p>' if note else "") + (
        f'<p class="error" id="error">{visible(error)}</p>' if error else "")
    attrs = "".join(f' data-{k}="{e(v)}"' for k, v in (body_attrs or {}).items())
    tag = f'<script src="/static/{e(script)}"></script>' if script else ""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<title>{e(escaped(title))} · boundloop console</title>'
            f'<link rel="stylesheet" href="/static/console.css"></head>'
            f'<body{attrs}><header><b>boundloop console</b>{nav}</header>'
            f'<main><h1>{visible(title)}</h1>{flash}{body}</main>{tag}</body></html>')


def visible(value: object, keep: str = "") -> str:
    """`value` escaped, each invisible character (boundloop/visible.py) but those in
    `keep` (line breaks in a question) shown as its escape in a highlighted span."""
    text = "" if value is None else str(value)
    if not any(ch not in keep and invisible(ch) for ch in text):
        return e(text)
    return "".join(_marked(escape_of(ch), ord(ch)) if ch not in keep and invisible(ch)
                   else e(ch) for ch in text)


def prose(value: object) -> str:
    """`visible`, keeping line breaks and tabs (a question has lines)."""
    return visible(value, keep="\n\t")


def _marked(escape_text: str, code: int) -> str:
    return (f'<span class="invisible" title="invisible character U+{code:04X}">'
            f'{e(escape_text)}</span>')


#: A JSON escape (`\\u202e`), or an escaped backslash (so `\\\\u…` is no escape).
_JSON_ESCAPE = re.compile(r"\\\\|\\u([0-9a-f]{4})")


def marked_json(text: str) -> str:
    """JSON text (from `pretty`) escaped for HTML, its escapes of invisible characters
    highlighted."""

    def mark(m: re.Match[str]) -> str:
        code = m.group(1)
        if code is None or not invisible(chr(int(code, 16))):
            return m.group(0)
        return _marked(m.group(0), int(code, 16))

    return _JSON_ESCAPE.sub(mark, e(text))


def arguments_view(arguments: dict[str, Any]) -> str:
    """A call's arguments in full, pretty-printed, and a note when they hold invisible
    characters (shown as highlighted escapes)."""
    note = ('<p class="invisible-note">contains invisible/control characters: shown '
            'as escapes such as \\u202e, highlighted</p>' if has_invisible(arguments)
            else "")
    return f'{note}<pre class="arguments">{marked_json(pretty(arguments))}</pre>'


def csrf_field(token: str | None) -> str:
    return f'<input type="hidden" name="csrf" value="{e(token)}">' if token else ""


def state_badge(status: str, reason: str | None = None) -> str:
    known = {"completed", "stopped", "running", "waiting_approval"}
    cls = f"state-{status}" if status in known else "state-other"
    label = status.replace("_", " ") + (f" · {reason}" if reason and status != "completed"
                                        else "")
    return f'<span class="badge {cls}">{e(label)}</span>'


def when(iso: str) -> str:
    """An ISO 8601 time to the second (a run records microseconds)."""
    try:
        return datetime.fromisoformat(iso).isoformat(timespec="seconds")
    except ValueError:
        return iso


def run_link(workflow_id: str) -> str:
    return f'<a href="/runs/{quote(workflow_id, safe="")}">{visible(workflow_id)}</a>'


def tree_path(root: str, names: Iterable[str]) -> str:
    """A place in an agent tree as people read it, the root run a link:
    `ROOT → research → create_ticket`."""
    return " → ".join([run_link(root), *(visible(n) for n in names)])


def options(values: Iterable[str], chosen: str | None) -> str:
    return '<option value="">any</option>' + "".join(
        f'<option value="{e(v)}"{" selected" if v == chosen else ""}>{e(v)}</option>'
        for v in values)


def meter(used: float, cap: float | None, text: str) -> str:
    if not cap:
        return e(text)
    width = max(0.0, min(100.0, 100.0 * used / cap))
    return f'<span class="meter"><span class="w{width:.0f}"></span></span> {e(text)}'


def pretty(arguments: dict[str, Any]) -> str:
    """Arguments as JSON to read and edit: invisible characters as JSON escapes (the
    same value when parsed)."""
    return json_text(arguments, indent=2, sort_keys=True)


def diff(before: dict[str, Any], after: dict[str, Any]) -> str:
    """The edit as a line diff of the pretty-printed arguments."""
    lines = []
    for line in difflib.unified_diff(pretty(before).splitlines(), pretty(after).splitlines(),
                                     "proposed", "edited", lineterm="", n=20):
        cls = ("add" if line.startswith("+") and not line.startswith("+++")
               else "del" if line.startswith("-") and not line.startswith("---") else "")
        lines.append(f'<span class="{cls}">{marked_json(line)}</span>')
    return '<pre class="diff">' + "\n".join(lines) + "</pre>"
