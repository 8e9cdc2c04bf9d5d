"""The HF Trainer with our DeepSpeed configs: `TrainingArguments(deepspeed=...)` as docs/launch.md shows it.

On the tiny preset, fp32, CPU ranks:
1. ZeRO-3 with ds_configs/zero3_hf_auto.json (`zero-train config --stage 3 --hf-auto`), 2 ranks: the lr the
   Trainer logs is its own cosine schedule with warmup_steps=0 (the config has no scheduler block to replace
   it), and `save_model()` writes weights that `from_pretrained` loads equal to the trained ones gathered from
   both ranks' shards;
2. ZeRO-2 with `zero-train config --stage 2 --hf-auto`, 1 process: the same with a linear schedule, warmup 2,
   gradient accumulation;
3. `zero-train plan --hf-auto` writes a JSON that transformers' own HfTrainerDeepSpeedConfig fills without a
   "mismatch TrainingArguments" error from the TrainingArguments plan prints.
"""

from __future__ import annotations

import json
import pathlib
import re

import pytest
import torch

from zero_train.cli.main import main
from zero_train.testing import run_ranks

pytestmark = pytest.mark.tier("multiproc")

REPO = pathlib.Path(__file__).resolve().parents[2]
VOCAB = 8192  # the tiny preset's (the offline tokenizer's) vocabulary


def _collate(rows: list[dict]) -> dict[str, torch.Tensor]:
    input_ids = torch.tensor([row["input_ids"] for row in rows])
    return {"input_ids": input_ids, "labels": input_ids}


def _train_with_hf_trainer(
    rank: int, world_size: int, ds_config: dict, training: dict, out: str
) -> list[float]:
    """transformers.Trainer + DeepSpeed on the tiny preset: the lr it logged; rank 0 saves the trained weights
    (gathered) to OUT/trained.pt and the Trainer's save_model() writes OUT/saved."""
    import deepspeed
    from transformers import Trainer, TrainingArguments

    from zero_train.hf.models import build_model, model_config

    deepspeed.init_distributed(dist_backend="gloo")  # on CPU (use_cpu) accelerate leaves deepspeed.comm to us
    args = TrainingArguments(output_dir=f"{out}/trainer", deepspeed=ds_config, use_cpu=True, report_to=[],
                             save_strategy="no", logging_steps=1, disable_tqdm=True, **training)  # fmt: skip
    torch.manual_seed(0)
    model = build_model(model_config("tiny"))  # after TrainingArguments: ZeRO-3 builds it inside zero.Init
    generator = torch.Generator().manual_seed(1)
    rows = [{"input_ids": torch.randint(0, VOCAB, (32,), generator=generator).tolist()} for _ in range(48)]
    trainer = Trainer(model=model, args=args, train_dataset=rows, data_collator=_collate)
    trainer.train()
    # every rank's shard (a no-op below ZeRO-3)
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        trained = {name: param.detach().clone() for name, param in model.named_parameters()}
    if rank == 0:
        torch.save(trained, f"{out}/trained.pt")
    trainer.save_model(f"{out}/saved")
    return [entry["learning_rate"] for entry in trainer.state.log_history if "learning_rate" in entry]


def _hf_schedule(training: dict) -> list[float]:
    """The lr after each optimizer step of HF's own scheduler for these TrainingArguments (what it logs)."""
    from transformers import get_scheduler

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=training["learning_rate"])
    scheduler = get_scheduler(training["lr_scheduler_type"], optimizer,
                              num_warmup_steps=training["warmup_steps"],
                              num_training_steps=training["max_steps"])  # fmt: skip
    lrs = []
    for _ in range(training["max_steps"]):
        optimizer.step()
        scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])
    return lrs


def _check_run(lrs: list[float], training: dict, out: pathlib.Path) -> None:
    from transformers import AutoModelForCausalLM

    assert lrs == pytest.approx(_hf_schedule(training), rel=1e-12, abs=0)
    loaded = AutoModelForCausalLM.from_pretrained(out / "saved").state_dict()
    trained = torch.load(out / "trained.pt")
    assert trained and all(torch.equal(loaded[name], tensor) for name, tensor in trained.items())
    assert not torch.equal(loaded["transformer.h.0.mlp.c_fc.weight"], _initial_weight())  # it trained


def _initial_weight() -> torch.Tensor:
    from zero_train.hf.models import build_model, model_config

    torch.manual_seed(0)
    return build_model(model_config("tiny")).state_dict()["transformer.h.0.mlp.c_fc.weight"]


def _generated(capsys, *argv: str) -> dict:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["config", *argv])
    captured = capsys.readouterr()
    assert exit_info.value.code == 0, captured.err
    return json.loads(captured.out)


def test_zero3_hf_auto_two_ranks_cosine_schedule_and_loadable_saved_weights(tmp_path):
    config = json.loads((REPO / "ds_configs" / "zero3_hf_auto.json").read_text())
    training = dict(per_device_train_batch_size=2, max_steps=4, learning_rate=1e-3, lr_scheduler_type="cosine",
                    warmup_steps=0)  # fmt: skip
    lrs = run_ranks(_train_with_hf_trainer, 2, (config, training, str(tmp_path)), timeout_s=300)
    # no warmup (DeepSpeed's warmup logs 0 first)
    assert lrs[0] == lrs[1] and lrs[0][0] > training["learning_rate"] * 0.8
    _check_run(lrs[0], training, tmp_path)


def test_zero2_hf_auto_one_process_linear_warmup_and_saved_weights(tmp_path, capsys):
    config = _generated(capsys, "--stage", "2", "--hf-auto")
    training = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=5,
                    learning_rate=2e-3, lr_scheduler_type="linear", warmup_steps=2, weight_decay=0.1)  # fmt: skip
    lrs = run_ranks(_train_with_hf_trainer, 1, (config, training, str(tmp_path)), timeout_s=300)[0]
    _check_run(lrs, training, tmp_path)


@pytest.mark.tier("quick")
def test_plan_hf_auto_json_passes_the_trainers_own_check(tmp_path, capsys):
    """The HF integration's fill and mismatch check (trainer_config_process / _finalize), on the plan's JSON
    and the TrainingArguments the plan prints (without --hf-auto, the plan's lr 3e-4 and weight decay 0.01
    would disagree with the Trainer's)."""
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    def plan(*extra: str) -> tuple[dict, str]:
        output = tmp_path / "plan.json"
        argv = ["plan", "--model", "tiny", "--gpus-per-node", "1", "--gpu-memory", "1", "--host-memory", "8",
                "--global-batch-size", "8", "--block-size", "64", "--device", "cpu", "-o", str(output), *extra]  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 0
        return json.loads(output.read_text()), capsys.readouterr().out

    def trainer_check(cfg: dict, arguments: dict) -> None:
        hf = HfTrainerDeepSpeedConfig(cfg)
        try:
            args = TrainingArguments(output_dir=str(tmp_path / "unused"), use_cpu=True, report_to=[],
                                     learning_rate=2e-5, lr_scheduler_type="cosine", **arguments)  # fmt: skip
            hf.trainer_config_process(args)
            model = type("Model", (), {"config": type("Config", (), {"hidden_size": 64})()})()
            hf.trainer_config_finalize(args, model, num_training_steps=100)
        finally:
            unset_hf_deepspeed_config()
        assert "auto" not in json.dumps(hf.config) and hf.config["optimizer"]["params"]["lr"] == 2e-5

    cfg, printed = plan("--hf-auto")
    line = next(line for line in printed.splitlines() if line.startswith("HF Trainer: TrainingArguments("))
    arguments = {key: json.loads(value.lower() if value in ("True", "False") else value)
                 for key, value in re.findall(r"(\w+)=([\w.]+)", line)}  # fmt: skip
    assert arguments == {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "bf16": True}
    assert "scheduler" not in cfg and cfg["zero_optimization"]["stage"] >= 1
    trainer_check(cfg, arguments)
