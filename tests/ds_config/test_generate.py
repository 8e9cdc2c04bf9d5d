"""`zero-train config` output: the issue's example, honest keys per stage, --model buckets, --hf-auto,
and DeepSpeed's own config classes accepting every stage/precision/offload combination."""

from __future__ import annotations

import itertools
import json
import shlex

import pytest

from zero_train.cli.main import main

pytestmark = pytest.mark.tier("quick")


def generate(capsys, *argv: str) -> dict:
    capsys.readouterr()  # drop anything logged before (DeepSpeed logs to stdout)
    with pytest.raises(SystemExit) as exit_info:
        main(["config", *argv])
    captured = capsys.readouterr()
    assert exit_info.value.code == 0, captured.err
    return json.loads(captured.out)


def test_issue_example_gives_train_batch_size_64(capsys):
    cfg = generate(capsys, "--stage", "3", "--precision", "bf16", "--offload-optimizer", "cpu",
                   "--micro-batch-size", "4", "--grad-accum", "2", "--world-size", "8")  # fmt: skip
    assert cfg["train_batch_size"] == 64 == 4 * 2 * 8
    assert cfg["bf16"] == {"enabled": True} and "fp16" not in cfg
    zero = cfg["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"] == {"device": "cpu"}
    assert "torch_adam" not in cfg["optimizer"]["params"]  # cpu offload runs DeepSpeedCPUAdam


def test_global_batch_size_derives_world_size_and_checks_triple(capsys):
    cfg = generate(capsys, "--micro-batch-size", "2", "--grad-accum", "4", "--global-batch-size", "32")
    assert (cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (
        32, 2, 4)  # fmt: skip
    without_world = generate(capsys, "--micro-batch-size", "2")
    assert "train_batch_size" not in without_world  # DeepSpeed derives it from the launch world size


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_only_keys_deepspeed_reads_at_that_stage(capsys, stage):
    zero = generate(capsys, "--stage", str(stage))["zero_optimization"]
    stage3_keys = {k for k in zero if k.startswith("stage3_")}
    assert zero["stage"] == stage
    if stage == 0:
        assert zero == {"stage": 0}
    elif stage in (1, 2):
        assert not stage3_keys and "offload_param" not in zero and "allgather_bucket_size" in zero
        assert zero["overlap_comm"] is False  # DeepSpeed's default below stage 3
    else:
        assert "allgather_bucket_size" not in zero  # ZeRO-3 prefetches instead
        assert stage3_keys == {
            "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold", "stage3_max_live_parameters",
            "stage3_gather_16bit_weights_on_model_save"}  # fmt: skip


def test_model_sizes_buckets_like_the_hf_integration(capsys):
    from zero_train.cli.config import model_hidden_size

    hidden = model_hidden_size("tiny")
    zero = generate(capsys, "--stage", "3", "--model", "tiny")["zero_optimization"]
    assert zero["reduce_bucket_size"] == hidden * hidden
    assert zero["stage3_prefetch_bucket_size"] == int(0.9 * hidden * hidden)
    assert zero["stage3_param_persistence_threshold"] == 10 * hidden
    explicit = generate(capsys, "--stage", "2", "--model", "tiny", "--reduce-bucket-size", "5e6")
    assert explicit["zero_optimization"]["reduce_bucket_size"] == 5_000_000  # a flag beats the model default


def test_hf_auto_matches_what_the_trainer_fills(capsys):
    from zero_train.ds_config.auto import auto_keys
    from zero_train.ds_config.keys import AUTO_KEYS

    cfg = generate(capsys, "--stage", "3", "--hf-auto")
    autos = set(auto_keys(cfg))
    # every key the HF Trainer fills, nothing it does not; no scheduler block: the Trainer's own scheduler
    assert autos == {key for key in AUTO_KEYS if not key.startswith("scheduler.")} and "scheduler" not in cfg
    # save_model() writes the weights
    assert cfg["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    scheduled = generate(capsys, "--stage", "3", "--hf-auto", "--scheduler", "warmup_linear")
    assert set(auto_keys(scheduled)) == set(AUTO_KEYS)  # a scheduler asked for: DeepSpeed's, HF-filled
    given = generate(capsys, "--stage", "2", "--hf-auto", "--lr", "1e-4", "--micro-batch-size", "2")
    assert given["optimizer"]["params"]["lr"] == 1e-4 and given["train_micro_batch_size_per_gpu"] == 2
    assert given["zero_optimization"]["reduce_bucket_size"] == "auto"


def test_hf_auto_config_goes_through_the_hf_integration(capsys):
    """transformers' own HfTrainerDeepSpeedConfig fills our --hf-auto output completely."""
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    cfg = generate(capsys, "--stage", "3", "--hf-auto")
    # a ZeRO-3 HfDeepSpeedConfig switches transformers' process-wide zero3 flag on (a weak reference that
    # a reference cycle keeps alive until the next gc): every from_config after it, in any later test of
    # this worker, would go through deepspeed.zero.Init, so it is unset before the test ends
    hf = HfTrainerDeepSpeedConfig(cfg)
    try:
        args = TrainingArguments(output_dir="/tmp/unused", per_device_train_batch_size=2, learning_rate=1e-3,
                                 bf16=True, use_cpu=True, report_to=[])  # fmt: skip
        hf.trainer_config_process(args)
        model = type("Model", (), {"config": type("Config", (), {"hidden_size": 16})()})()
        hf.trainer_config_finalize(args, model, num_training_steps=10)
    finally:
        unset_hf_deepspeed_config()
    assert "auto" not in json.dumps(hf.config)
    assert (
        hf.config["bf16"]["enabled"] is True and hf.config["zero_optimization"]["reduce_bucket_size"] == 256
    )


def test_optimizer_and_schedule_flags(capsys):
    sgd = generate(capsys, "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.1")
    assert sgd["optimizer"] == {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0}}
    assert sgd["zero_allow_untested_optimizer"] is True
    adam = generate(capsys, "--optimizer", "adam", "--betas", "0.9,0.95", "--warmup-steps", "10")
    assert adam["optimizer"]["params"]["adam_w_mode"] is False  # DeepSpeed's "Adam" is AdamW otherwise
    assert adam["optimizer"]["params"]["betas"] == [0.9, 0.95]
    assert adam["scheduler"]["type"] == "WarmupLR" and adam["scheduler"]["params"]["warmup_num_steps"] == 10
    cosine = generate(capsys, "--scheduler", "warmup_cosine", "--max-steps", "100", "--min-lr-ratio", "0.1")
    assert cosine["scheduler"]["params"]["cos_min_ratio"] == 0.1
    assert "warmup_max_lr" not in cosine["scheduler"]["params"]  # WarmupCosineLR has no such parameter
    fp16 = generate(capsys, "--precision", "fp16", "--initial-scale-power", "12")
    assert fp16["fp16"]["initial_scale_power"] == 12 and fp16["fp16"]["loss_scale"] == 0
    assert "scheduler" not in generate(capsys, "--warmup-steps", "0")  # no warmup, no decay: a constant lr
    no_warmup = generate(capsys, "--scheduler", "warmup_linear", "--warmup-steps", "0", "--max-steps", "10")
    assert no_warmup["scheduler"]["params"]["warmup_num_steps"] == 1  # DeepSpeed's least, as HF fills it


def test_generated_schedule_is_what_train_settings_reads(capsys):
    from zero_train.ds_config import lr_at, train_settings

    cfg = generate(capsys, "--lr", "2e-3", "--warmup-steps", "4", "--max-steps", "20", "--micro-batch-size", "2",
                   "--grad-accum", "3", "--world-size", "2", "--grad-clip", "0.5", "--weight-decay", "0.1")  # fmt: skip
    settings = train_settings(cfg, world_size=2)
    assert (settings.lr, settings.warmup_steps, settings.total_steps, settings.grad_clip) == (
        2e-3,
        4,
        20,
        0.5,
    )
    assert (settings.train_batch_size, settings.weight_decay, settings.scheduler) == (
        12,
        0.1,
        "warmup_linear",
    )
    assert lr_at(settings, 5) == 2e-3 and lr_at(settings, 0) == 0.0


STAGES, PRECISIONS, OFFLOADS = ("0", "1", "2", "3"), ("fp32", "bf16", "fp16"), ("none", "cpu")


def test_every_combination_passes_deepspeeds_config_classes_and_our_check(capsys):
    from deepspeed.runtime.config import DeepSpeedConfig

    from zero_train.ds_config.check import check_config

    checked = 0
    for stage, precision, offload in itertools.product(STAGES, PRECISIONS, OFFLOADS):
        if offload != "none" and stage == "0":
            continue
        flags = [
            "--stage",
            stage,
            "--precision",
            precision,
            "--offload-optimizer",
            offload,
            "--world-size",
            "1",
        ]
        if stage == "3":
            flags += ["--offload-param", offload]
        cfg = generate(capsys, *flags)
        ds = DeepSpeedConfig(cfg)  # raises on anything DeepSpeed rejects
        assert ds.zero_optimization_stage == int(stage) and ds.bfloat16_config.enabled == (
            precision == "bf16"
        )
        assert ds.float16_config.enabled == (precision == "fp16")
        report = check_config(cfg, world_size=1)
        assert report.problems == [] and report.warnings == [], (flags, report)
        checked += 1
    assert checked == 21


def _help_examples(text: str) -> list[list[str]]:
    """The `zero-train config ...` command lines of a help text, continuation lines joined, comments dropped."""
    joined = text.replace("\\\n", " ")
    return [
        shlex.split(line.split("#")[0])[1:]
        for line in joined.splitlines()
        if line.strip().startswith("zero-train config")
    ]


def test_every_example_of_the_help_runs_as_printed(tmp_path, monkeypatch, capsys):
    from zero_train.cli import config as config_cli
    from zero_train.cli.main import main

    monkeypatch.chdir(tmp_path)
    examples = _help_examples(config_cli.__doc__)
    assert len(examples) == 6
    for argv in examples:
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0, (argv, capsys.readouterr().err)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["accel.json", "accel.yaml", "ds.json"]
