"""What a worker keeps for its parked runs: a tracemalloc and gc census, diffed.

`python -m bench.worker --census FILE` answers SIGUSR2: the first signal starts
tracemalloc and takes the "before" census (written to FILE.before), the second the
"after" one, and the diff of the two goes to FILE as JSON (tracing from the first
signal on sees every allocation still held at the second: what the runs parked in
between keep; the worker starts and warms up at full speed). The parked phase sends
both signals around the runs it parks (`python -m bench.run --only parked --census`),
so the figures are per parked run:

- Python memory by the file and line that allocated it (tracemalloc, what is still
  held), and by the first frame in boundloop's own code;
- live objects by type (`gc.get_objects`, so containers and instances, not str or
  bytes), with their shallow sizes;
- RSS, and the part of its growth tracemalloc does not see (native memory: the SDK
  core, protobuf messages, pydantic-core validators, allocator slack), with glibc's
  own count of what malloc hands out and holds free, and RSS again after
  `malloc_trim(0)` gave free memory back (what trimming would save).

tracemalloc slows the worker and costs memory of its own: a census run's RSS is not
the figure to quote (measure that without `--census`).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import sys
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

#: Frames kept a traced allocation: enough to find boundloop's frame under the SDK's.
FRAMES = 4
TOP = 40


def start() -> None:
    tracemalloc.start(FRAMES)


def _rss_kib() -> float:
    for line in Path(f"/proc/{os.getpid()}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return float(line.split()[1])
    return float("nan")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]


def _malloc() -> tuple[float, float] | None:
    """glibc's KiB in use (heap and mmapped chunks) and KiB free in its heaps."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return None
    return (info.uordblks + info.hblkhd) / 1024, info.fordblks / 1024


def _trim() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class Census:
    """One moment: a tracemalloc snapshot, live objects by type, RSS and malloc's
    figures; then RSS after malloc_trim."""

    def __init__(self) -> None:
        gc.collect()
        self.rss_kib = _rss_kib()
        self.malloc = _malloc()
        counts: Counter[str] = Counter()
        sizes: Counter[str] = Counter()
        for obj in gc.get_objects():
            kind = type(obj)
            name = f"{kind.__module__}.{kind.__qualname__}"
            counts[name] += 1
            sizes[name] += sys.getsizeof(obj)
        self.counts, self.sizes = counts, sizes
        self.snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__),
             tracemalloc.Filter(False, __file__)])
        _trim()
        self.trimmed_rss_kib = _rss_kib()


_REPO = str(Path(__file__).resolve().parent.parent) + "/"
_STDLIB = os.path.dirname(os.__file__) + "/"


def _where(frame: tracemalloc.Frame) -> str:
    name = frame.filename
    if "site-packages/" in name:
        name = name.split("site-packages/", 1)[1]
    else:
        name = name.removeprefix(_REPO).removeprefix(_STDLIB)
    return f"{name}:{frame.lineno}"


def _own_frame(tb: tracemalloc.Traceback) -> str:
    """The innermost frame in boundloop's or the bench's own code, else the innermost."""
    for frame in reversed(tb):  # innermost last in tracemalloc's order
        if "/boundloop/" in frame.filename or "/bench/" in frame.filename:
            return _where(frame)
    return _where(tb[-1]) if len(tb) else "?"


def diff(before: Census, after: Census, runs: int) -> dict[str, Any]:
    """Per run: what `after` holds beyond `before`, by line, by own frame, by type."""
    per = max(runs, 1)
    stats = after.snapshot.compare_to(before.snapshot, "traceback")
    total = sum(s.size_diff for s in stats)
    by_line: Counter[str] = Counter()
    by_own: Counter[str] = Counter()
    by_file: Counter[str] = Counter()
    for s in stats:
        if not s.size_diff:
            continue
        by_line[_where(s.traceback[-1])] += s.size_diff
        by_own[_own_frame(s.traceback)] += s.size_diff
        by_file[_where(s.traceback[-1]).rsplit(":", 1)[0]] += s.size_diff

    def top(c: Counter[str]) -> list[tuple[str, float]]:
        return [(k, round(v / per / 1024, 2)) for k, v in c.most_common(TOP)]

    types = Counter({k: after.counts[k] - before.counts.get(k, 0) for k in after.counts})
    type_bytes = Counter({k: after.sizes[k] - before.sizes.get(k, 0) for k in after.sizes})
    rss = after.rss_kib - before.rss_kib
    traced = total / 1024
    malloc: dict[str, float] = {}
    if before.malloc is not None and after.malloc is not None:
        malloc = {"malloc_in_use_kib_per_run": round(
                      (after.malloc[0] - before.malloc[0]) / per, 2),
                  "malloc_free_kib_per_run": round(
                      (after.malloc[1] - before.malloc[1]) / per, 2)}
    return {
        "runs": runs,
        "rss_kib_per_run": round(rss / per, 2),
        "traced_kib_per_run": round(traced / per, 2),
        "untraced_kib_per_run": round((rss - traced) / per, 2),
        **malloc,
        "rss_after_trim_kib_per_run": round(
            (after.trimmed_rss_kib - before.trimmed_rss_kib) / per, 2),
        "kib_per_run_by_line": top(by_line),
        "kib_per_run_by_own_frame": top(by_own),
        "kib_per_run_by_file": top(by_file),
        "objects_per_run_by_type": [(k, round(v / per, 2))
                                    for k, v in types.most_common(TOP) if v > 0],
        "shallow_kib_per_run_by_type": [(k, round(v / per / 1024, 2))
                                        for k, v in type_bytes.most_common(TOP) if v > 0],
    }


class Trigger:
    """SIGUSR2 once: the before census; twice: the after census and the diff to `path`.
    The number of runs between them is read from `path`.runs, which the bench writes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.before: Census | None = None

    def __call__(self) -> None:
        if self.before is None:
            if not tracemalloc.is_tracing():
                start()
            self.before = Census()
            Path(f"{self.path}.before").write_text(str(self.before.rss_kib))
            return
        after = Census()
        runs = int(Path(f"{self.path}.runs").read_text())
        report = diff(self.before, after, runs)
        self.before = None
        tmp = Path(f"{self.path}.tmp")
        tmp.write_text(json.dumps(report, indent=1), encoding="utf-8")
        tmp.replace(self.path)


def render(report: dict[str, Any], lines: int = 15) -> str:
    """A census as text for the terminal."""
    out = [f"census over {report['runs']} parked runs, per run: RSS "
           f"{report['rss_kib_per_run']} KiB, Python (tracemalloc) "
           f"{report['traced_kib_per_run']} KiB, not traced "
           f"{report['untraced_kib_per_run']} KiB; malloc in use "
           f"{report.get('malloc_in_use_kib_per_run')} KiB, free "
           f"{report.get('malloc_free_kib_per_run')} KiB; RSS growth after malloc_trim "
           f"{report['rss_after_trim_kib_per_run']} KiB"]
    for key, unit in (("kib_per_run_by_own_frame", "KiB"), ("kib_per_run_by_line", "KiB"),
                      ("objects_per_run_by_type", "objects"),
                      ("shallow_kib_per_run_by_type", "KiB")):
        out.append(f"  {key}:")
        out += [f"    {v:>9} {unit}  {k}" for k, v in report[key][:lines]]
    return "\n".join(out)
