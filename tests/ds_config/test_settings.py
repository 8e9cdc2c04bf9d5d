"""TrainSettings, "auto" filling and lr_at, against DeepSpeed's own classes and the HF Trainer's rules."""

from __future__ import annotations

import copy
import itertools
import json
import warnings

import pytest
import torch

from zero_train.ds_config import TrainSettings, load_config, lr_at, resolve_auto, train_settings
from zero_train.runtime.errors import UsageError

pytestmark = pytest.mark.tier("quick")

HF_AUTO = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
    },
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_num_steps": "auto",
            "total_num_steps": "auto",
        },
    },
    "bf16": {"enabled": "auto"},
    "zero_optimization": {
        "stage": 3,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
    },
}


def _schedulers():
    """(DeepSpeed scheduler class name, its params) covering log/linear warmup, decay, cosine, clamping."""
    yield (
        "WarmupLR",
        {"warmup_min_lr": 1e-4, "warmup_max_lr": 3e-3, "warmup_num_steps": 5, "warmup_type": "log"},
    )
    yield (
        "WarmupLR",
        {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-3, "warmup_num_steps": 1, "warmup_type": "linear"},
    )
    yield (
        "WarmupDecayLR",
        {
            "warmup_min_lr": 1e-4,
            "warmup_max_lr": 2e-3,
            "warmup_num_steps": 4,
            "total_num_steps": 12,
            "warmup_type": "linear",
        },
    )
    yield "WarmupDecayLR", {"total_num_steps": 9, "warmup_num_steps": 3}  # log warmup, default max 0.001
    yield (
        "WarmupCosineLR",
        {
            "total_num_steps": 15,
            "warmup_num_steps": 4,
            "warmup_min_ratio": 0.1,
            "cos_min_ratio": 0.05,
            "warmup_type": "linear",
        },
    )
    yield "WarmupCosineLR", {"total_num_steps": 10, "warmup_num_steps": 3}


@pytest.mark.filterwarnings("ignore:optimizer.params.lr")
@pytest.mark.parametrize("kind,params", list(_schedulers()))
def test_lr_at_equals_deepspeed_scheduler_step_by_step(kind, params):
    from deepspeed.runtime import lr_schedules

    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 2.5e-3}},  # noqa: E501
        "scheduler": {"type": kind, "params": params},
    }
    settings = train_settings(cfg, world_size=1)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.5e-3)
    scheduler = getattr(lr_schedules, kind)(optimizer, **params)
    deepspeed_lrs, ours = [], []
    for step in range(params.get("total_num_steps", 8) + 4):  # past the end: the floor must hold
        deepspeed_lrs.append(optimizer.param_groups[0]["lr"])
        ours.append(lr_at(settings, step))
        scheduler.step()
    assert ours == deepspeed_lrs  # exact floats, not approximately
    assert len(set(ours)) > 2  # a real curve


def test_no_scheduler_is_constant_optimizer_lr():
    settings = train_settings(
        {"train_batch_size": 8, "optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}},
        world_size=2,
    )
    assert settings.optimizer == "sgd" and settings.momentum == 0.9 and settings.scheduler == "constant"
    assert (settings.micro_batch_size, settings.grad_accum) == (4, 1)
    assert [lr_at(settings, k) for k in range(3)] == [0.1, 0.1, 0.1]


def test_deepspeed_defaults_applied():
    settings = train_settings(
        {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "Adam", "params": {}}}, world_size=3
    )
    assert settings.train_batch_size == 6
    assert settings.grad_clip == 1.0  # DeepSpeed clips at 1.0 unless told otherwise
    assert settings.optimizer == "adamw"  # DeepSpeed's "Adam" is AdamW unless adam_w_mode is false
    assert settings.precision == "fp32" and settings.zero_stage == 0
    plain = train_settings(
        {
            "train_micro_batch_size_per_gpu": 2,
            "optimizer": {"type": "Adam", "params": {"adam_w_mode": False}},
        },
        world_size=1,
    )
    assert plain.optimizer == "adam"


@pytest.mark.filterwarnings(
    "ignore:warmup_steps=0 still warms up"
)  # as under the HF Trainer: said, tested below
def test_hf_auto_filled_like_the_trainer():
    settings = train_settings(
        HF_AUTO,
        world_size=4,
        micro_batch_size=2,
        grad_accum=3,
        lr=5e-4,
        warmup_steps=0,
        total_steps=100,
        precision="bf16",
        hidden_size=64,
    )
    assert settings.train_batch_size == 24 and settings.precision == "bf16"
    assert settings.betas == (0.9, 0.999) and settings.eps == 1e-8 and settings.weight_decay == 0.0
    assert settings.warmup_steps == 1  # HF keeps an auto warmup positive (DeepSpeed rejects 0)
    resolved = resolve_auto(HF_AUTO, settings)
    assert "auto" not in json.dumps(resolved)
    assert resolved["train_batch_size"] == 24 and resolved["bf16"] == {"enabled": True}
    assert resolved["scheduler"]["params"] == {
        "warmup_min_lr": 0,
        "warmup_max_lr": 5e-4,
        "warmup_num_steps": 1,
        "total_num_steps": 100,
    }
    zero = resolved["zero_optimization"]
    assert (
        zero["reduce_bucket_size"],
        zero["stage3_prefetch_bucket_size"],
        zero["stage3_param_persistence_threshold"],
    ) == (64 * 64, int(0.9 * 64 * 64), 640)
    assert train_settings(resolved, world_size=4, hidden_size=64) == settings  # resolving is a fixed point
    assert HF_AUTO["train_batch_size"] == "auto"  # the input is not modified


def test_resolved_config_accepted_by_deepspeed_config():
    from deepspeed.runtime.config import DeepSpeedConfig

    settings = train_settings(
        HF_AUTO, world_size=1, micro_batch_size=2, lr=1e-3, warmup_steps=2, total_steps=10, hidden_size=32
    )
    ds = DeepSpeedConfig(resolve_auto(HF_AUTO, settings))  # no process group: world size 1
    assert (ds.train_batch_size, ds.gradient_accumulation_steps, ds.gradient_clipping) == (2, 1, 1.0)


def test_given_argument_fills_keys_the_config_leaves_out():
    cfg = {"train_batch_size": "auto", "scheduler": {"type": "WarmupLR", "params": {}}}
    settings = train_settings(cfg, world_size=2, micro_batch_size=3, grad_clip=0.25, lr=0.01, warmup_steps=7)
    resolved = resolve_auto(cfg, settings)
    assert resolved["gradient_clipping"] == 0.25 and resolved["train_micro_batch_size_per_gpu"] == 3
    assert resolved["scheduler"]["params"]["warmup_max_lr"] == 0.01
    assert settings.warmup_steps == 7 and settings.train_batch_size == 6


@pytest.mark.parametrize(
    "change,kwargs,words",
    [
        (
            {"train_micro_batch_size_per_gpu": 4},
            {"micro_batch_size": 2},
            ["train_micro_batch_size_per_gpu=4", "--micro-batch-size"],
        ),
        ({"gradient_clipping": 1.0}, {"grad_clip": 0.5}, ["gradient_clipping=1.0", "grad_clip=0.5"]),
        ({"bf16": {"enabled": True}}, {"precision": "fp16"}, ["bf16", "'fp16'"]),
        ({}, {"precision": "fp32", "lr": 1e-3, "micro_batch_size": 1}, ["precision"]),
    ],
)
def test_concrete_value_disagreeing_with_argument_names_both(change, kwargs, words):
    cfg = copy.deepcopy(HF_AUTO) | {"bf16": {"enabled": True}} | change
    with pytest.raises(UsageError) as err:
        train_settings(cfg, world_size=1, **kwargs)
    assert all(word in str(err.value) for word in words), str(err.value)


def test_unresolvable_auto_names_key_and_flag():
    with pytest.raises(UsageError, match=r"optimizer.params.lr \(pass --lr\)"):
        train_settings(
            HF_AUTO, world_size=1, micro_batch_size=1, warmup_steps=1, total_steps=5, hidden_size=8
        )
    with pytest.raises(UsageError, match="reduce_bucket_size.*--model"):
        train_settings(HF_AUTO, world_size=1, micro_batch_size=1, lr=1e-3, warmup_steps=1, total_steps=5)


def test_batch_algebra_shows_the_arithmetic():
    cfg = {"train_batch_size": 60, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}
    with pytest.raises(UsageError, match=r"train_batch_size 60 != .* 4 \* .* 2 \* world_size 8 = 64"):
        train_settings(cfg, world_size=8)
    with pytest.raises(UsageError, match=r"not divisible by .* 4 \* world_size 8 = 32"):
        train_settings({"train_batch_size": 60, "train_micro_batch_size_per_gpu": 4}, world_size=8)


def test_train_settings_post_init_rejects_nonsense():
    base = dict(micro_batch_size=2, grad_accum=1, world_size=2, train_batch_size=4)
    TrainSettings(**base)
    for bad in (
        {"precision": "fp8"},
        {"train_batch_size": 5},
        {"zero_stage": 4},
        {"offload_param": "cpu"},
        {"scheduler": "warmup_linear"},
    ):
        with pytest.raises(UsageError):
            TrainSettings(**(base | bad))


def test_load_config_errors(tmp_path):
    (tmp_path / "ok.json").write_text('{"train_batch_size": 8}')
    assert load_config(tmp_path / "ok.json") == {"train_batch_size": 8}
    (tmp_path / "bad.json").write_text('{"train_batch_size": 8,}')
    (tmp_path / "list.json").write_text("[1, 2]")
    for name, words in (
        ("missing.json", "does not exist"),
        ("bad.json", r"not valid JSON \(line 1"),
        ("list.json", "holds a JSON list"),
        ("", "is a directory"),
    ):
        with pytest.raises(UsageError, match=words):
            load_config(tmp_path / name)


def test_every_field_documented():
    import dataclasses
    import inspect

    source = inspect.getsource(TrainSettings)
    for field in dataclasses.fields(TrainSettings):
        assert f"    {field.name}:" in source
    assert list(itertools.islice((f.name for f in dataclasses.fields(TrainSettings)), 2)) == [
        "zero_stage",
        "precision",
    ]


def test_warmup_without_scheduler_warns():
    with pytest.warns(UserWarning, match="warmup_steps=5 is not used"):
        settings = train_settings({"train_micro_batch_size_per_gpu": 1}, world_size=1, warmup_steps=5)
    assert settings.scheduler == "constant"


def test_the_key_table_holds_deepspeeds_own_defaults():
    """Every plain `deepspeed` default in zero_train.ds_config.keys is DeepSpeed's own (its constants, its ZeRO
    pydantic model, its scheduler signatures), and every "auto" key is one the HF Trainer fills."""
    import inspect

    import deepspeed.runtime.constants as ds
    from deepspeed.runtime import lr_schedules
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    from zero_train.ds_config.keys import AUTO_KEYS, KEYS, deepspeed_default

    zero = DeepSpeedZeroConfig()
    cosine = inspect.signature(lr_schedules.WarmupCosineLR).parameters
    warmup = inspect.signature(lr_schedules.WarmupLR).parameters
    theirs = {
        "gradient_clipping": ds.GRADIENT_CLIPPING_DEFAULT,
        "fp16.enabled": ds.FP16_ENABLED_DEFAULT,
        "fp16.loss_scale": ds.FP16_LOSS_SCALE_DEFAULT,
        "fp16.initial_scale_power": ds.FP16_INITIAL_SCALE_POWER_DEFAULT,
        "fp16.loss_scale_window": ds.FP16_LOSS_SCALE_WINDOW_DEFAULT,
        "fp16.hysteresis": ds.FP16_HYSTERESIS_DEFAULT,
        "fp16.min_loss_scale": ds.FP16_MIN_LOSS_SCALE_DEFAULT,
        "bf16.enabled": ds.BFLOAT16_ENABLED_DEFAULT,
        "zero_optimization.stage": int(zero.stage),
        "zero_optimization.reduce_bucket_size": zero.reduce_bucket_size,
        "zero_optimization.allgather_bucket_size": zero.allgather_bucket_size,
        "zero_optimization.stage3_prefetch_bucket_size": zero.prefetch_bucket_size,
        "zero_optimization.stage3_param_persistence_threshold": zero.param_persistence_threshold,
        "zero_optimization.stage3_max_live_parameters": zero.max_live_parameters,
        "zero_optimization.stage3_gather_16bit_weights_on_model_save": zero.gather_16bit_weights_on_model_save,
        "scheduler.params.warmup_min_lr": warmup["warmup_min_lr"].default,
        "scheduler.params.warmup_num_steps": warmup["warmup_num_steps"].default,
        "scheduler.params.warmup_type": warmup["warmup_type"].default,
        "scheduler.params.warmup_min_ratio": cosine["warmup_min_ratio"].default,
        "scheduler.params.cos_min_ratio": cosine["cos_min_ratio"].default,
    }
    for path, value in theirs.items():
        assert deepspeed_default(path) == value, path
    assert inspect.signature(lr_schedules.WarmupDecayLR).parameters["warmup_max_lr"].default == 0.001
    # the HF integration's "auto" keys (transformers/integrations/deepspeed.py trainer_config_process/finalize)
    assert set(AUTO_KEYS) == {key.path for key in KEYS if key.fills} and len(AUTO_KEYS) == 17


def _deepspeed_lrs(cfg: dict, steps: int) -> list[float]:
    """The lr of each of the first `steps` optimizer steps under DeepSpeed's own scheduler class."""
    from deepspeed.runtime import lr_schedules

    scheduler = cfg["scheduler"]
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg["optimizer"]["params"]["lr"])
    built = getattr(lr_schedules, scheduler["type"])(optimizer, **scheduler["params"])
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        built.step()
    return lrs


@pytest.mark.parametrize("kind", ["warmup_constant", "warmup_linear", "warmup_cosine"])
def test_warmup_zero_starts_every_generated_schedule_at_its_peak(kind):
    from zero_train.ds_config.generate import ConfigRequest, generate_config

    def config(warmup: int) -> dict:
        return generate_config(
            ConfigRequest(stage=1, scheduler=kind, warmup_steps=warmup, total_steps=10, lr=2e-3)
        )

    none, some = config(0), config(3)
    lrs, with_warmup = _deepspeed_lrs(none, 10), _deepspeed_lrs(some, 10)
    # DeepSpeed's WarmupCosineLR runs the step before its first scheduler.step() at lr 0, warmup or not
    first = 1 if kind == "warmup_cosine" else 0
    assert lrs[first] == 2e-3 == max(lrs) and with_warmup[first + 1] < 2e-3  # peak at once vs ramping up
    assert lrs[first:] == sorted(lrs[first:], reverse=True)  # from the peak it only decays
    settings = train_settings(none, world_size=1, warmup_steps=0)
    assert [lr_at(settings, step) for step in range(10)] == lrs  # the local engines follow the same curve


def test_warmup_zero_with_a_config_that_still_warms_up_warns():
    cfg = copy.deepcopy(HF_AUTO)  # WarmupDecayLR from warmup_min_lr "auto" (0, as the HF Trainer fills it)
    with pytest.warns(
        UserWarning, match="warmup_steps=0 still warms up: DeepSpeed's WarmupDecayLR takes at least 2"
    ):
        settings = train_settings(
            cfg, world_size=1, micro_batch_size=1, lr=1e-3, warmup_steps=0, total_steps=8, hidden_size=16
        )
    # the curve DeepSpeed will run, not hidden
    assert settings.warmup_steps == 1 and lr_at(settings, 1) == 0.0
    constant = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warmup asked, none there: nothing to say
        assert train_settings(constant, world_size=1, warmup_steps=0).scheduler == "constant"
    with pytest.warns(UserWarning, match="warmup_steps=3 is not used: the config has no scheduler section"):
        train_settings(constant, world_size=1, warmup_steps=3)


def test_gradient_dtypes_default_to_fp32_and_follow_deepspeeds_keys():
    from zero_train.ds_config.parse import gradient_dtypes, reduce_bucket_elements

    bf16 = {"bf16": {"enabled": True}}
    assert gradient_dtypes(bf16) == ("fp32", "fp32")  # DeepSpeed would keep bf16 for both
    assert gradient_dtypes({**bf16, "data_types": {"grad_accum_dtype": "bfloat16"}}) == ("bf16", "bf16")
    assert gradient_dtypes({**bf16, "communication_data_type": "bf16"}) == ("fp32", "bf16")
    assert gradient_dtypes({"data_types": {"grad_accum_dtype": "torch.float16"}}) == ("fp16", "fp16")
    for bad in ({"communication_data_type": "float32"}, {"data_types": {"grad_accum_dtype": "int8"}}):
        with pytest.raises(UsageError, match="use one of fp32, bf16, fp16"):
            gradient_dtypes(bad)
    assert reduce_bucket_elements({}) is None
    assert reduce_bucket_elements({"zero_optimization": {"reduce_bucket_size": "auto"}}) is None
    assert reduce_bucket_elements({"zero_optimization": {"reduce_bucket_size": 5e7}}) == 50_000_000
    with pytest.raises(UsageError, match="reduce_bucket_size is 0"):
        reduce_bucket_elements({"zero_optimization": {"reduce_bucket_size": 0}})
