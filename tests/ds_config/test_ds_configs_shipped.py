"""Every file in ds_configs/ is exactly the generator's output for the command in ds_configs/README.md, and
DeepSpeed accepts it: deepspeed.initialize + one training step on a tiny model, all files in ONE spawned CPU
process (the cpu-offload files JIT-build DeepSpeedCPUAdam once, ~40 s on 2 cores, cached afterwards). The
offload files' host buffers, as zero_train.engines.deepspeed_offload reads them, hold the ZeRO paper's bytes."""

from __future__ import annotations

import json
import pathlib
import re
import shlex

import pytest

from zero_train.cli.main import main
from zero_train.testing import run_ranks

pytestmark = pytest.mark.tier("multiproc")

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO_ROOT / "ds_configs"
# what `hf_auto` files get from the launcher's flags when they are resolved
HF_ARGS = dict(micro_batch_size=2, lr=1e-3, warmup_steps=1, total_steps=10, hidden_size=16)
PSI = 8 * 16 + 16 + 16 * 4 + 4  # the MLP's parameters (Linear(8, 16), Linear(16, 4)), counted by hand
LARGEST = 8 * 16  # elements of its largest tensor, the weight of Linear(8, 16)


def documented_commands() -> dict[str, list[str]]:
    """file name -> argv of the `zero-train config ... -o ds_configs/FILE` command in the README table."""
    commands = {}
    for command in re.findall(r"`(zero-train config [^`]*)`", (CONFIG_DIR / "README.md").read_text()):
        argv = shlex.split(command)[1:]
        if "-o" in argv:
            commands[pathlib.Path(argv[argv.index("-o") + 1]).name] = argv
    return commands


@pytest.mark.tier("quick")
def test_every_shipped_file_is_documented_and_regenerates_exactly(tmp_path):
    commands = documented_commands()
    assert sorted(commands) == sorted(p.name for p in CONFIG_DIR.glob("*.json"))
    assert len(commands) >= 8
    for name, argv in commands.items():
        out = tmp_path / name
        argv = [*argv[: argv.index("-o") + 1], str(out), *argv[argv.index("-o") + 2 :]]
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 0
        assert out.read_text() == (CONFIG_DIR / name).read_text(), f"{name} differs from: zero-train {argv}"


def _initialize_every_config(rank: int, world_size: int, configs: dict[str, dict]) -> dict[str, dict]:
    """deepspeed.initialize + one step per config on a 2-layer MLP; what DeepSpeed made of each."""
    import os

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import torch
    from deepspeed.accelerator import get_accelerator

    from zero_train.ds_config import resolve_auto, train_settings
    from zero_train.engines.deepspeed_offload import offload_buffers

    deepspeed.init_distributed(dist_backend="gloo")
    results = {}
    for name, cfg in configs.items():
        settings = train_settings(
            cfg, world_size=world_size, **(HF_ARGS if "auto" in json.dumps(cfg) else {})
        )
        resolved = resolve_auto(cfg, settings)
        if settings.precision == "fp16" and not get_accelerator().is_fp16_supported():
            results[name] = {"skipped": "this CPU has no fp16 support in DeepSpeed"}
            continue
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        engine, optimizer, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=resolved
        )
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(settings.precision, torch.float32)
        before = [p.detach().clone().float() for p in engine.module.parameters()]
        for _ in range(engine.gradient_accumulation_steps()):
            loss = (
                engine(torch.randn(engine.train_micro_batch_size_per_gpu(), 8, dtype=dtype))
                .float()
                .pow(2)
                .mean()
            )
            engine.backward(loss)
            engine.step()
        moved = any(
            not torch.equal(b, p.detach().float())
            for b, p in zip(before, engine.module.parameters(), strict=True)
            if p.numel()
        )
        inner = getattr(optimizer, "optimizer", optimizer)
        results[name] = {
            "stage": engine.zero_optimization_stage(),
            "train_batch_size": engine.train_batch_size(),
            "bf16": engine.bfloat16_enabled(),
            "offload_optimizer": engine.zero_cpu_offload(),
            "optimizer_class": type(inner).__name__,
            "loss_finite": bool(torch.isfinite(loss)),
            "params_changed": moved,  # tiny ZeRO-3 params stay whole (below the persistence threshold)
            "offload_buffers": offload_buffers(engine) if engine.zero_cpu_offload() else None,
        }
        del engine, optimizer
    return results


def test_deepspeed_initializes_every_shipped_config():
    configs = {p.name: json.loads(p.read_text()) for p in sorted(CONFIG_DIR.glob("*.json"))}
    results = run_ranks(_initialize_every_config, 1, (configs,), timeout_s=600)[0]
    for name, cfg in configs.items():
        result = results[name]
        if "skipped" in result:
            assert cfg.get("fp16", {}).get("enabled") is True  # only fp16 may be skipped (CPU)
            continue
        zero = cfg["zero_optimization"]
        offloaded = "offload_optimizer" in zero
        assert result["stage"] == zero["stage"], name
        assert result["train_batch_size"] == 2, name  # micro 2 x accumulation 1 x 1 rank
        assert result["bf16"] == (cfg.get("bf16", {}).get("enabled") is True), name
        assert result["offload_optimizer"] == offloaded, name
        assert result["optimizer_class"] == ("DeepSpeedCPUAdam" if offloaded else "AdamW"), name
        assert result["loss_finite"] and result["params_changed"], name
        if offloaded:
            _assert_offload_bytes(result, zero)


def _assert_offload_bytes(result: dict, zero: dict) -> None:
    """What DeepSpeed holds on the host for an offloaded optimizer, 1 rank, fp32 (every shipped offload file):
    fp32 masters and their gradients at 4 bytes per parameter, Adam's two moments at 8 (the ZeRO paper's K = 12
    moved to the host), ZeRO-2's fp32 parameter copy and, on host and device alike, a gradient staging buffer of
    the largest tensor; ZeRO-3's gradient partitions, and its parameters where offload_param says so."""
    assert not result["bf16"], "a bf16 offload file: its 16-bit copies hold 2 bytes a parameter, say so here"
    host, device = result["offload_buffers"]["host"], result["offload_buffers"]["device"]
    expected = dict(master_params=4 * PSI, fp32_grads=4 * PSI, optimizer_states=8 * PSI)
    if zero["stage"] == 3:
        expected.update(grads=4 * PSI, **({"params": 4 * PSI} if "offload_param" in zero else {}))
        assert (host, device) == (expected, {})
    else:
        expected.update(param_copy=4 * PSI, grad_staging_buffer=4 * LARGEST)
        assert (host, device) == (expected, {"offload_grad_buffer": 4 * LARGEST})
