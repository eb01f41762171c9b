"""Each headline figure of a bench run against the previous committed results.

`make bench` saves its numbers to `bench/results.json` (committed with the report), and
before it does, prints which figures got worse than the saved ones by more than
TOLERANCE. A figure is compared only when both runs have it; ratios taken inside one
run are the figures to trust on a shared machine, the absolute times move with its load
(and with the host: bare Temporal's own figures, measured in the same runs, say when the
machine itself moved, and a HOST line says so).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

#: Where `make bench` keeps the results of its last committed run.
PREVIOUS = Path(__file__).resolve().parent / "results.json"
#: Changes smaller than this (relative) are noise on a shared machine.
TOLERANCE = 0.10

Figure = Callable[[Mapping[str, Any]], float]


def _at(*path: str) -> Figure:
    def get(results: Mapping[str, Any]) -> float:
        value: Any = results
        for key in path:
            value = value[key]
        return float(value)
    return get


def _ms(figure: Figure) -> Figure:
    return lambda results: figure(results) * 1000.0


def _per_run(kind: str, process: str) -> Figure:
    def get(results: Mapping[str, Any]) -> float:
        t = results["throughput"]
        return float(t[f"{kind}_cpu"][process]) / float(t["runs"])
    return get


def _per_bare_run(process: str) -> Figure:
    """boundloop's CPU a run against bare Temporal's, in the same throughput phase."""
    return lambda results: _per_run("loop", process)(results) / _per_run("bare", process)(
        results)


def _history_per_step(results: Mapping[str, Any]) -> float:
    last = max(results["history"], key=lambda row: row["steps"])
    return float(last["history"]) / float(last["steps"])


#: name, unit, whether higher is better, how to read it from the results.
FIGURES: list[tuple[str, str, bool, Figure]] = [
    ("one step (server clock)", "ms", False, _ms(_at("overhead", "loop_step"))),
    ("step / 2 bare activities", "x", False, _at("overhead", "ratio_activity")),
    ("throughput", "steps/s", True, _at("throughput", "loop_steps_per_s")),
    ("throughput / bare (activities)", "x", True, _at("throughput", "ratio_activities")),
    ("Temporal server CPU a run", "s", False, _per_run("loop", "temporal")),
    ("worker CPU a run", "s", False, _per_run("loop", "worker")),
    ("Temporal server CPU a run / bare's", "x", False, _per_bare_run("temporal")),
    ("worker CPU a run / bare's", "x", False, _per_bare_run("worker")),
    ("history a step (largest run)", "bytes", False, _history_per_step),
    ("worker RSS a parked run", "KiB", False, _at("parked", "per_run_kib")),
]


#: Bare Temporal's own figures: the same workflow code in every run, so a change in them
#: is the machine's (its load, its host), which moves boundloop's absolute figures too.
HOST_FIGURES: list[tuple[str, str, bool, Figure]] = [
    ("bare Temporal's own step", "ms", False, _ms(_at("overhead", "bare_step"))),
    ("bare Temporal's throughput", "steps/s", True, _at("throughput", "bare_steps_per_s")),
]


#: The side-by-side phase's figures (`make bench-peers`, results["peers"]): whether
#: higher is better. Ratios against bare Temporal and the peers of the same run.
SIDE_FIGURES: dict[str, bool] = {
    "throughput / bare": True, "throughput / faster peer": True,
    "step / bare step (2 activities)": False, "step / faster peer": False,
    "server CPU a step / faster peer": False, "server CPU a step / bare": False,
    "history bytes a step": False, "history events a step": False,
    "worker RSS a parked run (KiB)": False,
}


def _read(results: Mapping[str, Any], table: list[tuple[str, str, bool, Figure]],
          ) -> dict[str, tuple[float, str, bool]]:
    """The figures of `table` present in `results`: name -> (value, unit, higher_better)."""
    out: dict[str, tuple[float, str, bool]] = {}
    for name, unit, higher, get in table:
        try:
            out[name] = (get(results), unit, higher)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            continue  # the phase did not run (--only) or has no such figure
    return out


def figures(results: Mapping[str, Any]) -> dict[str, tuple[float, str, bool]]:
    """The headline figures present in `results`: name -> (value, unit, higher_better)."""
    from bench.side_report import figures as side_figures

    out = _read(results, FIGURES)
    if results.get("peers"):
        for name, value in side_figures(results["peers"]).items():
            out[f"side by side: {name}"] = (value, "", SIDE_FIGURES[name])
    return out


def worse(previous: Mapping[str, Any], current: Mapping[str, Any],
          tolerance: float = TOLERANCE) -> list[str]:
    """One line for each figure worse than before by more than `tolerance`."""
    before, now = figures(previous), figures(current)
    lines = []
    for name, (value, unit, higher) in now.items():
        if name not in before or before[name][0] == 0:
            continue
        old = before[name][0]
        change = (value - old) / abs(old)
        if (-change if higher else change) > tolerance:
            lines.append(f"WORSE {name}: {old:.4g} -> {value:.4g} {unit} ({change:+.0%})")
    before, now = _read(previous, HOST_FIGURES), _read(current, HOST_FIGURES)
    for name, (value, unit, _) in now.items():
        old = before.get(name, (0.0, "", False))[0]
        if old and abs(value - old) / abs(old) > tolerance:  # either way: it hides changes too
            lines.append(f"HOST {name}: {old:.4g} -> {value:.4g} {unit} "
                         f"({(value - old) / abs(old):+.0%}): the machine moved, and the "
                         "absolute figures with it; read the ratios (x)")
    return lines


def report(path: Path, current: Mapping[str, Any]) -> list[str]:
    """The comparison with the results saved at `path` (none: a line saying so)."""
    if not path.exists():
        return [f"no previous results at {path}: nothing to compare"]
    previous = json.loads(path.read_text(encoding="utf-8"))["results"]
    lines = worse(previous, current)
    return lines or [f"no figure worse than the previous results by more than "
                     f"{TOLERANCE:.0%}"]
