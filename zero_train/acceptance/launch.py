"""Run a plan of the acceptance check in as few launches of ranks as failures allow.

The ranks run zero_train.bench.worker over the plan (each run as its own launch would do it, torn down before
the next); a run that raises stops the launch, is recorded as failed with the last error line of the launch's
log, and the rest of the plan is launched again. A launch that makes no progress for `timeout_s` is stopped.
"""

from __future__ import annotations

import argparse
import json
import pathlib

from zero_train.acceptance.plan import Run
from zero_train.bench import ranks
from zero_train.bench.one_launch import WORKER_MODULE
from zero_train.launch.cells import last_error_line


def run_plan(
    runs: list[Run], out: pathlib.Path, *, world_size: int, launcher: str, timeout_s: float, label: str
) -> dict[str, str | None]:
    """Run every run of `runs` at `world_size` ranks; {run name: None if it finished, else its error line}.

    Args:
        runs: the plan, in order.
        out: the check's directory (plans and launch logs go to OUT/logs).
        world_size, launcher: the ranks (`torchrun` or `deepspeed`).
        timeout_s: a launch without a finished run for this long is stopped.
        label: names the plan's files (OUT/logs/plan-LABEL0.json, launch-LABEL0.log).
    """
    args = argparse.Namespace(world_size=world_size, launcher=launcher, timeout=timeout_s)
    errors: dict[str, str | None] = {}
    for run in runs:
        for path in run.paths(out).values():
            if path.is_file():
                path.unlink()
    pending, launches = list(runs), 0
    while pending:
        plan = [
            dict(name=run.name, peer=run.peer, argv=run.argv, done=str(run.paths(out)["done"]))
            for run in pending
        ]
        plan_path = out / "logs" / f"plan-{label}{launches}.json"
        log_path = out / "logs" / f"launch-{label}{launches}.log"
        plan_path.write_text(json.dumps(dict(runs=plan), indent=1) + "\n")
        done_files = [run.paths(out)["done"] for run in pending]
        code = ranks.launch(
            args, ["--plan", str(plan_path)], log_path, module=WORKER_MODULE, done_files=done_files
        )
        launches += 1
        for run in pending:
            if run.paths(out)["done"].exists():
                errors[run.name] = None
        pending = [run for run in pending if run.name not in errors]
        if not pending:
            break
        failed = pending.pop(0)  # the run that stopped the launch
        if code is None:
            errors[failed.name] = f"no progress for {timeout_s:g} s (see {log_path})"
        else:
            errors[failed.name] = f"exit code {code}: {_error_line(log_path.read_text())} (see {log_path})"
    return errors


def _error_line(log_text: str) -> str:
    """Our one-line `error:` of the failed run when a rank printed one, else the launch's last error line."""
    ours = [line.strip() for line in log_text.splitlines() if line.strip().startswith("error:")]
    return ours[-1] if ours else last_error_line(log_text)
