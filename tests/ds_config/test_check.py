"""`zero-train config check` on good files (ours, a user's, HF "auto") and on bad ones (every problem listed)."""

from __future__ import annotations

import json

import pytest

from zero_train.cli.main import main
from zero_train.ds_config.check import check_config

pytestmark = pytest.mark.tier("quick")

HF_DOCS_ZERO3 = {  # the ZeRO-3 example of the HF Trainer's DeepSpeed docs
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {
        "stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True}, "overlap_comm": True, "contiguous_gradients": True,
        "sub_group_size": 1e9, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False,
}  # fmt: skip


def run_check(tmp_path, capsys, cfg, *extra):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["config", "check", str(path), *extra])
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def test_hf_docs_config_is_valid_with_autos_listed(tmp_path, capsys):
    code, out, err = run_check(tmp_path, capsys, HF_DOCS_ZERO3, "--world-size", "8")
    assert code == 0, err
    assert "valid DeepSpeed config" in out and "ZeRO-3" in out
    assert '"auto" (15' in out and "offload: optimizer -> cpu, param -> cpu" in out


def test_batch_algebra_for_world_size(tmp_path, capsys):
    cfg = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}
    assert run_check(tmp_path, capsys, cfg, "--world-size", "8")[0] == 0
    code, _, err = run_check(tmp_path, capsys, cfg, "--world-size", "4")
    assert code == 2
    assert (
        "train_batch_size 64 != train_micro_batch_size_per_gpu 4 * gradient_accumulation_steps 2 * world_size 4 = 32"
        in err
    )
    code, out, _ = run_check(tmp_path, capsys, cfg)  # without a world size: the file implies 8
    assert code == 0 and "train_batch_size 64" in out


def test_every_problem_listed_each_on_its_own_line(tmp_path, capsys):
    bad = {
        "train_batch_size": 60, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
        "zero_optimisation": {"stage": 2},
        "fp16": {"enabled": True}, "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}, "reduce_bucket_sise": 5},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}},
        "sub_group_size": 1e9,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "foo": "auto"}},
    }  # fmt: skip
    code, out, err = run_check(tmp_path, capsys, bad, "--world-size", "8")
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and out == "" and "Traceback" not in err
    expected = [
        "did you mean 'zero_optimization'?",
        "unknown key zero_optimization.reduce_bucket_sise (DeepSpeed refuses it); did you mean 'reduce_bucket_size'?",
        "fp16.enabled and bf16.enabled are both true",
        "offload_param needs stage 3",
        "WarmupDecayLR needs params.total_num_steps",
        "'sub_group_size' belongs inside zero_optimization",
        'optimizer.params.foo is "auto" but neither the HF Trainer nor zero_train fills it',
        "= 64; set train_batch_size to 64",
    ]
    for words in expected:
        assert sum(words in line for line in errors) == 1, (words, errors)
    assert errors[-1].endswith("8 problems found; fix them and run `zero-train config check` again")
    assert len(errors) == len(expected) + 1


def test_deepspeed_config_class_rejections_are_reported(tmp_path, capsys):
    """A rule only DeepSpeedConfig knows: optimizer max_grad_norm, and values its pydantic models refuse."""
    report = check_config({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 5}})
    assert any(
        "zero_optimization.stage" in problem and "DeepSpeedZeroConfig" in problem
        for problem in report.problems
    )
    report = check_config({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True, "bogus_key": 1}})
    assert report.problems and report.problems[0].startswith("DeepSpeed rejects the config:"), report.problems


def test_ignored_keys_are_warnings_not_errors(tmp_path, capsys):
    cfg = {"train_micro_batch_size_per_gpu": 2,
           "zero_optimization": {"stage": 2, "stage3_prefetch_bucket_size": 100}}  # fmt: skip
    code, out, err = run_check(tmp_path, capsys, cfg)
    assert code == 0 and "warning: zero_optimization.stage3_prefetch_bucket_size is ignored at stage 2" in err


def test_shipped_configs_are_valid():
    import pathlib

    for path in sorted((pathlib.Path(__file__).resolve().parents[2] / "ds_configs").glob("*.json")):
        report = check_config(json.loads(path.read_text()), world_size=2)
        assert report.problems == [] and report.warnings == [], (path.name, report)
