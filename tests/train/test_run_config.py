"""The typed run config: flags derived from its fields, a TOML file under the flags, back to argv; the shared
defaults; the launch command builder."""

from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess
import sys

import pytest

from zero_train.launch.command import Launch, launch_command, shell_text
from zero_train.runtime.defaults import SHARED_DEFAULTS, default_for
from zero_train.runtime.errors import UsageError
from zero_train.train.args import build_parser, field_docs, parse_args, run_argv
from zero_train.train.config import (
    PARTS,
    CheckpointConfig,
    EngineConfig,
    ModelConfig,
    OutputConfig,
    RunConfig,
    TrainingConfig,
)

pytestmark = pytest.mark.tier("quick")

VARIED = [
    "--engine", "ds1", "--model", "gpt2-25m", "--lr", "1e-4", "--no-progress", "--async-save",
    "--save-dir", "ckpt", "--max-steps", "7", "--gradient-checkpointing", "--precision", "bf16",
    "--deepspeed_config", "ds.json", "--eval-batches", "1", "--grad-clip", "0",
]  # fmt: skip


def test_every_field_is_one_flag_with_its_docstring_as_help():
    parser = build_parser()
    dests = {action.dest for action in parser._actions} - {"help", "config", "local_rank", "hf_refused"}
    fields = {f"{name}.{spec.name}" for name, part in PARTS.items() for spec in dataclasses.fields(part)}
    assert dests == fields  # no flag written by hand beside the fields
    docs = field_docs()
    assert all(
        docs[f"{part.__name__}.{spec.name}"] for part in PARTS.values() for spec in dataclasses.fields(part)
    )
    block = next(action for action in parser._actions if action.dest == "data.block_size")
    assert block.help == "tokens per training sequence (default 64)"


def test_argv_round_trip_gives_the_same_config():
    config = parse_args(VARIED)
    assert config.engine.engine == "ds1" and config.optimizer.lr == 1e-4 and config.output.progress is False
    assert config.optimizer.grad_clip == 0.0 and config.training.max_steps == 7
    assert parse_args(run_argv(config)) == config
    assert run_argv(RunConfig()) == []  # the defaults need no flag
    flags = {word for word in VARIED if word.startswith("--")}
    assert {word for word in run_argv(config) if word.startswith("--")} == flags  # the values may read 0.0001


def test_a_toml_file_under_the_flags(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[model]\nmodel = "gpt2-25m"\n[training]\nmax_steps = 50\nmicro_batch_size = 4\n'
                    '[optimizer]\nlr = 3e-4\n[output]\nprogress = false\n')  # fmt: skip
    config = parse_args(["--config", str(path), "--max-steps", "9"])
    assert config.training == TrainingConfig(max_steps=9, micro_batch_size=4)  # the flag wins, the rest stays
    assert (config.model.model, config.optimizer.lr, config.output.progress) == ("gpt2-25m", 3e-4, False)
    assert parse_args(["--config", str(path), *run_argv(config)]) == config


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[training]\nmax_steps = 0\n", "max_steps (--max-steps): expected a whole number >= 1, got 0"),
        ("[trainin]\nmax_steps = 3\n", "unknown table [trainin]; the tables are [model], [lora], [data]"),
        ("[training]\nmax_step = 3\n", "[training] has no setting 'max_step'; it has max_steps"),
        (
            '[model]\ngradient_checkpointing = "yes"\n',
            "gradient_checkpointing (--gradient-checkpointing): expected true or false, got 'yes'",
        ),
        ('[engine]\nengine = "fsdp"\n', "engine (--engine): 'fsdp' is not one of ddp, zero1"),
        ("[checkpoint]\nsave_every = 5\n", "--save-every needs --save-dir"),
        ("[model\n", "not TOML"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_file_and_the_setting(tmp_path, text, message):
    path = tmp_path / "run.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as caught:
        parse_args(["--config", str(path)])
    assert str(caught.value).startswith(f"--config {path}: ") and message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_bad_values_in_code_and_on_the_command_line():
    with pytest.raises(UsageError, match=r"max_steps \(--max-steps\): expected a whole number >= 1, got 0"):
        TrainingConfig(max_steps=0)
    with pytest.raises(UsageError, match="--async-save needs --save-dir or --output-dir"):
        RunConfig(checkpoint=CheckpointConfig(async_save=True))
    with pytest.raises(
        UsageError, match="argument --block-size/--block_size: expected a whole number >= 1, got 0"
    ):
        parse_args(["--block-size", "0"])
    with pytest.raises(UsageError, match="--config /no/such.toml: No such file"):
        parse_args(["--config", "/no/such.toml"])
    assert TrainingConfig(max_steps="12").max_steps == 12  # a file's "12" is read as the flag's type would


def test_zero_train_train_takes_the_same_flags():
    from zero_train.cli.main import build_parser as cli_parser
    from zero_train.cli.train import train_command
    from zero_train.train.args import config_from_flags

    args = cli_parser(["train"]).parse_args(["train", *VARIED])
    assert args.func is train_command and config_from_flags(vars(args)) == parse_args(VARIED)


def test_shared_flags_agree_between_train_and_profile():
    """One table: train.py's and profile's defaults of the shared flags are its values, or a stated reason."""
    from zero_train.cli.main import build_parser as cli_parser

    profile = cli_parser(["profile"]).parse_args(["profile", "--out", "x"])
    train = RunConfig()
    assert (profile.model, profile.block_size, profile.micro_batch_size) == ("tiny", 64, 2)
    assert (train.model.model, train.data.block_size, train.model.gradient_checkpointing) == (
        "tiny",
        64,
        False,
    )
    for flag, shared in SHARED_DEFAULTS.items():
        assert default_for(flag, "profile") == shared.value  # profile differs from no shared default
        assert all(differs.why for differs in shared.differs.values())
    assert default_for("precision", "plan") == "bf16" and default_for("micro_batch_size", "train") is None


@pytest.mark.parametrize(
    ("launch", "expected"),
    [
        (Launch(launcher="python"), "python -m zero_train.train --engine ds2"),
        (Launch(launcher="torchrun", nproc_per_node=2, master_port=29600),
         "torchrun --nproc_per_node 2 --master_port 29600 -m zero_train.train --engine ds2"),
        (Launch(launcher="torchrun", nproc_per_node=8, nnodes=2, node_rank=1, master_addr="worker-1"),
         "torchrun --nproc_per_node 8 --nnodes 2 --node_rank 1 --master_addr worker-1 -m zero_train.train --engine ds2"),
        (Launch(launcher="deepspeed", nproc_per_node=2),
         "deepspeed --num_gpus 2 --module zero_train.train --engine ds2"),
        (Launch(launcher="deepspeed", nproc_per_node=8, nnodes=2, hostfile="hosts", master_addr="worker-1"),
         "deepspeed --num_gpus 8 --hostfile hosts --num_nodes 2 --master_addr worker-1 --module zero_train.train "
         "--engine ds2"),
        (Launch(launcher="accelerate", nproc_per_node=2),
         "accelerate launch --multi_gpu --num_processes 2 -m zero_train.train --engine ds2"),
        (Launch(launcher="accelerate", nproc_per_node=8, nnodes=2, config_file="accel.yaml"),
         "accelerate launch --config_file accel.yaml --num_processes 16 --num_machines 2 --machine_rank 0 "
         "-m zero_train.train --engine ds2"),
    ],
)  # fmt: skip
def test_launch_commands_of_every_launcher(launch, expected):
    argv = run_argv(RunConfig(engine=EngineConfig(engine="ds2")))
    assert shell_text(launch_command(launch, argv, local=False)) == expected


def test_launch_command_quotes_for_the_shell_and_runs_scripts():
    config = RunConfig(model=ModelConfig(model="my model"), output=OutputConfig(metrics_file="a b.jsonl"))
    command = launch_command(
        Launch(launcher="torchrun"), run_argv(config), script="scripts/train.py", local=False
    )
    assert command[-5:] == ["scripts/train.py", "--model", "my model", "--metrics-file", "a b.jsonl"]
    assert shlex.split(shell_text(command)) == command
    assert launch_command(Launch(launcher="python"), [])[0] == sys.executable  # local: this Python
    with pytest.raises(ValueError, match="launcher python starts one process"):
        Launch(launcher="python", nproc_per_node=2)


@pytest.mark.tier("slow")
def test_the_module_entry_point_answers_help_and_bad_flags():
    """`python -m zero_train.train` is the entry point (scripts/train.py is its shim): --help, and a bad value
    as one line with exit code 2."""
    ok = subprocess.run([sys.executable, "-m", "zero_train.train", "--help"], capture_output=True, text=True)
    assert ok.returncode == 0 and "--engine ENGINE" in ok.stdout and "fsdp2-z3" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "zero_train.train", "--max-steps", "0"], capture_output=True,
                         text=True)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--max-steps" in bad.stderr


HF_SPELLINGS = {
    "--output_dir": ("output", "output_dir", "out"),
    "--per_device_train_batch_size": ("training", "micro_batch_size", 4),
    "--gradient_accumulation_steps": ("training", "grad_accum", 8),
    "--learning_rate": ("optimizer", "lr", 2e-5),
    "--num_train_epochs": ("training", "num_train_epochs", 3.0),
    "--report_to": ("output", "report_to", "tensorboard"),
    "--save_total_limit": ("checkpoint", "save_total_limit", 2),
    "--resume_from_checkpoint": ("checkpoint", "resume", "auto"),
}


def test_the_hf_trainer_spellings_are_aliases_listed_in_help():
    argv = [word for flag, (_, _, value) in HF_SPELLINGS.items() for word in (flag, str(value))]
    config = parse_args(argv)
    for flag, (part, name, value) in HF_SPELLINGS.items():
        assert getattr(getattr(config, part), name) == value, flag
    ours = parse_args(run_argv(config))  # back to our own spellings, the same run
    assert ours == config and not any("_" in word for word in run_argv(config) if word.startswith("--o"))
    text = " ".join(build_parser().format_help().split())
    assert all(f"{flag} " in text for flag in HF_SPELLINGS)
    assert "--lr LR, --learning_rate LR" in text


def test_output_dir_holds_checkpoints_metrics_and_export_unless_given():
    config = parse_args(["--output-dir", "run1", "--export-hf", "auto"])
    assert (
        config.checkpoint.save_dir == "run1/checkpoints"
        and config.output.metrics_file == "run1/metrics.jsonl"
    )
    assert config.checkpoint.export_hf == "run1/hf"
    given = parse_args(
        ["--output-dir", "run1", "--save-dir", "ckpt", "--metrics-file", "m.jsonl", "--export-hf", "x"]
    )
    assert (given.checkpoint.save_dir, given.output.metrics_file, given.checkpoint.export_hf) == (
        "ckpt",
        "m.jsonl",
        "x",
    )
    assert parse_args(["--output-dir", "run1", "--report-to", "none"]).output.metrics_file is None
    assert (
        parse_args(["--output-dir", "run1", "--save-every", "5", "--resume", "auto"]).checkpoint.save_every
        == 5
    )
    assert parse_args(run_argv(config)) == config


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--export-hf", "auto"], "--export-hf auto needs --output-dir"),
        (["--report-to", "tensorboard"], "--report-to tensorboard needs --output-dir"),
        (["--report-to", "jsonl"], "--report-to jsonl needs --metrics-file or --output-dir"),
        (
            ["--report-to", "none", "--metrics-file", "m.jsonl"],
            "--report-to none but --metrics-file is given",
        ),
        (
            ["--report-to", "tensorboard,comet"],
            "'comet' is not a tracker; use a comma list of jsonl, tensorboard",
        ),
        (["--report-to", "all,jsonl"], "'all' and 'none' stand alone"),
        (["--streaming", "--dataset", "x.jsonl"], "--streaming reads the dataset lazily, so its size"),
        (["--streaming", "--num-train-epochs", "2"], "give --max-steps"),
        (["--resume", "auto"], "--resume auto needs --save-dir or --output-dir"),
    ],
)
def test_settings_that_need_one_another_are_one_line(argv, message):
    with pytest.raises(UsageError) as caught:
        parse_args(argv)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_report_to_from_a_toml_list_and_help_that_says_what_happens(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[output]\noutput_dir = "o"\nreport_to = ["tensorboard", "jsonl"]\n')
    assert parse_args(["--config", str(path)]).output.report_to == "tensorboard,jsonl"
    helps = {action.dest: " ".join(action.help.split()) for action in build_parser()._actions if action.help}
    assert "must agree or the run is refused" in helps["training.precision"]  # not "override"
    from zero_train.ds_config.keys import RUN_LR_FINE_TUNING, RUN_LR_FROM_SCRATCH
    from zero_train.hf.models import PRESETS

    lr_help = helps["optimizer.lr"]  # the numbers the docstring states are the ones plan_run uses
    assert float(re.search(r"else (\S+) for pretrained", lr_help)[1]) == RUN_LR_FINE_TUNING
    assert float(re.search(r"and (\S+) from random", lr_help)[1]) == RUN_LR_FROM_SCRATCH
    assert all(name in helps["model.model"] for name in PRESETS)


def test_the_trackers_a_run_opens():
    from zero_train.train.tracking import LIBRARIES, installed, report_targets

    def targets(*argv):
        return report_targets(parse_args(["--output-dir", "o", *argv]).output)

    assert targets() == ("jsonl",) and targets("--report-to", "none") == ()
    assert targets("--report-to", "tensorboard") == ("tensorboard",)  # as asked: no metrics.jsonl
    assert parse_args(["--output-dir", "o", "--report-to", "tensorboard"]).output.metrics_file is None
    assert targets("--report-to", "trackio", "--metrics-file", "m.jsonl") == (
        "jsonl",
        "trackio",
    )  # never ignored
    assert targets("--report-to", "all") == ("jsonl", *(name for name in LIBRARIES if installed(name)))
    missing = [name for name in ("wandb", "mlflow") if not installed(name)]
    if not missing:
        pytest.skip("wandb and mlflow are both installed: no missing library to name")
    with pytest.raises(UsageError) as caught:
        targets("--report-to", f"tensorboard,{missing[0]}")
    assert str(caught.value) == (
        f"--report-to {missing[0]}: the {missing[0]} package is not installed; pip install 'zero-train[tracking]' "
        f"(or pip install {missing[0]})"
    )
