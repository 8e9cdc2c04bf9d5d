"""Where a run's metrics go (--report-to): a JSONL file, TensorBoard, trackio, Weights & Biases, MLflow.

    names = report_targets(config.output)            # ("jsonl", "tensorboard"): "all"/"none" resolved, installed
    trackers = Trackers.open(names, output=config.output, hparams=flat_config, start_step=0, enabled=is_rank0)
    trackers.log_step(record, logged=True)           # loss, lr, grad norm, tokens/s, step time, memory per rank
    trackers.log_eval(record)                        # eval loss, perplexity
    trackers.close()

Rank 0 writes, the other ranks hold no tracker (the step record already carries every rank's memory). The JSONL
file gets every step, the others every logged step (--log-every) and every evaluation, under the names
`train/loss`, `train/lr`, `train/grad_norm`, `train/tokens_per_s`, `train/step_time_s`,
`memory/rank{r}_allocated_mib`, `memory/rank{r}_peak_mib`, `eval/loss`, `eval/perplexity`. Their files go to
--output-dir's runs/ folder. Each library is imported only when asked for (they are optional:
`pip install 'zero-train[tracking]'`); W&B runs offline unless WANDB_MODE says otherwise (`wandb sync` uploads).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib

from zero_train.runtime.errors import UsageError

TRACKERS = ("jsonl", "tensorboard", "trackio", "wandb", "mlflow")
"""Every --report-to target (besides HF's `all` and `none`)."""
LIBRARIES = {"tensorboard": "tensorboard", "trackio": "trackio", "wandb": "wandb", "mlflow": "mlflow"}
"""Target -> the package it needs (jsonl needs none)."""
PROJECT = "zero-train"
"""The trackio / W&B / MLflow project (experiment) every run logs to; runs are told apart by --run-name."""
MIB = 2**20


def parse_report_to(text: str) -> str:
    """argparse type of --report-to: a comma list of TRACKERS, or `all` / `none` alone; normalised ("a,b")."""
    names = [word.strip() for word in str(text).split(",") if word.strip()]
    unknown = [name for name in names if name not in (*TRACKERS, "all", "none")]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{unknown[0] if unknown else text!r} is not a tracker; use a comma list of {', '.join(TRACKERS)}, "
            "or all, or none"
        )
    if len(names) > 1 and {"all", "none"} & set(names):
        raise argparse.ArgumentTypeError(f"'all' and 'none' stand alone, got {text!r}")
    return ",".join(dict.fromkeys(names))


def installed(name: str) -> bool:
    """Whether tracker `name`'s library can be imported."""
    return name not in LIBRARIES or importlib.util.find_spec(LIBRARIES[name]) is not None


def report_targets(output) -> tuple[str, ...]:
    """The trackers a run opens (UsageError naming the package if one asked for is not installed).

    Args:
        output: the run config's OutputConfig (report_to, metrics_file; checked by the config already).

    Returns:
        `none`: (); else the trackers named (`all`: every installed library), and jsonl whenever there is a
        metrics file (--metrics-file, or --output-dir's when jsonl is wanted).
    """
    if output.report_to == "none":
        return ()
    if output.report_to in (None, "all"):
        names = [name for name in LIBRARIES if output.report_to == "all" and installed(name)]
    else:
        names = output.report_to.split(",")
    if output.metrics_file and "jsonl" not in names:
        names.insert(0, "jsonl")
    for name in names:
        if not installed(name):
            raise UsageError(
                f"--report-to {name}: the {LIBRARIES[name]} package is not installed; "
                f"pip install 'zero-train[tracking]' (or pip install {LIBRARIES[name]})"
            )
    return tuple(names)


def step_metrics(record: dict) -> dict[str, float]:
    """The tracked scalars of one step record (zero_train.train.loop)."""
    metrics = {
        "train/loss": record["loss"],
        "train/lr": record["lr"],
        "train/tokens_per_s": record["tokens_per_s"],
        "train/step_time_s": record["step_time_s"],
    }
    if record["grad_norm"] is not None:
        metrics["train/grad_norm"] = record["grad_norm"]
    for rank, memory in enumerate(record["memory"]):
        metrics[f"memory/rank{rank}_allocated_mib"] = memory["allocated_bytes"] / MIB
        metrics[f"memory/rank{rank}_peak_mib"] = memory["peak_bytes"] / MIB
    return metrics


def eval_metrics(record: dict) -> dict[str, float]:
    """The tracked scalars of one evaluation record."""
    return {"eval/loss": record["eval_loss"], "eval/perplexity": record["perplexity"]}


class Trackers:
    """The run's trackers (none on ranks other than 0); each gets the same calls."""

    def __init__(self, trackers: list) -> None:
        self.trackers = trackers

    @classmethod
    def open(cls, names, *, output, hparams: dict, start_step: int, enabled: bool) -> Trackers:
        """Open `names` (from report_targets) on rank 0; a resumed run (start_step > 0) continues its files."""
        if not enabled:
            return cls([])
        runs = pathlib.Path(output.output_dir or ".") / "runs"
        name = output.run_name or pathlib.Path(output.output_dir or "run").resolve().name
        opened = []
        for target in names:
            if target == "jsonl":
                opened.append(JsonlTracker(output.metrics_file, append=start_step > 0))
            else:
                opened.append(_BACKENDS[target](runs, name=name, hparams=hparams, start_step=start_step))
        return cls(opened)

    def log_step(self, record: dict, *, logged: bool) -> None:
        """A step: every step to JSONL, logged steps (--log-every) to the others."""
        for tracker in self.trackers:
            if logged or isinstance(tracker, JsonlTracker):
                tracker.log_step(record)

    def log_eval(self, record: dict) -> None:
        """An evaluation, to every tracker."""
        for tracker in self.trackers:
            tracker.log_eval(record)

    def close(self) -> None:
        """Flush and close every tracker."""
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []


class JsonlTracker:
    """One JSON object per line: every step record whole, and every evaluation (a crash keeps each line)."""

    def __init__(self, path: str, *, append: bool) -> None:
        target = pathlib.Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        self.file = target.open("a" if append else "w", encoding="utf-8")

    def log_step(self, record: dict) -> None:
        self._write(record)

    def log_eval(self, record: dict) -> None:
        self._write(record)

    def _write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class _ScalarTracker:
    """A tracker of named scalars by step: the subclasses say how one dict of them is written."""

    def log_step(self, record: dict) -> None:
        self.log(step_metrics(record), record["step"])

    def log_eval(self, record: dict) -> None:
        self.log(eval_metrics(record), record["step"])


class TensorBoardTracker(_ScalarTracker):
    """Event files in runs/tensorboard; a restart at step s hides the events an earlier run wrote from step s+1."""

    def __init__(self, runs: pathlib.Path, *, name: str, hparams: dict, start_step: int) -> None:
        # optional: tensorboard, installed by who logs to it
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.writer = SummaryWriter(str(runs / "tensorboard"), purge_step=start_step + 1, flush_secs=10)
        self.writer.add_text(
            "run_config", f"```\n{json.dumps(hparams, indent=1)}\n```", global_step=start_step
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)

    def close(self) -> None:
        self.writer.close()


class TrackioTracker(_ScalarTracker):
    """trackio's local SQLite store in runs/trackio (TRACKIO_DIR, unless set); a resumed run continues its run."""

    def __init__(self, runs: pathlib.Path, *, name: str, hparams: dict, start_step: int) -> None:
        os.environ.setdefault(
            "TRACKIO_DIR", str((runs / "trackio").resolve())
        )  # read when trackio is imported
        import trackio  # optional: trackio, installed by who logs to it

        self.trackio = trackio
        self.run = trackio.init(
            project=PROJECT,
            name=name,
            config=hparams,
            resume="allow" if start_step else "never",
            embed=False,
            auto_log_cpu=False,
            auto_log_gpu=False,
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.trackio.finish()


class WandbTracker(_ScalarTracker):
    """Weights & Biases in runs/wandb, offline unless WANDB_MODE is set (`wandb sync runs/wandb/...` uploads)."""

    def __init__(self, runs: pathlib.Path, *, name: str, hparams: dict, start_step: int) -> None:
        os.environ.setdefault("WANDB_MODE", "offline")
        import wandb  # optional: wandb, installed by who logs to it

        (runs / "wandb").mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=PROJECT, name=name, dir=str(runs / "wandb"), config=hparams)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker(_ScalarTracker):
    """MLflow in runs/mlflow.db (SQLite, MLflow's own default store), unless MLFLOW_TRACKING_URI is set."""

    def __init__(self, runs: pathlib.Path, *, name: str, hparams: dict, start_step: int) -> None:
        import mlflow  # optional: mlflow, installed by who logs to it

        runs.mkdir(parents=True, exist_ok=True)
        if "MLFLOW_TRACKING_URI" not in os.environ:
            mlflow.set_tracking_uri(f"sqlite:///{(runs / 'mlflow.db').resolve()}")
        mlflow.set_experiment(PROJECT)
        self.mlflow = mlflow
        self.run = mlflow.start_run(run_name=name)
        mlflow.log_params({key: str(value) for key, value in hparams.items()})

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics(metrics, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


_BACKENDS = {
    "tensorboard": TensorBoardTracker,
    "trackio": TrackioTracker,
    "wandb": WandbTracker,
    "mlflow": MlflowTracker,
}
