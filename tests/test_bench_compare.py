"""`make bench` names each headline figure that got worse than the committed results."""

from __future__ import annotations

import json
from pathlib import Path

from bench import compare


def results(step: float, steps_per_s: float, temporal_cpu: float) -> dict[str, object]:
    return {"overhead": {"loop_step": step, "ratio_activity": 2.0},
            "throughput": {"runs": 100, "loop_steps_per_s": steps_per_s,
                           "ratio_activities": 0.5,
                           "loop_cpu": {"temporal": temporal_cpu, "worker": 8.0}}}


def test_worse_figures_are_named_in_their_direction() -> None:
    before = results(step=0.040, steps_per_s=30.0, temporal_cpu=12.0)
    after = results(step=0.050, steps_per_s=20.0, temporal_cpu=11.0)
    lines = compare.worse(before, after)
    assert [line.split(":")[0] for line in lines] == [
        "WORSE one step (server clock)", "WORSE throughput"]


def test_changes_within_the_tolerance_and_missing_phases_are_not_reported(
        tmp_path: Path) -> None:
    before = results(step=0.040, steps_per_s=30.0, temporal_cpu=12.0)
    after = {"overhead": {"loop_step": 0.042, "ratio_activity": 2.1}}  # +5%, no throughput
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps({"results": before}), encoding="utf-8")
    assert compare.report(saved, after) == [
        "no figure worse than the previous results by more than 10%"]
    assert compare.report(tmp_path / "none.json", after)[0].startswith("no previous results")
