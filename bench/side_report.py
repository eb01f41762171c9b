"""The side-by-side phase's figures, targets and markdown block (`make bench-peers`).

The block lives in docs/benchmarks.md between BEGIN and END, after the line that
`make bench` keeps from: `make bench` leaves it alone, `make bench-peers` rewrites it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

BEGIN = "<!-- side by side: written by make bench-peers -->"
END = "<!-- /side by side -->"
PEER_NAMES = {"openai-agents": "Temporal's OpenAI Agents integration",
              "pydantic-ai": "pydantic-ai's Temporal integration"}
LABELS = {"bare": "bare Temporal (2 activities a step)", "boundloop": "boundloop",
          "openai-agents": "OpenAI Agents (Temporal)", "pydantic-ai": "pydantic-ai (Temporal)",
          "boundloop_same_cache": "boundloop, cache of 1,000 workflows"}
#: ≤ this much worker memory a parked run.
PARKED_KIB = 64.0


def _peers(side: Mapping[str, Any]) -> list[str]:
    """The peers whose throughput rounds all finished."""
    return [n for n, row in side["throughput"]["systems"].items()
            if n in PEER_NAMES and "failed" not in row]


def figures(side: Mapping[str, Any]) -> dict[str, float]:
    """The headline ratios and values of one side-by-side run."""
    tp, st = side["throughput"]["systems"], side["per_step"]["systems"]
    peers = _peers(side)
    fast_tp = max(peers, key=lambda n: tp[n]["steps_per_s"])
    fast_step = min(peers, key=lambda n: st[n]["step"])
    cpu = {n: tp[n]["cpu_per_step"]["temporal"] for n in tp if "failed" not in tp[n]}
    fast_cpu = min(peers, key=lambda n: cpu[n])
    out = {
        "throughput / bare": tp["boundloop"]["steps_per_s"] / tp["bare"]["steps_per_s"],
        "throughput / faster peer": (tp["boundloop"]["steps_per_s"]
                                     / tp[fast_tp]["steps_per_s"]),
        "step / bare step (2 activities)": st["boundloop"]["step"] / st["bare"]["step"],
        "step / faster peer": st["boundloop"]["step"] / st[fast_step]["step"],
        "server CPU a step / faster peer": cpu["boundloop"] / cpu[fast_cpu],
        "server CPU a step / bare": cpu["boundloop"] / cpu["bare"],
        "history bytes a step": st["boundloop"]["bytes_per_step"],
        "history events a step": st["boundloop"]["events_per_step"],
    }
    parked = side.get("parked", {})
    if "per_run_kib" in parked.get("boundloop", {}):
        out["worker RSS a parked run (KiB)"] = parked["boundloop"]["per_run_kib"]
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def targets(side: Mapping[str, Any], previous: Mapping[str, Any] | None) -> list[list[str]]:
    """(target, measured, verdict) rows; `previous`: the last committed side-by-side run."""
    f = figures(side)
    tp, st = side["throughput"]["systems"], side["per_step"]["systems"]
    peers = _peers(side)
    fast_tp = max(peers, key=lambda n: tp[n]["steps_per_s"])
    fast_cpu = min(peers, key=lambda n: tp[n]["cpu_per_step"]["temporal"])
    rows = [
        ["throughput ≥ 0.8x bare Temporal",
         f"{f['throughput / bare']:.2f}x ({tp['boundloop']['steps_per_s']:.1f} vs "
         f"{tp['bare']['steps_per_s']:.1f} steps/s)", _verdict(f["throughput / bare"] >= 0.8)],
        ["throughput ≥ 1.5x the faster peer",
         f"{f['throughput / faster peer']:.2f}x (vs {LABELS[fast_tp]}, "
         f"{tp[fast_tp]['steps_per_s']:.1f} steps/s)",
         _verdict(f["throughput / faster peer"] >= 1.5)],
        ["one step ≤ 1.3x two bare activities",
         f"{f['step / bare step (2 activities)']:.2f}x ({_ms(st['boundloop']['step'])} vs "
         f"{_ms(st['bare']['step'])})", _verdict(f["step / bare step (2 activities)"] <= 1.3)],
        ["Temporal server CPU a step ≤ the faster peer's",
         f"{f['server CPU a step / faster peer']:.2f}x "
         f"({1000 * tp['boundloop']['cpu_per_step']['temporal']:.1f} vs "
         f"{1000 * tp[fast_cpu]['cpu_per_step']['temporal']:.1f} ms, {LABELS[fast_cpu]})",
         _verdict(f["server CPU a step / faster peer"] <= 1.0)],
    ]
    if "worker RSS a parked run (KiB)" in f:
        kib = f["worker RSS a parked run (KiB)"]
        rows.append([f"≤ {PARKED_KIB:.0f} KiB of worker memory a parked run",
                     f"{kib:.1f} KiB ({side['parked']['boundloop']['runs']:,} parked, a "
                     "cache of 100)", _verdict(kib <= PARKED_KIB)])
    same = side.get("parked", {}).get("boundloop_same_cache", {})
    if "per_run_kib" in same:
        rows.append([f"≤ {PARKED_KIB:.0f} KiB a parked run, every run cached",
                     f"{same['per_run_kib']:.1f} KiB ({same['runs']:,} parked, a cache of "
                     "1,000)", _verdict(same["per_run_kib"] <= PARKED_KIB)])
    bytes_now = f["history bytes a step"]
    if previous is not None:
        before = figures(previous)["history bytes a step"]
        rows.append(["history a step no larger than before",
                     f"{bytes_now:,.0f} bytes, {f['history events a step']:.2f} events "
                     f"(previous run {before:,.0f} bytes)", _verdict(bytes_now <= before * 1.01)])
    else:
        rows.append(["history a step no larger than before",
                     f"{bytes_now:,.0f} bytes, {f['history events a step']:.2f} events",
                     "first run: the baseline"])
    return rows


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(r) + " |" for r in rows])


def render(side: Mapping[str, Any], previous: Mapping[str, Any] | None = None) -> str:
    """The markdown block, BEGIN to END."""
    tp, st, parked = (side["throughput"]["systems"], side["per_step"]["systems"],
                      side.get("parked", {}))
    facts = side.get("facts", {})
    cfg = side["config"]
    names = list(tp)
    lines = [BEGIN, "", "## Side by side with the peers", "",
             "Generated by `make bench-peers` (`python -m bench.run --peers`, code in "
             "`bench/side.py`, the peers' agents in `bench/peers/`, which run in a venv of "
             "their own, `.venv-peers`). One dev server, one scripted model server (answers "
             "at once, strict request validation on; every request of every system passed "
             "it), one run: bare Temporal, boundloop and "
             + " and ".join(f"{PEER_NAMES[n]} ({LABELS[n]})" for n in _peers(side))
             + ". Every system's step is one model request and one tool call returning the "
             "same ~4 KB report (`bench/peers/report.py`); each peer's tool is a Temporal "
             "activity, as its documentation says to make a tool that does I/O, and each "
             "peer worker runs with its plugin and the SDK's worker defaults. Times are "
             "medians; ratios compare figures of this run.", ""]
    if facts:
        lines += [f"Run: {facts.get('date (UTC)', '?')} UTC, commit {facts.get('git commit', '?')}"
                  f", {facts.get('cores', '?')} cores; load average (1 min) "
                  f"{side['load_start'][0]:.1f} at the start, {side['load_end'][0]:.1f} at "
                  f"the end (other work shared the machine: read the ratios). Peers: "
                  + ", ".join(f"{k} {v}" for k, v in facts.get("peers", {}).items()) + ".", ""]
    lines += ["### Targets", ""]
    lines += _table(["target", "measured", "verdict"], targets(side, previous))
    lines += ["", "### Figures", "",
              f"Throughput: {cfg['side_runs']} concurrent runs of {cfg['side_steps']} model "
              f"requests, {cfg['side_rounds']} rounds (each system once a round, the order "
              "rotating). boundloop stops at `max_steps` without running the last call "
              f"({cfg['side_steps'] - 1} tool calls a run), the peers at their turn or request "
              f"limit after running it ({cfg['side_steps']}); bare runs {cfg['side_steps']} "
              "pairs of activities. A step in steps/s is one model request and one tool call. "
              "CPU is each process's user+system time over the round, divided by the steps "
              "(boundloop and bare share the bench worker process, in different rounds). "
              f"One step: {cfg['side_reps']} runs of each system of {cfg['side_step_steps']} "
              "tool calls, then the answer; a step is the interval between consecutive "
              "model-activity schedules in the history (server clock); history bytes "
              "(`HistoryEvent.ByteSize()` summed) and events of those runs, a step's share.",
              ""]
    rows = []
    for n in names:
        t, s = tp[n], st[n]
        if "failed" in t:
            rows.append([LABELS[n], f"did not finish: {t['failed']}", "", _ms(s["step"]),
                         _ms(s["wall_step"]), "", "", "",
                         f"{s['bytes_per_step'] / 1000:,.1f} KB", f"{s['events_per_step']:.2f}",
                         (f"{parked[n]['per_run_kib']:.1f} KiB"
                          if "per_run_kib" in parked.get(n, {}) else "—")])
            continue
        rows.append([
            LABELS[n], f"{t['steps_per_s']:.1f}",
            f"{t['steps_per_s'] / tp['bare']['steps_per_s']:.2f}x",
            _ms(s["step"]), _ms(s["wall_step"]),
            f"{1000 * t['cpu_per_step']['temporal']:.1f} ms",
            f"{t['cpu_per_run']['temporal']:.2f} s",
            f"{1000 * t['cpu_per_step']['worker']:.1f} ms",
            f"{s['bytes_per_step'] / 1000:,.1f} KB", f"{s['events_per_step']:.2f}",
            (f"{parked[n]['per_run_kib']:.1f} KiB" if "per_run_kib" in parked.get(n, {})
             else "—"),
        ])
    lines += _table(["system", "steps/s", "vs bare", "one step (history)", "wall / step",
                     "server CPU a step", "server CPU a run", "worker CPU a step",
                     "history a step", "events a step", "RSS a parked run"], rows)
    rounds = {n: ", ".join(f"{x:.1f}" for x in tp[n]["seconds_all"]) for n in names}
    lines += ["", "Throughput wall time of each round (s): "
              + "; ".join(f"{LABELS[n]} {rounds[n]}" for n in names) + ".", ""]
    if "per_run_kib" in parked.get("boundloop", {}):
        p0 = parked["boundloop"]
        lines += [f"Parked: a fresh worker process for each system; {p0['warmup']} runs reach "
                  "the approval, are approved and answered (warm-up); then `VmRSS` before and "
                  f"after {p0['runs']:,} runs wait on a `create_ticket` approval (each peer's "
                  "own: the Agents SDK's `needs_approval` with the run resumed from its "
                  "`RunState`, pydantic-ai's `requires_approval` with `DeferredToolRequests`; "
                  "each peer's workflow marks itself waiting in the `BoundloopStatus` search "
                  "attribute so that the bench can count it). boundloop's worker is "
                  "`build_worker`'s (a sticky cache of 100 workflows: the runs beyond it are "
                  "evicted and rebuilt from history when approved), and again with the peers' "
                  "cache size, the SDK's default (1,000: every parked run cached).", ""]
        lines += _table(["system", "RSS before", "RSS with the runs parked", "a run",
                         "time to park", "model requests retried"],
                        [[LABELS[n], f"{p['rss_before_kib'] / 1024:.1f} MiB",
                          f"{p['rss_after_kib'] / 1024:.1f} MiB", f"{p['per_run_kib']:.1f} KiB",
                          f"{p['park_seconds']:.1f} s", str(p.get("retried_requests", "—"))]
                         if "failed" not in p
                         else [LABELS[n], f"did not park: {p['failed']}", "", "", "", ""]
                         for n, p in parked.items()])
        lines.append("")
    lines += ["Activity types a run schedules: "
              + "; ".join(f"{LABELS[n]}: " + ", ".join(f"`{a}`" for a in st[n]["activity_types"])
                          for n in names) + ".", "", END]
    return "\n".join(lines) + "\n"


def place(doc: str, block: str, kept: str) -> str:
    """`doc` with its side-by-side block replaced by `block` (new: right after `kept`)."""
    if BEGIN in doc and END in doc:
        start, end = doc.index(BEGIN), doc.index(END) + len(END)
        return doc[:start] + block.rstrip("\n") + doc[end:]
    if kept in doc:
        at = doc.index(kept) + len(kept)
        return doc[:at] + "\n\n" + block + doc[at:]
    return doc + "\n" + kept + "\n\n" + block
