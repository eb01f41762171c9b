"""Running a client script to its end: `boundloop.run_client(main)`.

A process that used a Temporal client can abort while the interpreter shuts down (the
SDK core's threads outlive Python's: `PyGILState_Release`, sdk-python #300), whatever
way the script ends. `run_client` runs the script's coroutine, then ends the process at
once with its exit status, after flushing output: the abort has no time to happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import traceback
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn

from boundloop.errors import BoundloopError, TemporalUnreachable


def run_client(main: Callable[[], Coroutine[Any, Any, int | None]]) -> NoReturn:
    """Run `main()` (an async function) and exit the process with its status, in every
    path: the int it returns (None: 0), a `SystemExit`'s code, 130 after Ctrl-C, 1 after
    an exception (its traceback printed to stderr first, as Python would). Temporal not
    reached (`TemporalUnreachable`) or a connection setting that cannot be used
    (`ConnectionSettingsError`) is one line, `error: …`, and the CLI's exit code: 4, 2.

        async def main() -> None:
            client = await boundloop.connect()
            ...

        if __name__ == "__main__":
            boundloop.run_client(main)
    """
    try:
        returned = asyncio.run(main())
        code = 0 if returned is None else int(returned)
    except SystemExit as exc:
        code = _status(exc.code)
    except KeyboardInterrupt:
        code = 130
    except BoundloopError as exc:
        told = _connection_code(exc)
        if told is None:
            traceback.print_exc()
            code = 1
        else:  # a server not reached, a setting not usable: one line, as the CLI says it
            print(f"error: {exc}", file=sys.stderr)
            code = told
    except BaseException:
        traceback.print_exc()
        code = 1
    _flush()
    os._exit(code)  # sdk-python #300: no interpreter shutdown for the core to abort in


def _connection_code(exc: BoundloopError) -> int | None:
    """The CLI's exit code for an error of `boundloop.connect` (4: Temporal not reached
    or refusing TLS; 2: a connection setting that cannot be used), else None."""
    from boundloop.connection import ConnectionSettingsError
    from boundloop.exit_codes import ExitCode

    if isinstance(exc, TemporalUnreachable):
        return int(ExitCode.UNREACHABLE)
    if isinstance(exc, ConnectionSettingsError):
        return int(ExitCode.INVALID)
    return None


def _status(value: object) -> int:
    """A SystemExit's code as Python's exit would have it (a message prints, exits 1)."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        # Closed, or a broken pipe: there is nothing more to say.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
