"""Every run of the benchmark in one launch (`--launch once`, the default): plan, launch, read back.

The ranks of one `torchrun` (or `deepspeed`) launch run zero_train.bench.worker over the plan: each run in the
interleaved order, each from a fresh model, torn down before the next. The launch costs its start-up once
instead of once per run (docs/startup.md#launching-ranks). Samples are the same as one-launch-per-run samples
(zero_train.bench.run.make_sample) plus, per rank, the allocator bytes left after the teardown ("teardown"): a
run's peak is reported minus what earlier runs left behind (DeepSpeed's one-time set-up, ZeRO-3's engine,
which its destroy() does not free), i.e. as its own launch would have measured it.

A run that fails stops the launch; it is recorded with the last error line of the launch's log and the
rest of the plan is launched again. A launch that makes no progress for --timeout seconds is killed.
"""

from __future__ import annotations

import json
import pathlib

from zero_train.bench import ranks
from zero_train.bench.cells import Cell, cell_ds_config, run_argv, steps_of
from zero_train.bench.run import make_sample, run_paths
from zero_train.ds_config import write_config
from zero_train.launch.cells import last_error_line
from zero_train.runtime.errors import UsageError

WORKER_MODULE = "zero_train.bench.worker"


def done_path(paths: dict[str, pathlib.Path]) -> pathlib.Path:
    """The worker's per-run done file (wall time, teardown bytes), next to the run's record."""
    return paths["record"].with_suffix(".done.json")


def run_all(
    order: list[tuple[int, Cell]], args, out: pathlib.Path, hidden_size: int | None, *, label: str = ""
) -> list[dict]:
    """Run every (repeat, cell) of `order` in as few launches as failures allow; samples in `order`.

    Args:
        order: the interleaved runs.
        args: the bench flags.
        out: the bench directory.
        hidden_size: the model's, for the generated configs' "auto" bucket sizes.
        label: put in the plan's and the launch log's names (OUT/plan-LABEL0.json), when several
            benches of one directory each make their own launches (--launch compare: one per repeat).
    """
    samples: dict[tuple[int, str], dict] = {}
    pending = []
    for repeat, cell in order:
        paths = run_paths(out, cell, repeat)
        for path in (paths["metrics"], paths["record"], done_path(paths)):
            path.unlink(missing_ok=True)
        try:
            write_config(cell_ds_config(cell, args, hidden_size), paths["config"])
        except UsageError as err:
            sample = make_sample(
                cell, repeat, paths, warmup=steps_of(cell, args)[1], wall_s=0.0, error=f"config: {err}"
            )
            samples[(repeat, cell.name)] = sample
            continue
        pending.append((repeat, cell, paths))
    launches = 0
    while pending:
        plan = [
            dict(
                name=f"{cell.name}-r{repeat}",
                peer=cell.is_peer,
                argv=run_argv(cell, args, paths),
                done=str(done_path(paths)),
            )
            for repeat, cell, paths in pending
        ]
        plan_path, log_path = (
            out / f"plan-{label}{launches}.json",
            out / "logs" / f"launch-{label}{launches}.log",
        )
        plan_path.write_text(json.dumps(dict(runs=plan), indent=1) + "\n")
        done_files = [done_path(paths) for _, _, paths in pending]
        code = ranks.launch(
            args, ["--plan", str(plan_path)], log_path, module=WORKER_MODULE, done_files=done_files
        )
        launches += 1
        finished = [entry for entry in pending if done_path(entry[2]).exists()]
        for repeat, cell, paths in finished:
            samples[(repeat, cell.name)] = _finished_sample(cell, repeat, paths, args)
        pending = [entry for entry in pending if entry not in finished]
        if not pending:
            break
        repeat, cell, paths = pending.pop(0)  # the run that stopped the launch
        if code is None:
            error = f"no progress for {args.timeout:g} s (see {log_path})"
        else:
            error = f"exit code {code}: {last_error_line(log_path.read_text())}"
        samples[(repeat, cell.name)] = make_sample(
            cell, repeat, paths, warmup=steps_of(cell, args)[1], wall_s=0.0, error=error
        )
    _subtract_residue(order, samples)
    return [samples[(repeat, cell.name)] for repeat, cell in order]


def _finished_sample(cell: Cell, repeat: int, paths: dict, args) -> dict:
    done = json.loads(done_path(paths).read_text())
    sample = make_sample(
        cell, repeat, paths, warmup=steps_of(cell, args)[1], wall_s=done["wall_s"], error=None
    )
    sample["teardown"] = dict(baseline_bytes=done["baseline_bytes"], after_bytes=done["after_teardown_bytes"])
    return sample


def _subtract_residue(order: list[tuple[int, Cell]], samples: dict) -> None:
    """Each run's peak minus the bytes the runs before it in the same launch left behind (per rank)."""
    residue = None
    for repeat, cell in order:
        sample = samples[(repeat, cell.name)]
        teardown = sample.get("teardown")
        if teardown is None:  # failed: the next launch starts clean
            residue = None
            continue
        before = residue or [0] * len(teardown["baseline_bytes"])
        sample["residue_before_bytes"] = before
        for rank in sample.get("ranks", []):
            rank["peak_bytes"] -= before[rank["rank"]]
        residue = [
            after - base
            for after, base in zip(teardown["after_bytes"], teardown["baseline_bytes"], strict=True)
        ]
