"""The fine-tuning defaults a Trainer user expects: HF's lr, decay and warmup on pretrained weights, checked against
transformers' own schedulers; where each setting came from; a resume that re-plans its horizon without a jump;
an --output-dir that holds a run refused unless --resume or --overwrite-output-dir; HF's spellings."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest
import torch

from zero_train.ds_config import lr_at
from zero_train.engines.optim import client_lr_scheduler
from zero_train.runtime.errors import UsageError
from zero_train.train.args import parse_args
from zero_train.train.schedule import resumed_schedule
from zero_train.train.setup import plan_run

pytestmark = pytest.mark.tier("quick")

COMMON = ["--engine", "ddp", "--block-size", "32", "--no-progress"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    """A tiny random GPT-2 written by save_pretrained, with the offline tokenizer: pretrained weights."""
    from zero_train.hf import models as hf

    path = tmp_path_factory.mktemp("model")
    torch.manual_seed(0)
    hf.build_model(hf.model_config("tiny")).save_pretrained(path)
    hf.load_tokenizer().save_pretrained(path)
    return str(path)


def _plan(*argv: str):
    return plan_run(parse_args([*argv, *COMMON]), world_size=1)


def _transformers_lrs(kind: str, *, warmup: int, total: int, peak: float) -> list[float]:
    from transformers import get_scheduler

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    scheduler = get_scheduler(kind, optimizer, num_warmup_steps=warmup, num_training_steps=total)
    lrs = []
    for _ in range(total):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


@pytest.mark.parametrize("kind", ["linear", "cosine", "constant_with_warmup", "constant"])
def test_every_engine_follows_transformers_schedulers_step_for_step(folder, kind):
    warmup = [] if kind == "constant" else ["--warmup_ratio", "0.25"]  # ceil(0.25 x 10) = 3 steps
    plan = _plan("--model", folder, "--max-steps", "10", "--lr_scheduler_type", kind, *warmup)
    expected = _transformers_lrs(kind, warmup=0 if kind == "constant" else 3, total=10, peak=5e-5)
    assert [lr_at(plan.settings, step) for step in range(10)] == pytest.approx(expected, rel=1e-12, abs=1e-20)
    assert "scheduler" not in plan.ds_config  # DeepSpeed gets the schedule as its client lr_scheduler
    if kind == "constant":
        assert client_lr_scheduler(plan.settings) is None  # DeepSpeed's optimizer keeps its lr
        return
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    scheduler = client_lr_scheduler(plan.settings)(optimizer)  # what DeepSpeed's engine steps
    stepped = []
    for _ in range(10):
        stepped.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert stepped == pytest.approx(expected, rel=1e-12, abs=1e-20)


def test_a_pretrained_model_gets_the_hf_trainers_defaults_and_says_where_each_came_from(folder, tmp_path):
    plan = _plan("--model", folder, "--max-steps", "4")
    settings = plan.settings
    assert (settings.lr, settings.weight_decay, settings.scheduler, settings.warmup_steps) == (
        5e-5,
        0.0,
        "linear",
        0,
    )
    first_steps = [lr_at(settings, step) for step in range(4)]
    assert first_steps == pytest.approx([5e-5, 3.75e-5, 2.5e-5, 1.25e-5], rel=1e-12)  # the first at the peak
    assert plan.settings_line == (
        "optimizer adamw: lr 5e-05 (default: the HF Trainer's) | weight decay 0 (default: the HF Trainer's) | "
        "grad clip 1 (default: the HF Trainer's) | schedule linear decay to 0 at step 4, warmup 0 (default: the HF "
        "Trainer's)"
    )
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.5,
                                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": "auto"}}}))  # fmt: skip
    line = _plan("--model", folder, "--deepspeed", str(config), "--weight_decay", "0.1", "--max-steps", "4",
                 "--lr_scheduler_type", "cosine").settings_line  # fmt: skip
    assert f"lr 0.0001 (config {config})" in line and "weight decay 0.1 (--weight-decay)" in line
    assert f"grad clip 0.5 (config {config})" in line and "(--lr-scheduler-type)" in line
    preset = _plan("--model", "tiny", "--max-steps", "10").settings  # from random weights: train.py's own
    assert (preset.lr, preset.scheduler, preset.warmup_steps) == (1e-3, "warmup_cosine", 1)


def test_a_scheduler_block_and_a_schedule_flag_are_one_line(folder, tmp_path):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {}},
                                  "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2}}}))  # fmt: skip
    with pytest.raises(
        UsageError, match=r"--lr-scheduler-type cosine: the DeepSpeed config's scheduler block \(WarmupLR\)"
    ):
        _plan("--model", folder, "--deepspeed", str(config), "--lr_scheduler_type", "cosine")
    with pytest.raises(UsageError, match="--warmup-ratio 1.5 is not below 1"):
        _plan("--model", folder, "--warmup_ratio", "1.5")


def test_a_resume_with_another_horizon_replans_from_the_lr_it_reached(folder, tmp_path):
    settings = _plan("--model", folder, "--max-steps", "8").settings
    saved = {**dataclasses.asdict(dataclasses.replace(settings, total_steps=4))}
    ckpt = tmp_path / "step-00000002"
    longer = resumed_schedule(settings, saved=saved, step=2, ckpt=ckpt)
    old = dataclasses.replace(settings, total_steps=4)
    assert lr_at(longer, 2) == lr_at(old, 2) == 2.5e-5  # no jump at the resumed step
    assert [lr_at(longer, step) for step in range(2, 8)] == pytest.approx(
        [2.5e-5 * (8 - s) / 6 for s in range(2, 8)]
    )
    again = resumed_schedule(dataclasses.replace(settings, total_steps=12), saved=dataclasses.asdict(longer), step=5,
                             ckpt=ckpt)  # fmt: skip
    assert lr_at(again, 5) == pytest.approx(lr_at(longer, 5))  # a second re-plan continues the first
    with pytest.raises(UsageError, match="finished its linear schedule"):
        resumed_schedule(settings, saved=saved, step=4, ckpt=ckpt)
    deepspeed_curve = dict(saved, scheduler="warmup_cosine")
    with pytest.raises(
        UsageError, match="DeepSpeed's schedulers cannot be re-planned; resume with --max-steps 4"
    ):
        resumed_schedule(settings, saved=deepspeed_curve, step=2, ckpt=ckpt)
    assert resumed_schedule(settings, saved=dict(saved, total_steps=8), step=2, ckpt=ckpt) is settings


def test_an_output_dir_holding_a_run_needs_resume_or_overwrite(folder, tmp_path):
    out = tmp_path / "run"
    old = out / "checkpoints" / "step-00000009"
    old.mkdir(parents=True)
    (out / "checkpoints" / "latest").write_text("step-00000009\n")
    (out / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(UsageError) as caught:
        _plan("--model", folder, "--output_dir", str(out))
    assert str(caught.value) == (
        f"--output-dir {str(out)!r} already holds a run (checkpoints, metrics.jsonl); give --resume auto to continue "
        "it, --overwrite-output-dir to start over in it, or another --output-dir"
    )
    _plan("--model", folder, "--output_dir", str(out), "--overwrite_output_dir")
    assert (
        not old.exists() and not (out / "checkpoints" / "latest").exists()
    )  # no stale `latest` or later steps
    (tmp_path / "empty").mkdir()
    _plan("--model", folder, "--output-dir", str(tmp_path / "empty"))


def test_the_hf_trainers_spellings_and_its_arguments_we_do_not_have():
    config = parse_args(["--deepspeed", "ds.json", "--bf16", "--per_device_train_batch_size", "2",
                         "--model_name_or_path", "m", "--warmup_ratio", "0.1", "--lr_scheduler_type", "cosine",
                         "--weight_decay", "0.1", "--max_grad_norm", "0.5", "--logging_steps", "5", "--eval_steps", "7",
                         "--save_total_limit", "2", "--seed", "3", "--overwrite_output_dir", "--output_dir", "o",
                         "--gradient_accumulation_steps", "4", "--num_train_epochs", "2", "--learning_rate", "1e-4",
                         "--gradient_checkpointing", "true", "--disable_tqdm", "true"])  # fmt: skip
    assert (config.engine.deepspeed_config, config.training.precision, config.training.micro_batch_size) == (
        "ds.json", "bf16", 2)  # fmt: skip
    assert (config.model.model, config.optimizer.warmup_ratio, config.optimizer.lr_scheduler_type) == (
        "m",
        0.1,
        "cosine",
    )
    assert (config.optimizer.weight_decay, config.optimizer.grad_clip, config.output.log_every) == (
        0.1,
        0.5,
        5,
    )
    assert (config.evaluation.eval_every, config.checkpoint.save_total_limit, config.training.seed) == (
        7,
        2,
        3,
    )
    assert (config.training.grad_accum, config.training.num_train_epochs, config.optimizer.lr) == (
        4,
        2.0,
        1e-4,
    )
    assert (
        config.output.overwrite_output_dir
        and config.model.gradient_checkpointing
        and not config.output.progress
    )
    assert parse_args(["--fp16", "true"]).training.precision == "fp16"
    assert parse_args(["--bf16", "false"]).training.precision is None  # HF's `--bf16 false`: not asked for
    for argv, words in ((["--do_train"], "--do_train (an HF Trainer argument) is not supported here: training is"),
                        (["--adam_beta1", "0.8"], "set optimizer.params.betas in the DeepSpeed config"),
                        (["--evaluation_strategy", "steps"], "use --eval-every K (--eval_steps K)")):  # fmt: skip
        with pytest.raises(UsageError, match=words.replace("(", r"\(").replace(")", r"\)")):
            parse_args(argv)


def test_config_writes_the_fine_tuning_defaults(capsys, tmp_path):
    from zero_train.cli.main import main

    out = tmp_path / "ds.json"
    with pytest.raises(SystemExit) as done:
        main(["config", "--stage", "2", "--precision", "bf16", "--world-size", "2", "-o", str(out)])
    assert done.value.code == 0
    written = json.loads(pathlib.Path(out).read_text())
    assert (
        written["optimizer"]["params"]["lr"] == 5e-5 and written["optimizer"]["params"]["weight_decay"] == 0.0
    )
    assert "scheduler" not in written  # the run's --lr-scheduler-type (linear) or the Trainer's applies
