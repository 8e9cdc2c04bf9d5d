"""Real fine-tuning runs: the model's own tokenizer and a fine-tuning lr by default, a vocabulary mismatch as one
line; then, in one spawned rank, train from a save_pretrained folder into an --output-dir with TensorBoard and
trackio (their files read back equal the JSONL's), --sft (the first step's loss is the assistant tokens' loss
computed by hand), --num-train-epochs (HF's step count, --max-steps winning), and a --streaming run stopped and
resumed that repeats the uninterrupted run's losses exactly."""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from zero_train.ds_config.keys import RUN_LR_FINE_TUNING, RUN_LR_FROM_SCRATCH
from zero_train.hf import models as hf
from zero_train.hf.tokenizer import tokenizer_source
from zero_train.runtime.errors import UsageError
from zero_train.testing import run_ranks
from zero_train.train.args import parse_args
from zero_train.train.setup import plan_run

pytestmark = pytest.mark.tier("multiproc")

COMMON = [
    "--engine",
    "ddp",
    "--block-size",
    "32",
    "--micro-batch-size",
    "2",
    "--no-progress",
    "--eval-batches",
    "2",
]


def _save_model(folder: pathlib.Path, *, vocab_size: int | None = None, tokenizer: bool = True) -> str:
    """A tiny random GPT-2 written as save_pretrained writes a fine-tuned one (with the offline tokenizer)."""
    torch.manual_seed(0)
    hf.build_model(hf.model_config("tiny", vocab_size=vocab_size)).save_pretrained(folder)
    if tokenizer:
        hf.load_tokenizer().save_pretrained(folder)
    return str(folder)


@pytest.mark.tier("quick")
def test_the_tokenizer_follows_the_model(tmp_path):
    (tmp_path / "config.json").write_text(hf.model_config("tiny").to_json_string())
    assert [tokenizer_source(m, None) for m in ("tiny", "llama-3-8b", str(tmp_path / "config.json"))] == [
        "stdlib-bpe"
    ] * 3  # random weights: the offline tokenizer
    assert tokenizer_source(str(tmp_path), None) == str(tmp_path)  # a folder: its own
    assert tokenizer_source("meta-llama/Llama-3.2-1B", None) == "meta-llama/Llama-3.2-1B"  # a hub id: its own
    assert tokenizer_source("meta-llama/Llama-3.2-1B", "stdlib-bpe") == "stdlib-bpe"  # asked for


@pytest.mark.tier("quick")
def test_an_uncached_hub_model_offline_is_the_models_one_line_not_its_tokenizers():
    messages = {}
    for name in ("meta-llama/Llama-3.2-1B", "tinyy"):
        with pytest.raises(UsageError) as caught:
            plan_run(parse_args(["--model", name, *COMMON]), world_size=1)
        messages[name] = str(caught.value)
    assert messages["meta-llama/Llama-3.2-1B"].startswith(
        "model 'meta-llama/Llama-3.2-1B': it is not cached and HF_HUB_OFFLINE=1 forbids downloading"
    )  # an owner/name id is no typo of a preset: no "did you mean"
    assert messages["tinyy"].startswith("model 'tinyy' (did you mean 'tiny'?): it is not cached")
    assert not any("\n" in message for message in messages.values())


@pytest.mark.tier("quick")
def test_a_folder_without_tokenizer_files_and_a_vocabulary_mismatch_are_one_line(tmp_path):
    bare = _save_model(tmp_path / "bare", tokenizer=False)
    with pytest.raises(
        UsageError, match="model folder .*bare' has no tokenizer files .*--tokenizer stdlib-bpe"
    ):
        plan_run(parse_args(["--model", bare, *COMMON]), world_size=1)
    small = _save_model(
        tmp_path / "small", vocab_size=1000
    )  # embeds 1000 rows, its folder's tokenizer has 8192
    with pytest.raises(UsageError) as own:
        plan_run(parse_args(["--model", small, *COMMON]), world_size=1)
    assert str(own.value).startswith(
        f"the tokenizer in {small!r} has 8192 tokens but the model embeds only 1000"
    )
    with pytest.raises(UsageError) as given:
        plan_run(parse_args(["--model", small, "--tokenizer", "stdlib-bpe", *COMMON]), world_size=1)
    assert "tokenizer 'stdlib-bpe' has 8192 tokens but model" in str(given.value)
    assert "ids 1000..8191 have no row); drop --tokenizer" in str(given.value)
    assert "\n" not in str(own.value) + str(given.value)


@pytest.mark.tier("quick")
def test_a_pretrained_model_gets_a_fine_tuning_lr_unless_one_is_given(tmp_path):
    folder = _save_model(tmp_path / "model")
    lr = {}
    for name, argv in {
        "folder": ["--model", folder],
        "preset": ["--model", "tiny"],
        "flag": ["--model", folder, "--learning_rate", "1e-4"],
        "config": ["--model", folder, "--deepspeed_config", str(_config(tmp_path, lr=3e-4))],
    }.items():
        plan = plan_run(parse_args([*argv, *COMMON]), world_size=1)
        lr[name] = (plan.settings.lr, plan.ds_config["optimizer"]["params"]["lr"])
    assert lr == {
        "folder": (RUN_LR_FINE_TUNING,) * 2,
        "preset": (RUN_LR_FROM_SCRATCH,) * 2,
        "flag": (1e-4,) * 2,
        "config": (3e-4,) * 2,
    }
    assert RUN_LR_FINE_TUNING == 5e-5  # the HF Trainer's, the number docs/launch.md and --help state


@pytest.mark.tier("quick")
def test_warmup_steps_0_is_no_warmup_as_in_the_hf_trainer():
    from deepspeed.runtime.lr_schedules import WarmupCosineLR

    from zero_train.ds_config import lr_at

    lrs = {}
    for warmup in ("0", "3"):
        plan = plan_run(parse_args(["--model", "tiny", "--warmup_steps", warmup, "--max-steps", "10", *COMMON]),
                        world_size=1)  # fmt: skip
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=plan.settings.lr)
        scheduler = WarmupCosineLR(optimizer, **plan.ds_config["scheduler"]["params"])
        lrs[warmup] = []
        for step in range(10):
            lrs[warmup].append(optimizer.param_groups[0]["lr"])
            assert lr_at(plan.settings, step) == lrs[warmup][-1]  # the local engines' lr is DeepSpeed's
            scheduler.step()
    peak = RUN_LR_FROM_SCRATCH
    assert lrs["0"][:3] == [
        0.0,
        peak,
        peak,
    ]  # DeepSpeed's WarmupCosineLR runs its first step at 0, then the peak
    assert lrs["3"][:4] == pytest.approx([0.0, 0.0, peak / 3, 2 * peak / 3])  # a warmup ramps up to it


def _config(folder: pathlib.Path, *, lr) -> pathlib.Path:
    """A DeepSpeed JSON with a constant lr (no scheduler): a run stopped early keeps the same lr curve."""
    path = folder / f"constant-{lr}.json"
    path.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.0, "torch_adam": True}},
        "zero_optimization": {"stage": 0},
    }))  # fmt: skip
    return path


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> pathlib.Path:
    """A model folder, a ~60 kB text corpus, conversations, and a constant-lr config."""
    from zero_train.hf.offline import stdlib_files

    root = tmp_path_factory.mktemp("fine_tune")
    _save_model(root / "model")
    text = [path.read_text(errors="replace") for path in stdlib_files(60_000)]
    (root / "corpus.jsonl").write_text("".join(json.dumps({"content": doc}) + "\n" for doc in text))
    paragraphs = [part for doc in text for part in doc.split("\n\n")][
        :60
    ]  # ~30 blocks: a few steps per epoch
    (root / "small.jsonl").write_text("".join(json.dumps({"content": doc}) + "\n" for doc in paragraphs))
    chats = [
        {"messages": [{"role": "user", "content": f"What is {a} plus {b}?"},
                      {"role": "assistant", "content": f"{a} plus {b} is {a + b}."}]}
        for a in range(20) for b in range(10)
    ]  # fmt: skip
    (root / "chats.jsonl").write_text("".join(json.dumps(row) + "\n" for row in chats))
    _config(root, lr=1e-3)
    return root


def _argvs(root: pathlib.Path) -> dict[str, list[str]]:
    corpus = ["--dataset", str(root / "corpus.jsonl"), "--text-column", "content"]
    small = ["--dataset", str(root / "small.jsonl"), "--text-column", "content"]
    constant = ["--deepspeed_config", str(root / "constant-0.001.json")]
    stream = [*corpus, *constant, "--streaming", "--seed", "4"]
    return {
        "folder": ["--model", str(root / "model"), *corpus, "--max-steps", "4", "--output-dir", str(root / "out"),
                   "--report-to", "jsonl,tensorboard,trackio", "--eval-every", "2"],
        "sft": ["--model", "tiny", "--dataset", str(root / "chats.jsonl"), "--sft", "--max-steps", "3",
                "--metrics-file", str(root / "sft.jsonl")],
        "epochs": [*small, "--num-train-epochs", "2", "--grad-accum", "4", "--metrics-file", str(root / "epochs.jsonl")],
        "epochs_capped": [*small, "--num_train_epochs", "2", "--max_steps", "3", "--metrics-file",
                          str(root / "capped.jsonl")],
        "stream_whole": [*stream, "--max-steps", "6", "--metrics-file", str(root / "stream_whole.jsonl")],
        "stream_part": [*stream, "--max-steps", "3", "--output-dir", str(root / "stream")],
        "stream_resumed": [*stream, "--max-steps", "6", "--output-dir", str(root / "stream"), "--resume", "auto"],
    }  # fmt: skip


def _sft_first_loss(config) -> dict:
    """The first micro-batch's loss computed by hand from the seeded model: over the assistant tokens only."""
    from zero_train.runtime.dist import init_distributed
    from zero_train.train.data import RunData
    from zero_train.train.setup import model_builder

    plan = plan_run(config, world_size=1)
    data = RunData.prepare(config.data, plan.tokenizer, seed=config.training.seed, dist_info=init_distributed(),
                           micro_batch_size=plan.settings.micro_batch_size, eval_blocks=0)  # fmt: skip
    batch = next(data.batches(micro_steps=0, position=None))
    model = model_builder(config.model, plan, seed=config.training.seed)()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"]).logits[:, :-1].flatten(0, 1)
    loss = torch.nn.functional.cross_entropy(logits, batch["labels"][:, 1:].flatten(), ignore_index=-100)
    every = torch.nn.functional.cross_entropy(logits, batch["input_ids"][:, 1:].flatten())
    scored = int((batch["labels"][:, 1:] != -100).sum())
    return dict(
        masked=float(loss), every_token=float(every), scored=scored, tokens=batch["input_ids"][:, 1:].numel()
    )


def _runs(rank: int, world_size: int, root: str) -> dict:
    from zero_train.hf.data import prepare_datasets
    from zero_train.train.loop import run_training

    argvs = _argvs(pathlib.Path(root))
    results = {"sft_reference": _sft_first_loss(parse_args([*COMMON, *argvs["sft"]]))}
    epochs = parse_args([*COMMON, *argvs["epochs"]])
    plan = plan_run(epochs, world_size=1)
    packed = prepare_datasets(str(pathlib.Path(root) / "small.jsonl"), plan.tokenizer, block_size=32, seed=0,
                              column="content")  # fmt: skip
    results["epoch_blocks"] = len(packed["train"])
    for name, argv in argvs.items():
        results[name] = run_training(parse_args([*COMMON, *argv]))
    return results


@pytest.fixture(scope="module")
def runs(workdir) -> dict:
    return run_ranks(_runs, 1, args=(str(workdir),), timeout_s=900)[0]


def _records(path: pathlib.Path, key: str = "loss") -> list[dict]:
    return [record for line in path.read_text().splitlines() if key in (record := json.loads(line))]


def test_training_a_save_pretrained_folder_with_its_own_tokenizer_into_an_output_dir(workdir, runs):
    out = workdir / "out"
    log = (out / "train.log").read_text()
    assert f"model {workdir / 'model'} | tokenizer {workdir / 'model'} |" in log
    assert f"| lr {RUN_LR_FINE_TUNING:g}" in log and "step 4/4 |" in log
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-00000004"
    steps = _records(out / "metrics.jsonl")
    assert [r["step"] for r in steps] == [1, 2, 3, 4] and max(r["lr"] for r in steps) <= RUN_LR_FINE_TUNING
    assert runs["folder"]["steps"] == 4


def test_tensorboard_and_trackio_files_hold_the_jsonl_numbers(workdir, runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps = _records(workdir / "out" / "metrics.jsonl")
    evals = _records(workdir / "out" / "metrics.jsonl", "eval_loss")
    events = EventAccumulator(str(workdir / "out" / "runs" / "tensorboard"))
    events.Reload()
    for tag, key, records in (("train/loss", "loss", steps), ("train/grad_norm", "grad_norm", steps),
                              ("train/lr", "lr", steps), ("eval/loss", "eval_loss", evals)):  # fmt: skip
        logged = [(event.step, event.value) for event in events.Scalars(tag)]
        assert [step for step, _ in logged] == [r["step"] for r in records], tag
        assert [value for _, value in logged] == pytest.approx([r[key] for r in records], rel=1e-6), tag
    assert (
        len(events.Scalars("memory/rank0_peak_mib")) == 4 and "train/tokens_per_s" in events.Tags()["scalars"]
    )
    read = subprocess.run(
        [sys.executable, "-c", "import json, trackio.sqlite_storage as s; "
         "print(json.dumps(s.SQLiteStorage.get_logs('zero-train', 'out'), default=str))"],
        env=dict(os.environ, TRACKIO_DIR=str(workdir / "out" / "runs" / "trackio")),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    logs = json.loads(read.stdout.strip().splitlines()[-1])
    losses = {log["step"]: log["train/loss"] for log in logs if "train/loss" in log}
    assert losses == pytest.approx({r["step"]: r["loss"] for r in steps}, rel=1e-9)
    assert [log["eval/loss"] for log in logs if "eval/loss" in log] == pytest.approx(
        [r["eval_loss"] for r in evals]
    )


def test_sft_trains_on_the_assistant_tokens_only(workdir, runs):
    reference = runs["sft_reference"]
    first = _records(workdir / "sft.jsonl")[0]
    assert 0 < reference["scored"] < reference["tokens"] / 2  # the prompts are most of the tokens
    assert first["loss"] == pytest.approx(reference["masked"], abs=1e-5)
    assert abs(reference["masked"] - reference["every_token"]) > 1e-3  # the mask is what the engine applied
    assert len(_records(workdir / "sft.jsonl")) == 3


def test_epochs_are_counted_as_the_hf_trainer_counts_them_and_max_steps_wins(workdir, runs):
    micro_steps_per_epoch = runs["epoch_blocks"] // 2  # micro batch 2, one rank
    expected = math.ceil(2 * max(1, micro_steps_per_epoch // 4))  # grad accum 4
    assert runs["epochs"]["steps"] == expected == len(_records(workdir / "epochs.jsonl")) > 3
    assert runs["epochs_capped"]["steps"] == 3 == len(_records(workdir / "capped.jsonl"))


def test_a_streamed_run_resumes_with_the_same_tokens_in_the_same_order(workdir, runs):
    whole = [r["loss"] for r in _records(workdir / "stream_whole.jsonl")]
    resumed = [r["loss"] for r in _records(workdir / "stream" / "metrics.jsonl")]
    assert runs["stream_resumed"]["start_step"] == 3 and len(whole) == 6
    assert resumed == whole  # steps 1-3, then 4-6 from the checkpoint's read position, bit for bit
