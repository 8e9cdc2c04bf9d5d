"""The one exception type a user can cause, and the runtime fault a run can end with.

A `UsageError` carries a single line that names the problem and the fix. Every entry point (the
`zero-train` CLI and `scripts/*.py`) turns it into that line on stderr and exit code 2, with no
traceback. Internal invariants use `assert`; anything else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

from zero_train.runtime import lifeline

EXIT_USAGE = 2
EXIT_FAULT = 1


class NonFiniteError(RuntimeError):
    """The loss or the gradient norm became NaN/inf; the run cannot usefully continue (exit code 1).

    Raised by zero_train.train.numerics.NonFiniteGuard; defined here so that run_cli tells it from a bug by its
    class, not its name.
    """


class UsageError(ValueError):
    """A mistake the user can fix: bad flag, bad config, missing file, sizes that don't fit.

    Args:
        message: one line, naming the problem and the fix.
        problems: optional list of further one-line problems (e.g. every issue `config check` found).
    """

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = list(problems or [])


class Fault(RuntimeError):
    """A runtime fault the program can describe in one line (e.g. a checkpoint that could not be saved).

    Entry points print `error: <message>` and exit with code 1, with no traceback.
    """


class Stopped(BaseException):
    """This command was told to stop (SIGTERM, SIGINT, SIGHUP) while it waited on a launch, which it stopped.

    A BaseException, as KeyboardInterrupt is: no `except Exception` on the way may swallow it. run_cli prints
    `error: stopped by SIGTERM: <what>` and exits with 128 + the signal's number, as a shell reports a process
    the signal ended.
    """

    def __init__(self, signum: int, what: str = "nothing was running"):
        super().__init__(signum)
        self.signum = signum
        self.what = what


SAID_ENV = "ZT_SAID_DIR"
"""A folder the ranks of one launch share (zero_train.launch.ranks sets it): a line one rank has said is not said
again by another, since every rank finds the same bad dataset line or config key; a line that names its rank
differs and is said."""


def error_line(message: str) -> None:
    """Write `error: <message>` to stderr as ONE write: ranks of a launch share the launcher's pipe and run
    unbuffered (`python -u`), where print() writes the text and the newline separately and two ranks' lines
    interleave ("...'stdlib'error: dataset ..."); one write() under PIPE_BUF (4 KiB) reaches the pipe whole."""
    line = f"error: {message}\n"
    if _first_to_say(line):
        sys.stderr.write(line)
        sys.stderr.flush()


def _first_to_say(line: str) -> bool:
    """False if another rank of this launch has said `line` (SAID_ENV): creating a file named by the line's hash
    with O_EXCL succeeds for exactly one process. True without the folder, or if it cannot be written."""
    folder = os.environ.get(SAID_ENV)
    if not folder:
        return True
    import hashlib  # expensive: OpenSSL's init, 20-40 ms on every start-up (--help too) otherwise

    path = os.path.join(folder, hashlib.sha256(line.encode()).hexdigest()[:20])
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    except OSError:
        return True
    return True


def fail(message: str) -> NoReturn:
    """Print `error: <message>` to stderr and exit with code 2."""
    error_line(message)
    raise SystemExit(EXIT_USAGE)


def run_cli(entry: Callable[[], int | None]) -> NoReturn:
    """Run `entry`: UsageError -> one line + exit 2; a runtime fault -> one line + exit 1.

    Runtime faults are `Fault`s (a failed checkpoint save), NonFiniteError and distributed failures (a dead or
    hung peer rank, see zero_train.runtime.faults); anything else is a bug and keeps its traceback. A process
    that a launcher started stops when its launch is gone (zero_train.runtime.lifeline).
    """
    lifeline.watch_launcher()
    try:
        code = entry()
    except UsageError as err:
        _hold_sigterm()
        for problem in err.problems:
            error_line(problem)
        fail(str(err))
    except Fault as err:
        _hold_sigterm()
        _fault(str(err))
    except RuntimeError as err:
        _hold_sigterm()
        if isinstance(err, NonFiniteError):
            _fault(str(err))
        if not _faults().is_distributed_fault(err):
            raise
        _fault(_faults().describe_fault(err))
    except Stopped as err:
        error_line(f"stopped by {signal.Signals(err.signum).name}: {err.what}")
        raise SystemExit(128 + err.signum) from None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    raise SystemExit(code or 0)


def _hold_sigterm() -> None:
    """From here to the exit, a launcher's SIGTERM is ignored: this process prints its one line and exits.

    When a rank dies, the launcher terminates the survivors (SIGTERM) while they may already be reporting the
    failure; the handler zero_train.runtime.faults installs would raise inside this report (or in an atexit
    hook) and print a traceback, and its watcher thread would print a second line.
    """
    _faults().mark_reporting()


def _faults():
    """zero_train.runtime.faults, imported when a run ends with an error: not on every start-up."""
    # expensive: faults, vitals, memory_limit (~15 ms), which every start-up would pay (it imports this module)
    from zero_train.runtime import faults

    return faults


def _fault(message: str) -> NoReturn:
    error_line(message)
    raise SystemExit(EXIT_FAULT)
