"""LoRA through train.py: the flags, checkpoints that resume elastically, and exports that reproduce the run.

- `--lora-r` and friends are flags of the run config; target modules default to peft's per-architecture
  choice (GPT-2: c_attn; Llama: q_proj, v_proj), else every linear layer; a name that matches nothing, a
  dropout of 1, or a resume with other LoRA settings is one line and exit 2.
- a LoRA checkpoint saved by 2 ranks resumes on 1 rank (the same global batch: micro-batch 4) for our ZeRO-1
  (optimizer shards merged), our ZeRO-3 (pieces re-cut), FSDP2 (DCP resharded) and DeepSpeed ZeRO-2 (universal
  checkpoint), and trains on with the losses of the uninterrupted 2-rank run, within float rounding.
- an --hf-auto DeepSpeed config trains LoRA in train.py as in the Hugging Face Trainer + peft (the bench's
  peer, zero_train.bench.hf_peer, on the same flags): the same losses within 1e-5.
- `--export-hf` and `zero-train export` write a PEFT adapter folder that PeftModel.from_pretrained loads onto
  the rebuilt base with the run's eval loss, bit for bit; `--merge` writes a plain HF folder with the same
  eval loss within 1e-5; our ZeRO-3's 2-rank run exports the same PEFT folder from `--export-hf` and from its
  checkpoint, and peft loads every adapter of it.
"""

from __future__ import annotations

import pathlib

import pytest
import torch

from zero_train.hf.lora import LoraSpec, lora_shapes
from zero_train.hf.models import model_config
from zero_train.runtime.errors import UsageError
from zero_train.testing import run_ranks
from zero_train.train.args import parse_args, run_argv

pytestmark = pytest.mark.tier("quick")

SAVED_AT, MAX_STEPS = 3, 5


def test_lora_flags_round_trip_and_bad_values_are_one_line():
    config = parse_args(["--lora-r", "8", "--lora-alpha", "16", "--lora-target-modules", "q_proj, v_proj"])
    assert config.lora.spec() == LoraSpec(r=8, alpha=16.0, dropout=0.0, target_modules=("q_proj", "v_proj"))
    assert parse_args(run_argv(config)) == config
    assert parse_args([]).lora.spec() is None  # r = 0: every weight trains
    for argv, message in (
        (["--lora-dropout", "1"], "dropout (--lora-dropout): 1.0 is not below 1"),
        (["--lora-r", "-1"], "expected a whole number >= 0"),
        (["--lora-target-modules", " , "], "no module name given"),
    ):
        with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
            parse_args(argv)


def test_default_targets_are_peft_s_per_architecture_and_sizes_follow_r_times_in_plus_out():
    gpt2, llama = model_config("tiny", vocab_size=256), model_config("llama-tiny", vocab_size=256)
    shapes = lora_shapes(gpt2, LoraSpec(r=4))
    assert [name.rsplit(".", 1)[-1] for name in shapes.targets] == ["c_attn", "c_attn"]
    assert shapes.adapter_params == gpt2.n_layer * 4 * (gpt2.n_embd + 3 * gpt2.n_embd)
    shapes = lora_shapes(llama, LoraSpec(r=4))
    assert sorted({name.rsplit(".", 1)[-1] for name in shapes.targets}) == ["q_proj", "v_proj"]
    head, hidden = llama.hidden_size // llama.num_attention_heads, llama.hidden_size
    per_layer = 4 * (hidden + hidden) + 4 * (hidden + head * llama.num_key_value_heads)  # q, then v (GQA)
    assert shapes.adapter_params == llama.num_hidden_layers * per_layer
    every_linear = lora_shapes(llama, LoraSpec(r=4, target_modules=("all-linear",)))
    assert len(every_linear.targets) == 7 * llama.num_hidden_layers  # q k v o, gate up down; no lm_head
    assert every_linear.base_params == shapes.base_params
    with pytest.raises(UsageError, match="--lora-target-modules: Target modules .*nope"):
        lora_shapes(llama, LoraSpec(r=4, target_modules=("nope",)))


def _flags(root: pathlib.Path, engine: str, *extra: str) -> list[str]:
    return [
        "--engine", engine, "--model", "tiny", "--dataset", str(root / "corpus.txt"), "--block-size", "32",
        "--seed", "3", "--no-progress", "--max-steps", str(MAX_STEPS), "--grad-accum", "1", "--lr", "3e-3",
        "--warmup-steps", "1", "--lora-r", "4", "--lora-alpha", "16", "--lora-target-modules", "all-linear",
        "--save-dir", str(root / engine), "--eval-batches", "2", *extra,
    ]  # fmt: skip


def _train(rank: int, world_size: int, argv: list[str]) -> dict:
    from zero_train.runtime.dist import init_distributed
    from zero_train.train.loop import Trainer
    from zero_train.train.setup import plan_run

    config = parse_args(argv)
    trainer = Trainer(config, plan_run(config, world_size=world_size), init_distributed())
    losses = []
    trainer._report = lambda record, *_: losses.append(record["loss"])  # every step's mean loss over ranks
    try:
        summary = trainer.run()
    finally:
        trainer.close()
    return dict(losses=losses, eval_loss=summary["eval_loss"], start_step=summary["start_step"])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> pathlib.Path:
    from zero_train.hf.offline import stdlib_files

    root = tmp_path_factory.mktemp("lora-train")
    (root / "corpus.txt").write_text("\n\n".join(p.read_text(errors="replace") for p in stdlib_files(60_000)))
    return root


ELASTIC = ("zero1", "zero3", "fsdp2-z3", "ds2")  # rank shards (flat, pieces), DCP, DeepSpeed's (universal)


def _train_each(rank: int, world_size: int, argvs: list[list[str]]) -> list[dict]:
    """Several runs one after another in the same ranks (one spawn, one import of everything)."""
    return [_train(rank, world_size, argv) for argv in argvs]


def _hf_auto_flags(corpus: pathlib.Path) -> list[str]:
    """LoRA on DeepSpeed ZeRO-2 with an --hf-auto config (what `zero-train config --hf-auto` writes)."""
    import json

    from zero_train.ds_config.generate import ConfigRequest, generate_config

    (corpus / "hf_auto.json").write_text(json.dumps(generate_config(ConfigRequest(stage=2, hf_auto=True))))
    return ["--engine", "ds2", "--deepspeed_config", str(corpus / "hf_auto.json"), "--model", "tiny",
            "--dataset", str(corpus / "corpus.txt"), "--block-size", "32", "--max-steps", "3", "--lr", "3e-3",
            "--warmup-steps", "1", "--lora-r", "4", "--no-progress"]  # fmt: skip


@pytest.fixture(scope="module")
def elastic_runs(corpus) -> dict:
    """Each engine: 2 ranks train to MAX_STEPS saving at SAVED_AT; 1 rank (micro-batch 4: the same global
    batch, the same rows) resumes from that checkpoint. The same 2 ranks also train on an --hf-auto config."""
    two = [
        _flags(corpus, engine, "--micro-batch-size", "2", "--save-every", str(SAVED_AT)) for engine in ELASTIC
    ]
    two[ELASTIC.index("zero3")] += ["--export-hf", str(corpus / "zero3-export")]
    *whole, hf_auto = run_ranks(_train_each, 2, ([*two, _hf_auto_flags(corpus)],), timeout_s=600)[0]
    one = []
    for engine in ELASTIC:
        argv = _flags(
            corpus,
            engine,
            "--micro-batch-size",
            "4",
            "--resume",
            str(corpus / engine / f"step-{SAVED_AT:08d}"),
        )
        argv[argv.index("--save-dir") + 1] = str(corpus / f"{engine}-resumed")
        one.append(argv)
    resumed = run_ranks(_train_each, 1, (one,), timeout_s=600)[0]
    runs = {engine: dict(whole=w, resumed=r) for engine, w, r in zip(ELASTIC, whole, resumed, strict=True)}
    return dict(runs, hf_auto=hf_auto)


@pytest.mark.tier("multiproc")
@pytest.mark.parametrize("engine", ELASTIC)
def test_a_two_rank_lora_checkpoint_resumes_on_one_rank_with_the_same_losses(elastic_runs, engine):
    whole, resumed = elastic_runs[engine]["whole"], elastic_runs[engine]["resumed"]
    assert resumed["start_step"] == SAVED_AT
    assert resumed["losses"] == pytest.approx(whole["losses"][SAVED_AT:], rel=1e-5)
    assert whole["losses"][-1] < whole["losses"][0]  # it learns: the comparison means something


@pytest.mark.tier("multiproc")
def test_a_zero3_lora_run_exports_a_peft_adapter_folder_peft_loads(corpus, elastic_runs):
    from peft import PeftModel
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import load_file

    from zero_train.checkpoint.export_lora import export_lora_checkpoint
    from zero_train.hf.models import load_tokenizer, seeded_model

    export_lora_checkpoint(corpus / "zero3", corpus / "zero3-adapter")  # its latest checkpoint: the last step
    adapter, at_end = corpus / "zero3-adapter", corpus / "zero3-export"
    assert sorted(p.name for p in adapter.iterdir())[:2] == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    assert (adapter / "adapter_model.safetensors").read_bytes() == (
        at_end / "adapter_model.safetensors"
    ).read_bytes()  # the gathered adapters of --export-hf are the checkpoint's
    saved = load_file(str(adapter / "adapter_model.safetensors"))
    base = seeded_model("tiny", seed=3, vocab_size=len(load_tokenizer(None)))
    loaded = get_peft_model_state_dict(PeftModel.from_pretrained(base, str(adapter)))
    assert loaded.keys() == saved.keys() and all(torch.equal(loaded[k], saved[k]) for k in saved)
    assert any(float(v.abs().max()) > 0 for k, v in saved.items() if "lora_B" in k)  # trained: B left zero


def _eval_losses(rank: int, world_size: int, argv: list[str], adapter: str, merged: str) -> dict:
    """The eval loss of the exported adapter on the rebuilt base, and of the merged folder (train.py's eval)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from zero_train.hf.data import prepare_datasets
    from zero_train.hf.models import load_tokenizer, seeded_model
    from zero_train.runtime.dist import init_distributed
    from zero_train.train.eval import evaluate

    config = parse_args(argv)
    dist_info = init_distributed()
    tokenizer = load_tokenizer(None)
    data = prepare_datasets(
        config.data.dataset, tokenizer, block_size=config.data.block_size, seed=config.training.seed
    )
    base = seeded_model(config.model.model, seed=config.training.seed, vocab_size=len(tokenizer))
    models = dict(
        adapter=PeftModel.from_pretrained(base, adapter), merged=AutoModelForCausalLM.from_pretrained(merged)
    )
    return {
        name: evaluate(
            type("Engine", (), {"model": model})(),
            data["validation"],
            dist_info=dist_info,
            micro_batch_size=2,
            max_batches=config.evaluation.eval_batches,
        )  # fmt: skip
        for name, model in models.items()
    }


@pytest.mark.tier("multiproc")
def test_exported_adapter_reproduces_the_run_s_eval_loss_and_merge_gives_a_plain_model(corpus):
    from zero_train.checkpoint.export_lora import export_lora_checkpoint

    argv = _flags(corpus, "ddp", "--micro-batch-size", "2", "--export-hf", str(corpus / "ddp-export"))
    run = run_ranks(_train, 1, (argv,), timeout_s=300)[0]
    export_lora_checkpoint(corpus / "ddp", corpus / "adapter")  # what `zero-train export` calls on it
    export_lora_checkpoint(corpus / "ddp", corpus / "merged", merge=True)
    adapter_files = sorted(p.name for p in (corpus / "adapter").iterdir())
    assert adapter_files == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert (corpus / "adapter" / "adapter_model.safetensors").read_bytes() == (
        corpus / "ddp-export" / "adapter_model.safetensors"
    ).read_bytes()  # --export-hf at the end of the run wrote the same adapter
    losses = run_ranks(_eval_losses, 1, (argv, str(corpus / "adapter"), str(corpus / "merged")))[0]
    assert losses["adapter"] == run["eval_loss"]
    assert losses["merged"] == pytest.approx(run["eval_loss"], rel=1e-5)
    assert sorted(p.name for p in (corpus / "merged").iterdir())[:2] == ["config.json", "model.safetensors"]


def test_export_flags_that_do_not_fit_the_checkpoint_are_one_line(tmp_path):
    import argparse

    from zero_train.checkpoint.manifest import write_manifest
    from zero_train.cli.export import export_command

    lora = tmp_path / "lora" / "step-00000001"
    (lora / "model").mkdir(parents=True)
    (lora / "model" / "adapter_config.json").write_text("{}")
    full = tmp_path / "full" / "step-00000001"
    (full / "model").mkdir(parents=True)
    for folder in (lora, full):
        write_manifest(folder)  # a complete checkpoint, as far as its files go
    for folder, flags, message in (
        (lora, dict(dtype="bf16", merge=False), "--dtype casts a model's weights: pass --merge too"),
        (full, dict(dtype=None, merge=True), "--merge is for a LoRA run's checkpoint (--lora-r)"),
    ):
        args = argparse.Namespace(
            checkpoint=str(folder), out_dir=str(tmp_path / "out"), tokenizer=None, force=False, **flags
        )
        with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
            export_command(args)


def test_resuming_with_other_lora_settings_is_one_line(tmp_path):
    import json

    from zero_train.train.setup import check_resume_lora

    (tmp_path / "run.json").write_text(
        json.dumps({"lora": {"r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": None}})
    )
    check_resume_lora(tmp_path, parse_args(["--lora-r", "4"]).lora.recorded())
    with pytest.raises(
        UsageError, match=r"saved with r 4, alpha 8.0, .*; this run asks for every weight trained"
    ):
        check_resume_lora(tmp_path, None)


def _peer(rank: int, world_size: int, argv: list[str]) -> None:
    from zero_train.bench.hf_peer import run_peer

    run_peer(parse_args(argv))


@pytest.mark.tier("multiproc")
def test_an_hf_auto_config_trains_lora_as_the_hf_trainer_with_peft_does(corpus, elastic_runs):
    import json

    flags = _hf_auto_flags(corpus)
    run_ranks(_peer, 2, ([*flags, "--metrics-file", str(corpus / "peer.jsonl")],), timeout_s=300)
    peer = [json.loads(line)["loss"] for line in (corpus / "peer.jsonl").read_text().splitlines()]
    assert peer == pytest.approx(elastic_runs["hf_auto"]["losses"], rel=1e-5) and len(peer) == 3
