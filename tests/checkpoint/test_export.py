"""Export to a Hugging Face folder: from_pretrained must give the trained model's logits exactly."""

import json
import pathlib

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from zero_train.checkpoint.export import export_checkpoint, export_model
from zero_train.checkpoint.manifest import write_manifest
from zero_train.cli.export import export_command_parser
from zero_train.hf import models as hf
from zero_train.runtime.errors import UsageError
from zero_train.runtime.parser import OneLineParser

pytestmark = pytest.mark.tier("quick")

IDS = torch.randint(0, 8192, (2, 24), generator=torch.Generator().manual_seed(0))


def trained_model(preset: str, seed: int = 0):
    """A preset whose weights are random and untied from their init pattern (one SGD step on noise)."""
    torch.manual_seed(seed)
    model = hf.load_model(preset)
    loss = model(IDS, labels=IDS).loss
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.5 * p.grad
    return model.eval()


def write_checkpoint(save_dir, model, step=40, manifest=True):
    """A ddp/zero1-style checkpoint, laid out as zero_train.checkpoint.files writes it (tied tensors stored once),
    with its manifest.json (every file's size and sha256) unless `manifest` is False."""
    ckpt = save_dir / f"step-{step:08d}"
    (ckpt / "model").mkdir(parents=True)
    model.config.save_pretrained(ckpt / "model")
    unique, seen = {}, set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            unique[name] = tensor.contiguous()
    save_file(unique, str(ckpt / "model" / "model.safetensors"), metadata={"format": "pt"})
    (ckpt / "run.json").write_text(
        json.dumps({"engine": "ddp", "model": "tiny", "tokenizer": None, "step": step})
    )
    if manifest:
        write_manifest(ckpt)
    (save_dir / "latest").write_text(ckpt.name)
    return ckpt


def logits(model):
    with torch.no_grad():
        return model(IDS).logits


@pytest.mark.parametrize("preset", ["tiny", "llama-tiny"])
def test_checkpoint_export_loads_with_identical_logits(tmp_path, preset):
    model = trained_model(preset)
    write_checkpoint(tmp_path / "save", model)
    out = export_checkpoint(tmp_path / "save", tmp_path / "hf")  # a save dir: follows `latest`
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert torch.equal(logits(loaded), logits(model))
    assert hf.count_params(loaded) == hf.count_params(model)
    assert loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight  # still tied
    assert json.loads((out / "config.json").read_text())["architectures"] == [type(model).__name__]
    assert all(path.stat().st_mode & 0o777 == 0o644 for path in out.iterdir())  # shareable
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer("def f(): pass")["input_ids"] == hf.load_tokenizer()("def f(): pass")["input_ids"]


def test_export_model_casts_dtype_and_untied_models_keep_both_matrices(tmp_path):
    config = hf.model_config("tiny")
    config.tie_word_embeddings = False
    torch.manual_seed(1)
    model = hf.build_model(config).eval()
    export_model(model, config, None, tmp_path / "bf16", dtype=torch.bfloat16)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16")
    assert loaded.dtype == torch.bfloat16
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight.to(torch.bfloat16))
    assert hf.count_params(loaded) == hf.count_params(model) == 640_768 + 8192 * 64


def test_cli_refuses_to_overwrite_and_never_leaves_partial_folders(tmp_path):
    parser = OneLineParser(prog="zero-train")
    export_command_parser(parser.add_subparsers())
    ckpt = write_checkpoint(tmp_path / "save", trained_model("tiny"))
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    args = parser.parse_args(["export", str(ckpt), str(out)])
    with pytest.raises(UsageError, match="not empty; pass --force"):
        args.func(args)
    assert (out / "keep.txt").read_text() == "user data"
    args = parser.parse_args(["export", str(ckpt), str(out), "--force"])
    assert args.func(args) == 0
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()
    (ckpt / "model" / "model.safetensors").unlink()
    args = parser.parse_args(["export", str(ckpt), str(tmp_path / "hf2")])
    with pytest.raises(
        UsageError, match="model.safetensors is missing .listed in manifest.json.; the checkpoint is damaged"
    ):
        args.func(args)
    (ckpt / "manifest.json").unlink()  # a hand-made folder: no manifest, and no weights either
    with (
        pytest.warns(UserWarning, match="has no manifest.json"),
        pytest.raises(UsageError, match="neither model/model.safetensors nor deepspeed/"),
    ):
        args.func(args)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "save"]  # no partial or temporary folder
    with pytest.raises(UsageError, match="does not exist"):
        export_checkpoint(tmp_path / "missing", tmp_path / "hf3")


def test_weights_of_another_model_are_refused_before_anything_is_written(tmp_path):
    # no manifest: the config is swapped by hand below (a manifest would refuse the edited file first)
    ckpt = write_checkpoint(tmp_path / "save", trained_model("tiny"), manifest=False)
    hf.model_config("llama-tiny").save_pretrained(ckpt / "model")  # config of another architecture
    unverified = pytest.warns(UserWarning, match="has no manifest.json")
    with (
        unverified,
        pytest.raises(UsageError, match="do not fit the model config: 21 missing_keys .* 28 unexpected_keys"),
    ):
        export_checkpoint(ckpt, tmp_path / "hf")
    narrower = hf.model_config("tiny")
    narrower.n_inner = 128
    narrower.save_pretrained(ckpt / "model")  # same architecture, other shapes
    with unverified, pytest.raises(UsageError, match="6 mismatched_shapes .*mlp.c_fc.bias"):
        export_checkpoint(ckpt, tmp_path / "hf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["save"]


def _deepspeed_checkpoints(rank, world_size, save_dir, stages):
    """One rank: per ZeRO stage, train the tiny preset 3 steps with DeepSpeed, save, return its logits."""
    import os

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch._dynamo  # noqa: F401  imported inside zero.Init, it trips over the patched Tensor.__new__
    from transformers import GPT2LMHeadModel  # noqa: F401  (same: import the model code before zero.Init)

    return [_train_and_save(pathlib.Path(save_dir) / f"zero{stage}", stage).numpy() for stage in stages]


def _train_and_save(ckpt, stage):
    import deepspeed

    ds_config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 10**9,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
    }
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=ds_config, enabled=stage == 3):  # ZeRO-3: built partitioned
        model = hf.load_model("tiny")
    assert (model.transformer.wte.weight.numel() == 0) == (stage == 3)  # really partitioned
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    for _ in range(3):
        engine.backward(engine(IDS[:, :16], labels=IDS[:, :16]).loss)
        engine.step()
    engine.eval()
    with torch.no_grad():
        reference = engine(IDS).logits
    hf.model_config("tiny").save_pretrained(ckpt / "model")
    (ckpt / "run.json").write_text(json.dumps({"engine": "deepspeed", "tokenizer": None}))
    if stage == 3:  # as zero_train's deepspeed engine saves: one tag, no `latest`
        engine.save_checkpoint(str(ckpt / "deepspeed"), tag="state", save_latest=False)
    else:
        engine.save_checkpoint(str(ckpt / "deepspeed"), tag="global_step3")
    write_manifest(ckpt)  # a complete checkpoint, as zero_train's saver leaves it: export verifies every file
    engine.destroy()
    return reference  # returned as numpy: a tensor would live in memory the exited child owned


@pytest.mark.tier("multiproc")
def test_deepspeed_zero3_zero2_zero0_checkpoints_export_with_identical_logits(tmp_path):
    from zero_train.testing import run_ranks

    stages = (3, 2, 0)
    (references,) = run_ranks(_deepspeed_checkpoints, 1, (str(tmp_path), stages))
    untrained = logits(hf.load_model("tiny").eval())
    for stage, reference in zip(stages, references, strict=True):
        out = export_checkpoint(tmp_path / f"zero{stage}", tmp_path / f"hf{stage}")
        loaded = AutoModelForCausalLM.from_pretrained(out)
        assert loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight
        assert torch.equal(logits(loaded), torch.from_numpy(reference))  # fp32 masters == trained weights
        assert not torch.allclose(untrained, torch.from_numpy(reference))  # training moved the weights


def _engine_checkpoints(rank, world_size, save_root):
    """Every rank: train the tiny preset on the offline data with the real engines, save, return logits."""
    import torch.distributed as dist

    from zero_train.ds_config import resolve_auto, train_settings
    from zero_train.engines import build_engine
    from zero_train.hf import batches as hf_batches
    from zero_train.hf import data
    from zero_train.runtime.dist import DistInfo

    dist_info = DistInfo(
        rank=rank, world_size=world_size, local_rank=rank, device=torch.device("cpu"), backend="gloo"
    )
    packed = data.prepare_datasets(None, hf.load_tokenizer(), block_size=32, seed=0)
    references = {}
    for name, stage in (("ddp", 0), ("deepspeed", 3)):
        cfg = {
            "train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": 1,
            "steps_per_print": 10**9,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
        }
        settings = train_settings(cfg, world_size=world_size)
        torch.manual_seed(0)
        engine = build_engine(
            name,
            model_fn=lambda: hf.load_model("tiny"),
            settings=settings,
            ds_config=resolve_auto(cfg, settings),
            dist_info=dist_info,
        )
        batches = hf_batches.rank_batches(
            packed["train"], rank=rank, world_size=world_size, micro_batch_size=2, seed=0
        )
        for _ in range(2):
            engine.forward_backward(next(batches)["input_ids"])
            engine.step()
        ckpt = pathlib.Path(save_root) / name / "step-00000002"
        if rank == 0:
            ckpt.mkdir(parents=True)
            (ckpt / "run.json").write_text(json.dumps({"engine": name, "tokenizer": None}))
        dist.barrier()
        engine.save_checkpoint(ckpt, client_state={})
        dist.barrier()
        if rank == 0:
            write_manifest(ckpt)  # complete, as zero_train's saver leaves it: export verifies every file
        engine.model.eval()
        with torch.no_grad():
            references[name] = engine.model(IDS).logits.numpy()
    return references


@pytest.mark.tier("multiproc")
def test_real_engine_checkpoints_ddp_and_deepspeed_zero3_export_with_identical_logits(tmp_path):
    from zero_train.testing import run_ranks

    references, _ = run_ranks(_engine_checkpoints, 2, (str(tmp_path),))
    for name, reference in references.items():
        out = export_checkpoint(tmp_path / name / "step-00000002", tmp_path / f"hf-{name}")
        loaded = AutoModelForCausalLM.from_pretrained(out)
        assert torch.equal(logits(loaded), torch.from_numpy(reference)), name
