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


def run_client(main: Callable[[], Coroutine[Any, Any, int | None]]) -> NoReturn:
    """Run `main()` (an async function) and exit the process with its status, in every
    path: the int it returns (None: 0), a `SystemExit`'s code, 130 after Ctrl-C, 1 after
    an exception (its traceback printed to stderr first, as Python would).

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
    except BaseException:
        traceback.print_exc()
        code = 1
    _flush()
    os._exit(code)  # sdk-python #300: no interpreter shutdown for the core to abort in


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
