"""`make bench` names each headline figure that got worse than the committed results."""

from __future__ import annotations

import json
from pathlib import Path

from bench import compare


def results(step: float, steps_per_s: float, temporal_cpu: float, bare_step: float = 0.015,
            bare_temporal_cpu: float = 12.0) -> dict[str, object]:
    return {"overhead": {"loop_step": step, "ratio_activity": 2.0, "bare_step": bare_step},
            "throughput": {"runs": 100, "loop_steps_per_s": steps_per_s,
                           "ratio_activities": 0.5, "bare_steps_per_s": 40.0,
                           "loop_cpu": {"temporal": temporal_cpu, "worker": 8.0},
                           "bare_cpu": {"temporal": bare_temporal_cpu, "worker": 8.0}}}


def test_worse_figures_are_named_in_their_direction() -> None:
    before = results(step=0.040, steps_per_s=30.0, temporal_cpu=12.0)
    after = results(step=0.050, steps_per_s=20.0, temporal_cpu=11.0)
    lines = compare.worse(before, after)
    assert [line.split(":")[0] for line in lines] == [
        "WORSE one step (server clock)", "WORSE throughput"]
    assert lines[0].startswith("WORSE one step (server clock): 40 -> 50 ms (+25%)")


def test_a_slower_machine_is_named_and_the_same_run_ratios_still_compare() -> None:
    # Everything twice as slow, bare Temporal too: the host moved, not the code; but the
    # server's CPU against bare's in the same run grew: that one is the code's.
    before = results(step=0.040, steps_per_s=30.0, temporal_cpu=12.0)
    after = results(step=0.080, steps_per_s=30.0, temporal_cpu=30.0, bare_step=0.030,
                    bare_temporal_cpu=20.0)
    lines = compare.worse(before, after)
    assert [line.split(":")[0] for line in lines] == [
        "WORSE one step (server clock)", "WORSE Temporal server CPU a run",
        "WORSE Temporal server CPU a run / bare's", "HOST bare Temporal's own step"]
    assert "15 -> 30 ms (+100%): the machine moved" in lines[-1]


def test_changes_within_the_tolerance_and_missing_phases_are_not_reported(
        tmp_path: Path) -> None:
    before = results(step=0.040, steps_per_s=30.0, temporal_cpu=12.0)
    after = {"overhead": {"loop_step": 0.042, "ratio_activity": 2.1}}  # +5%, no throughput
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps({"results": before}), encoding="utf-8")
    assert compare.report(saved, after) == [
        "no figure worse than the previous results by more than 10%"]
    assert compare.report(tmp_path / "none.json", after)[0].startswith("no previous results")


def side(loop_steps_per_s: float, loop_step: float, parked_kib: float) -> dict[str, object]:
    """A side-by-side result (`make bench-peers`) with boundloop's figures as given."""
    def system(steps_per_s: float, step: float, cpu: float) -> dict[str, object]:
        return {"steps_per_s": steps_per_s, "cpu_per_step": {"temporal": cpu},
                "step": step, "bytes_per_step": 5000.0, "events_per_step": 13.0}
    tp = {"bare": system(40.0, 0.020, 0.010), "boundloop": system(loop_steps_per_s, 0, 0.012),
          "openai-agents": system(25.0, 0, 0.015), "pydantic-ai": system(20.0, 0, 0.011)}
    st = {"bare": system(0, 0.020, 0), "boundloop": system(0, loop_step, 0),
          "openai-agents": system(0, 0.050, 0), "pydantic-ai": system(0, 0.040, 0)}
    return {"throughput": {"systems": tp}, "per_step": {"systems": st},
            "parked": {"boundloop": {"per_run_kib": parked_kib}}}


def test_the_peers_ratios_are_against_the_faster_peer_of_the_same_run() -> None:
    from bench.side_report import figures

    f = figures(side(loop_steps_per_s=50.0, loop_step=0.030, parked_kib=50.0))
    assert f["throughput / bare"] == 50.0 / 40.0
    assert f["throughput / faster peer"] == 50.0 / 25.0  # openai-agents: more steps/s
    assert f["step / faster peer"] == 0.030 / 0.040  # pydantic-ai: the shorter step
    assert f["server CPU a step / faster peer"] == 0.012 / 0.011  # pydantic-ai: less CPU


def test_a_worse_peers_ratio_is_named() -> None:
    before = {"peers": side(loop_steps_per_s=50.0, loop_step=0.030, parked_kib=50.0)}
    after = {"peers": side(loop_steps_per_s=30.0, loop_step=0.030, parked_kib=80.0)}
    names = {line.split(":", 1)[1].split(":")[0].strip() for line in compare.worse(before,
                                                                                  after)}
    assert names == {"throughput / bare", "throughput / faster peer",
                     "worker RSS a parked run (KiB)"}


def test_the_side_by_side_block_is_replaced_in_place() -> None:
    from bench.side_report import BEGIN, END, place

    kept = "<!-- kept -->"
    doc = place(f"generated\n{kept}\nhand-written\n", f"{BEGIN}\nfirst\n{END}\n", kept)
    doc = place(doc, f"{BEGIN}\nsecond\n{END}\n", kept)
    assert doc == f"generated\n{kept}\n\n{BEGIN}\nsecond\n{END}\n\nhand-written\n"


def test_the_peers_scripts_parse_without_the_peers_packages() -> None:
    # They run in .venv-peers; here only their syntax (`make bench-peers` runs them).
    import ast

    peers = Path(__file__).resolve().parent.parent / "bench" / "peers"
    files = sorted(peers.glob("*.py"))
    assert {f.name for f in files} >= {"oai.py", "pyd.py", "worker.py", "report.py"}
    for f in files:
        ast.parse(f.read_text(encoding="utf-8"), filename=str(f))
