"""The bench's printed table and docs/benchmarks.md, from the measured numbers."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.harness import REPO
from bench.sessions import increments
from boundloop.devserver import FAST_FLAGS, temporal_binary

TARGETS = {
    "overhead": ("≤", 1.2),
    "history": ("≤", 1.5),
    "throughput": ("≥", 0.8),
    "parked": ("≤", 50.0),
    "rebuilds": ("≤", 0.05),
}
HISTORY_AT = 50


def verdict(name: str, value: float) -> str:
    op, target = TARGETS[name]
    ok = value <= target if op == "≤" else value >= target
    return "PASS" if ok else "MISS"


def _first(path: str, prefix: str) -> str:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _run(args: list[str]) -> str:
    try:
        return subprocess.run(args, capture_output=True, text=True, cwd=REPO,
                              timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine_facts(command: str) -> dict[str, str]:
    mem_kib = _first("/proc/meminfo", "MemTotal").split()[0]
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    return {
        "date (UTC)": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M"),
        "command": f"{command}  (make bench)",
        "git commit": _run(["git", "rev-parse", "--short", "HEAD"]) + (" + local changes"
                                                                        if dirty else ""),
        "CPU": _first("/proc/cpuinfo", "model name"),
        "cores": str(os.cpu_count()),
        "memory": f"{int(mem_kib) / 1024 / 1024:.1f} GiB" if mem_kib.isdigit() else "unknown",
        "OS": f"{platform.system()} {platform.release()}",
        "Python": platform.python_version(),
        "temporalio": metadata.version("temporalio"),
        "openai": metadata.version("openai"),
        "pydantic": metadata.version("pydantic"),
        "dev server": _run([temporal_binary(), "--version"]),
        "dev server flags": " ".join(FAST_FLAGS) + " --headless",
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _kb(n: float) -> str:
    return f"{n / 1000:,.1f} KB"


def _history_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    at = [r for r in rows if r["steps"] == HISTORY_AT]
    return at[0] if at else rows[-1]


def summary(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(measure, result, target, verdict) rows."""
    o, t, p = r["overhead"], r["throughput"], r["parked"]
    h = _history_row(r["history"])
    return [
        ("1. boundloop step / (2 x bare activity)",
         f"{o['ratio_activity']:.2f}x  ({_ms(o['loop_step'])} vs 2 x {_ms(o['bare_step'])})",
         "≤ 1.2x", verdict("overhead", o["ratio_activity"])),
        (f"2. history / conversation bytes, {h['steps']} steps",
         f"{h['ratio']:.2f}x  ({_kb(h['history'])} vs {_kb(h['conversation'])}; "
         f"naive {h['naive_ratio']:.1f}x)",
         "≤ 1.5x", verdict("history", h["ratio"])),
        (f"3. throughput, {t['runs']} runs x {t['steps']} steps, vs bare",
         f"{t['ratio_activities']:.2f}x activities/s  ({t['loop_acts_per_s']:.0f} vs "
         f"{t['bare_acts_per_s']:.0f} a s; {t['loop_steps_per_s']:.1f} steps/s)",
         "≥ 0.8x", verdict("throughput", t["ratio_activities"])),
        (f"4. worker RSS growth, {p['runs']} runs parked",
         f"{p['growth_mb']:.1f} MB  ({p['per_run_kib']:.1f} KiB a run)",
         "≤ 50 MB", verdict("parked", p["growth_mb"])),
        *_scale_summary(r),
    ]


def _scale_row(rows: list[dict[str, Any]], workers: int, shared_only: bool,
               steps: int) -> dict[str, Any]:
    [row] = [x for x in rows if (x["workers"], x["shared_only"], x["steps"])
             == (workers, shared_only, steps)]
    return row


def _scale_summary(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    if "scale" not in r:
        return []
    cfg = r["config"]
    n, steps = cfg["scale_workers"], max(cfg["scale_sizes"])
    out = []
    for key, server in (("scale_no_eager", "eager off"), ("scale", "eager on")):
        if key not in r:
            continue
        own = _scale_row(r[key], n, False, steps)
        shared = _scale_row(r[key], n, True, steps)
        out.append((f"5. model requests rebuilt from history, {n} workers, {steps} steps "
                    f"(server: {server})",
                    f"{own['rebuild_rate']:.1%}  ({own['rebuilds']} of {own['requests']}; "
                    f"{_kb(own['bytes_per_run'])} read a run; shared queue only: "
                    f"{shared['rebuild_rate']:.1%}, {_kb(shared['bytes_per_run'])})",
                    "≤ 5%", verdict("rebuilds", own["rebuild_rate"])))
    return out


def render_table(r: dict[str, Any], facts: dict[str, str]) -> str:
    rows = [("measure", "result", "target", ""), *summary(r)]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    line = "  ".join("-" * w for w in widths)
    out = [f"boundloop bench · {facts['CPU']} · {facts['cores']} cores · Python "
           f"{facts['Python']} · temporalio {facts['temporalio']} · {facts['dev server']}",
           line]
    for i, row in enumerate(rows):
        out.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            out.append(line)
    out.append(line)
    o = r["overhead"]
    out.append(f"per step (median of {o['samples']} steps): bare activity {_ms(o['bare_step'])}"
               f", boundloop step {_ms(o['loop_step'])} = {o['ratio_step']:.2f}x one bare "
               "activity")
    out.append("history:  steps  conversation   boundloop (x)          naive (x)")
    for h in r["history"]:
        out.append(f"          {h['steps']:>5}  {_kb(h['conversation']):>12}   "
                   f"{_kb(h['history']):>11} ({h['ratio']:.2f}x)  "
                   f"{_kb(h['naive_history']):>12} ({h['naive_ratio']:.1f}x)")
    sessions = r.get("sessions")
    if sessions:
        added = increments(sessions, "history")
        out.append(f"session:  {len(sessions)} turns, {_kb(sessions[-1]['history'])} history; "
                   f"each turn added {_kb(min(added[1:]))} to {_kb(max(added[1:]))} "
                   f"(conversation {_kb(sessions[-1]['conversation'])})")
    out.append(f"total {r['total_seconds']:.0f} s")
    return "\n".join(out)


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def render_markdown(r: dict[str, Any], facts: dict[str, str]) -> str:
    o, t, p, cfg = r["overhead"], r["throughput"], r["parked"], r["config"]
    h = _history_row(r["history"])
    lines = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`python -m bench.run`, code in `bench/`); every number",
        "below comes from one run of that command. The bench starts its own Temporal dev",
        "server (SQLite file in a temporary directory, headless, the flags of",
        "`boundloop/devserver.py`), the scripted OpenAI-compatible model server (answers at",
        "once, strict request validation on) in the bench process, and the worker as a",
        "separate process (`build_worker` plus, on its own task queue, the bench's bare and",
        "naive workflows). Times are medians; a ratio compares figures of the same run.",
        "",
        "## Machine",
        "",
    ]
    lines += _md_table(["", ""], [[k, f"`{v}`" if k in ("command", "dev server flags")
                                    else v] for k, v in facts.items()])
    lines += ["", "## Summary", ""]
    lines += _md_table(["measure", "result", "target", "verdict"],
                       [list(row) for row in summary(r)])

    # 1
    bp, lp = o["bare_parts"], o["loop_parts"]
    lines += [
        "",
        "## 1. Per-step overhead",
        "",
        f"`BenchBare` runs {o['steps']} trivial activities in sequence; a boundloop run makes",
        f"{o['steps']} steps that each call `lookup_stock` once, then answers. {o['reps']} runs",
        "of each, alternated. A step's time is the interval between consecutive activity",
        "schedules in the event history (server clock): for bare, one activity round trip;",
        f"for boundloop, model activity + tool activity. Median of {o['samples']} steps each.",
        "",
    ]
    lines += _md_table(["", "bare", "boundloop"], [
        ["one step (history, median)", _ms(o["bare_step"]), _ms(o["loop_step"])],
        ["one step (wall clock per run / steps, median)", _ms(o["bare_wall_step"]),
         _ms(o["loop_wall_step"])],
        ["ratio per step (boundloop / bare)", "", f"{o['ratio_step']:.2f}x"],
        ["ratio per activity (boundloop / 2 x bare)", "", f"**{o['ratio_activity']:.2f}x**"],
    ])
    lines += ["", "Where a step's time goes (medians, server clock):", ""]
    lines += _md_table(["part", "bare activity", "boundloop step"], [
        ["activity queued (scheduled → started)", _ms(bp["queue"]),
         f"model {_ms(lp['model queue'])} + tool {_ms(lp['tool queue'])}"],
        ["activity ran (started → completed)", _ms(bp["run"]),
         f"model {_ms(lp['model run'])} + tool {_ms(lp['tool run'])}"],
        ["workflow task (completed → next scheduled)", _ms(bp["wft"]),
         f"after model {_ms(lp['wft after model'])} + after tool "
         f"{_ms(lp['wft after tool'])}"],
    ])
    lines += [
        "",
        f"`lookup_stock`'s own body (opens the SQLite store, one query) takes "
        f"{_ms(o['tool_body'])}.",
        "",
        "One model request from the bench process to the scripted server through the",
        "SDK's typed path (`responses.create(input=...)`, which walks every item), against",
        "the same JSON body sent as-is (`extra_body`; `activities/model.py` posts its body",
        "as-is the same way), alternated, medians:",
        "",
    ]
    lines += _md_table(["conversation", "openai SDK, typed `input=`",
                        "same body as-is (as the model activity)"],
                       [[f"{k} steps", _ms(v["sdk"]), _ms(v["extra_body"])]
                        for k, v in o["request_probe"].items()])

    # 2
    lines += [
        "",
        "## 2. History bytes vs steps",
        "",
        "Each step calls `fetch_report` (bench tool, `bench/tools.py`), whose envelope is",
        "~4.0 KB; every model turn is a short reasoning item and one function call. History",
        "= sum of `HistoryEvent.ByteSize()` over `fetch_history()` (all runs, if continued",
        "as new). Conversation = compact UTF-8 JSON of the scripted server's last request",
        "`input` plus the final answer's `output`. Naive = `BenchNaive`, the same loop",
        "sending the whole conversation as the model activity's input every step (real",
        "tool activity, same scripted model).",
        "",
    ]
    lines += _md_table(
        ["steps", "conversation", "boundloop history", "history / conversation",
         "naive history", "naive / conversation", "naive / boundloop"],
        [[str(x["steps"]), _kb(x["conversation"]), _kb(x["history"]),
          f"{x['ratio']:.2f}x", _kb(x["naive_history"]), f"{x['naive_ratio']:.1f}x",
          f"{x['naive_history'] / x['history']:.1f}x"] for x in r["history"]])
    keys = sorted(set(h["by_kind"]) | set(h["naive_by_kind"]),
                  key=lambda k: -max(h["by_kind"].get(k, 0), h["naive_by_kind"].get(k, 0)))
    lines += ["", f"Where the bytes are at {h['steps']} steps "
              f"({h['events']} events boundloop, {h['naive_events']} naive):", ""]
    lines += _md_table(["events", "boundloop", "naive"], [
        [k, _kb(h["by_kind"].get(k, 0)), _kb(h["naive_by_kind"].get(k, 0))] for k in keys])

    # 3
    lc, bc = t["loop_cpu"], t["bare_cpu"]
    n_loop = t["runs"] * t["loop_acts"]
    n_bare = t["runs"] * t["bare_acts"]
    lines += [
        "",
        "## 3. Throughput",
        "",
        f"{t['runs']} concurrent `BenchBare` workflows x {t['bare_acts']} activities vs "
        f"{t['runs']} concurrent boundloop runs x {t['steps']} steps",
        f"(each step but the last calls `lookup_stock`: {t['loop_acts']} activities a run), "
        "started together (at most 50 start calls at once) and timed to the last result.",
        f"{t['rounds']} pairs of rounds, the order alternating; the ratio is the median of "
        "the pairs' ratios.",
        "",
    ]
    lines += _md_table(["", "bare", "boundloop"], [
        ["wall time, each round", ", ".join(f"{x:.1f} s" for x in t["bare_all"]),
         ", ".join(f"{x:.1f} s" for x in t["loop_all"])],
        ["wall time, median", f"{t['bare_seconds']:.2f} s", f"{t['loop_seconds']:.2f} s"],
        ["activities/s", f"{t['bare_acts_per_s']:.0f}", f"{t['loop_acts_per_s']:.0f}"],
        ["steps/s (bare: 2 activities a step)", f"{t['bare_steps_per_s']:.1f}",
         f"{t['loop_steps_per_s']:.1f}"],
        ["ratio, activities/s (each pair)", "",
         ", ".join(f"{x:.2f}" for x in t["ratio_all"])],
        ["ratio, activities/s (median)", "", f"**{t['ratio_activities']:.2f}x**"],
        ["ratio, steps/s (median)", "", f"{t['ratio_steps']:.2f}x"],
    ] + [[f"CPU {k}, s (ms an activity)", f"{bc[k]:.2f} ({bc[k] / n_bare * 1000:.2f})",
          f"{lc[k]:.2f} ({lc[k] / n_loop * 1000:.2f})"] for k in lc] + [
        ["CPU used of all cores", f"{t['bare_busy']:.0%}", f"{t['loop_busy']:.0%}"]])

    # 4
    lines += [
        "",
        "## 4. Runs parked on approval",
        "",
        f"A fresh worker process (`build_worker` only). Warm-up: {p['warmup']} runs reach the",
        "approval, are approved and answered. Then `VmRSS` (/proc/PID/status, median of 5",
        f"samples) before, and after {p['runs']} runs each wait on a `create_ticket` approval",
        "(counted through the `BoundloopStatus` search attribute).",
        "",
    ]
    lines += _md_table(["", ""], [
        ["RSS at start", f"{p['rss_start_kib'] / 1024:.1f} MiB"],
        ["RSS before parking (after warm-up)", f"{p['rss_before_kib'] / 1024:.1f} MiB"],
        [f"RSS with {p['runs']} runs waiting", f"{p['rss_after_kib'] / 1024:.1f} MiB"],
        ["growth", f"**{p['growth_mb']:.1f} MB** ({p['per_run_kib']:.1f} KiB a run)"],
        [f"time to park {p['runs']} runs", f"{p['park_seconds']:.1f} s"],
    ])
    d = r.get("parked_diag")
    if d:
        lines += [
            "",
            "Diagnostic (not the target): the same measurement with a worker rebuilt from",
            "`build_worker`'s own config with only `max_cached_workflows="
            f"{d['max_cached_workflows']}` (the SDK's default is 1000):",
            "",
        ]
        lines += _md_table(["", "build_worker (default cache)",
                            f"max_cached_workflows={d['max_cached_workflows']}"], [
            ["RSS before parking", f"{p['rss_before_kib'] / 1024:.1f} MiB",
             f"{d['rss_before_kib'] / 1024:.1f} MiB"],
            [f"RSS with {p['runs']} runs waiting", f"{p['rss_after_kib'] / 1024:.1f} MiB",
             f"{d['rss_after_kib'] / 1024:.1f} MiB"],
            ["growth", f"{p['growth_mb']:.1f} MB", f"{d['growth_mb']:.1f} MB"],
        ])
    sessions = r.get("sessions")
    if sessions:
        added = increments(sessions, "history")
        lines += [
            "",
            f"## 2b. History bytes of a {len(sessions)}-turn session",
            "",
            "`boundloop.start_session`, then one `say` a turn; each turn is a `lookup_stock`",
            "call and an answer (2 steps). History = the session's own runs plus every",
            "turn's runs (`bench/sessions.py`); conversation = the bytes the model reads.",
            "Turns continue the conversation by reference, so each turn adds about the same",
            "history bytes while the conversation grows: history is linear in turns.",
            "",
        ]
        lines += _md_table(["turn", "conversation", "history (total)", "added this turn"],
                           [[str(row["turn"]), _kb(row["conversation"]), _kb(row["history"]),
                             _kb(a)] for row, a in zip(sessions, added, strict=True)])
    lines += _scale_section(r)
    lines += _levers_section(r)
    lines += ["", "## What limits the numbers", ""]
    lines += notes(r)
    secs = ", ".join(f"{k} {v:.0f} s" for k, v in r["timings"].items())
    lines += ["", f"Bench run time: {r['total_seconds']:.0f} s ({secs}). Settings: "
              f"`{cfg}`.", ""]
    return "\n".join(lines)


def notes(r: dict[str, Any]) -> list[str]:
    """What limits each figure, in statements derived from this run's numbers."""
    o, t, p, d = r["overhead"], r["throughput"], r["parked"], r.get("parked_diag")
    h = _history_row(r["history"])
    bk = h["by_kind"]
    lp, bp = o["loop_parts"], o["bare_parts"]
    probe = o["request_probe"]
    sizes = sorted(probe)
    mid, big = sizes[len(sizes) // 2], sizes[-1]
    tool_res = bk.get("tool: result (completed)", 0)
    model_in = bk.get("model: input (scheduled)", 0)
    rest = h["history"] - tool_res - model_in
    n_loop, n_bare = t["runs"] * t["loop_acts"], t["runs"] * t["bare_acts"]
    extra = lp["model run"] - bp["run"]
    worker_core = t["loop_cpu"]["worker"] / t["loop_seconds"]
    per_loop = {k: v / n_loop * 1000 for k, v in t["loop_cpu"].items()}
    per_bare = {k: v / n_bare * 1000 for k, v in t["bare_cpu"].items()}
    total_loop, total_bare = sum(per_loop.values()), sum(per_bare.values())
    load = (
        f"Both cores were {t['bare_busy']:.0%} (bare) and {t['loop_busy']:.0%} (boundloop) "
        f"busy, the worker process (one Python interpreter) {worker_core:.0%} of one core; "
        f"with {t['runs']} runs in flight, throughput follows each run's serial latency, "
        f"which item 1 puts at {o['ratio_activity']:.1f}x bare per activity. CPU per "
        f"activity, all processes together: {total_loop:.1f} ms for boundloop against "
        f"{total_bare:.1f} ms bare (were CPU the only limit, a ratio of "
        f"{total_bare / total_loop:.2f}): the worker {per_loop['worker']:.1f} against "
        f"{per_bare['worker']:.1f} ms (model requests through the SDK, pydantic payloads, "
        f"logging, tool threads), the dev server {per_loop['temporal']:.1f} against "
        f"{per_bare['temporal']:.1f} ms (a boundloop step also writes a search attribute "
        "upsert and larger payloads), the bench process with the scripted model "
        f"{per_loop['driver+model']:.1f} against {per_bare['driver+model']:.1f} ms.")
    out = [
        f"- **1. Per-step overhead ({verdict('overhead', o['ratio_activity'])}).** Of a "
        f"{_ms(o['loop_step'])} step, the model activity runs {_ms(lp['model run'])}, "
        f"{_ms(extra)} more than a bare activity ({_ms(bp['run'])}); one HTTP request to the "
        f"scripted model alone costs {_ms(probe[mid]['extra_body'])} at {mid} steps "
        "(JSON both ways, the SDK's client, the server's thread), and the rest is the "
        "conversation rebuild and response parsing. (Through the SDK's typed "
        f"`responses.create(input=...)` the same request would cost {_ms(probe[mid]['sdk'])}, "
        f"{_ms(probe[big]['sdk'])} at {big} steps: the model activity sends its body as-is.) "
        + (("The tool runs as a local activity inside the workflow task after the model "
            f"activity, which takes {_ms(lp['wft after model'])} with it against bare's "
            f"{_ms(bp['wft'])} (the tool's body {_ms(o['tool_body'])}).")
           if o.get("tool_local") else
           ("The two workflow tasks of a step take "
            f"{_ms(lp['wft after model'])} and {_ms(lp['wft after tool'])} against bare's "
            f"{_ms(bp['wft'])}, and the tool activity {_ms(lp['tool run'])} (its body "
            f"{_ms(o['tool_body'])}).")),
        f"- **2. History bytes ({verdict('history', h['ratio'])}).** Each tool result is "
        f"written once, as the tool's result (a local activity's marker or an activity's "
        f"completion; {_kb(tool_res)} at {h['steps']} "
        "steps); the model requests carry references to them, not copies "
        f"({_kb(model_in)} of model inputs in all); everything else is {_kb(rest)} (search "
        "attribute upserts, workflow tasks, model turns, the RunResult's event log). "
        f"Against {_kb(h['conversation'])} of conversation that is "
        f"{h['ratio']:.2f}x, flat with steps (history grows linearly); the naive "
        f"loop's grows quadratically ({h['naive_ratio']:.1f}x here).",
        f"- **3. Throughput ({verdict('throughput', t['ratio_activities'])}).** {load}",
    ]
    parked = (f"- **4. Parked runs ({verdict('parked', p['growth_mb'])}).** "
              f"{p['per_run_kib']:.0f} KiB of worker RSS per waiting run. ")
    if d:
        parked += (
            "`build_worker` bounds the sticky workflow cache (`max_cached_workflows`, "
            "default 100, `BOUNDLOOP_MAX_CACHED_WORKFLOWS`; the SDK's own default is 1000, "
            "which kept every parked run in memory: 171 MB for 1000 runs before): runs "
            "beyond it are evicted and replayed from their short history when a decision "
            f"arrives. The diagnostic with `max_cached_workflows={d['max_cached_workflows']}` "
            f"grew the worker by {d['growth_mb']:.1f} MB.")
    out.append(parked)
    out += _scale_notes(r)
    out += _levers_notes(r)
    return out


def _effect(ratios: list[float]) -> str:
    """What the rounds say, without claiming more than they agree on."""
    if all(q < 1 for q in ratios):
        return "A faster in every round"
    if all(q > 1 for q in ratios):
        return "A slower in every round"
    return "no measurable effect (the rounds disagree)"


def _levers_notes(r: dict[str, Any]) -> list[str]:
    lv = r.get("levers")
    if not lv:
        return []
    parts = "; ".join(f"{x['lever']}: {x['ratio']:.2f}x, {_effect(x['ratios'])}"
                      for x in lv["levers"])
    pyd = lv["pydantic_us"]
    total_us = sum(pyd.values())
    step = lv["variants"]["default"]["step_ms"]
    return [
        f"- **6. Levers.** Median A / B of step time: {parts}. Fewer pydantic round trips "
        f"in the workflow task: the pydantic work of a step's two workflow tasks is "
        f"{total_us:.0f} µs in all (" + ", ".join(f"{k} {v:.1f} µs" for k, v in pyd.items())
        + f"), {total_us / 10 / step:.1f}% of a {step:.1f} ms step; the one avoidable part, "
        "the size check serialising each input once more before the data converter does, "
        f"is {pyd['size checks (payload_bytes x2)']:.1f} µs: below what this benchmark "
        "can resolve, so it was not changed.",
    ]


def _scale_notes(r: dict[str, Any]) -> list[str]:
    if "scale_no_eager" not in r:
        return []
    cfg = r["config"]
    n, sizes = cfg["scale_workers"], sorted(cfg["scale_sizes"])
    rows = r["scale_no_eager"]
    small, big = (_scale_row(rows, n, True, k) for k in (sizes[0], sizes[-1]))
    own_small, own_big = (_scale_row(rows, n, False, k) for k in (sizes[0], sizes[-1]))
    eager = [_scale_row(r["scale"], n, True, k) for k in sizes]
    growth = big["bytes_per_run"] / small["bytes_per_run"] if small["bytes_per_run"] else 0
    return [
        f"- **5. Several workers.** Without eager activity execution, {n} workers on the "
        f"shared queue rebuilt {big['rebuild_rate']:.0%} of model requests from history "
        f"(a step stays warm only when the model request, its tool and the next model "
        f"request all land on one worker: about 1 in {n * n}), reading "
        f"{_kb(small['bytes_per_run'])} of history a run at {sizes[0]} steps and "
        f"{_kb(big['bytes_per_run'])} at {sizes[-1]} ({growth:.1f}x for "
        f"{sizes[-1] / sizes[0]:.0f}x the steps: quadratic). With a queue of each "
        f"worker's own: {own_small['rebuilds'] + own_big['rebuilds']} rebuilds and "
        f"{_kb(own_small['bytes_per_run'] + own_big['bytes_per_run'])} read in both sizes. "
        "On a server with eager activity execution on (the dev server's default) the "
        "shared queue already kept each run on one worker "
        f"({sum(x['rebuilds'] for x in eager)} rebuilds): the worker that runs a "
        "workflow task starts the activities it schedules on the workflow's own queue, "
        "and workflow tasks stick to one worker; it needs the server option, a free "
        "activity slot at that moment, and the run to stay in that worker's workflow "
        "cache. Activities sent to a worker's own queue are never eager, so they are "
        "polled (the 'queued' columns).",
    ]


def _scale_section(r: dict[str, Any]) -> list[str]:
    if "scale" not in r:
        return []
    cfg = r["config"]
    n = cfg["scale_workers"]
    lines = [
        "",
        "## 5. Several workers",
        "",
        f"{cfg['scale_runs']} concurrent runs on fresh worker processes (`build_worker`), "
        "each step reading a ~4 KB report (`fetch_report`), every run ending at `max_steps`. "
        "Counted by the workers' conversation caches (`ConversationCache.rebuilds`, "
        "`.history_bytes`, written by each worker at shutdown): model requests whose "
        "conversation was read from the event history, and the history bytes those reads "
        "fetched. Three set-ups: one worker; "
        f"{n} workers on the shared task queue only (`own_task_queue=False`, as before); {n} "
        "workers each also polling a task queue of its own, the run's steps following the "
        "worker that holds its conversation (the default). On two dev servers: this one "
        "(eager activity execution on, its default) and one started with "
        "`system.enableActivityEagerExecution=false`. Step times are medians from the "
        "histories (server clock), one round each: indicative, not paired.",
        "",
    ]
    header = ["server", "steps", "set-up", "model requests", "rebuilt from history",
              "history bytes read a run", "step", "model queued", "tool queued"]
    rows = []
    for key, server in (("scale", "eager on"), ("scale_no_eager", "eager off")):
        for x in r.get(key, []):
            setup = ("1 worker" if x["workers"] == 1 else
                     f"{x['workers']} workers, shared queue only" if x["shared_only"] else
                     f"{x['workers']} workers, own queues")
            pm = x["parts_ms"]
            rows.append([server, str(x["steps"]), setup, str(x["requests"]),
                         f"{x['rebuilds']} ({x['rebuild_rate']:.1%})",
                         _kb(x["bytes_per_run"]), f"{pm['step']:.1f} ms",
                         f"{pm['model queue']:.1f} ms", f"{pm['tool queue']:.1f} ms"])
    lines += _md_table(header, rows)
    return lines


def _levers_section(r: dict[str, Any]) -> list[str]:
    lv = r.get("levers")
    if not lv:
        return []
    lines = [
        "",
        "## 6. Performance levers",
        "",
        f"The per-step benchmark of item 1 ({lv['steps']} steps calling `lookup_stock`, "
        f"then the answer), {lv['rounds']} rounds; each round runs every variant once, the "
        "order rotating; each variant on a worker process of its own. A lever's ratio is "
        "the median of the rounds' ratios of median step time (history, server clock), "
        "A / B: below 1, A is faster. Eager activity execution is the SDK's default "
        "(`Worker(disable_eager_activity_execution=False)`, up to 3 reservations a "
        "workflow task) and needs the server's `system.enableActivityEagerExecution`, on "
        "in this dev server; it applies only to activities on the workflow's own task "
        "queue, so the lever is measured on workers without their own queue "
        "(`own_task_queue=False`), and the own queue's price is measured against it.",
        "",
    ]
    lines += _md_table(["variant", "step (median)", "step, each round", "model queued",
                        "tool queued", "tool ran", "wall / step"], [
        [name, f"{v['step_ms']:.1f} ms", ", ".join(f"{x:.1f}" for x in v["each_step_ms"]),
         f"{v['model queue_ms']:.1f} ms", f"{v['tool queue_ms']:.1f} ms",
         f"{v['tool run_ms']:.1f} ms", f"{v['wall_step_ms']:.1f} ms"]
        for name, v in lv["variants"].items()])
    lines += [""]
    lines += _md_table(["lever", "A", "B", "A / B each round", "A / B median"], [
        [x["lever"], x["a"], x["b"], ", ".join(f"{q:.2f}" for q in x["ratios"]),
         f"**{x['ratio']:.2f}**"] for x in lv["levers"]])
    return lines
