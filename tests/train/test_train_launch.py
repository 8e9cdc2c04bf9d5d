"""scripts/train.py end to end: real launchers, 2 CPU ranks, the tiny preset on a small local corpus.

- through DeepSpeed's own launcher (`deepspeed --num_gpus 2`), ZeRO-2: loss goes down over 20 steps, the
  JSONL metrics have every field for both ranks, evaluation reports perplexity = exp(eval loss); the same
  run as two nodes on 127.0.0.1 (`deepspeed --hostfile H --no_ssh --node_rank 0|1`) gives the same losses;
- in spawned ranks (zero_train.testing.run_ranks calling the same loop): our zero1, stopped at step 10 and
  resumed with `--resume auto`, gives ddp's fp32 loss curve exactly (the sharding is DDP's arithmetic, and
  the resume repeats the uninterrupted steps); DeepSpeed ZeRO-1 and ZeRO-3 learn too; the --export-hf folders of ddp and
  ZeRO-3 load with AutoModelForCausalLM and give the trained model's logits; --memory-report writes a
  valid run record;
- bad input exits 2 with one `error:` line per rank, no traceback, no hang.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest
import torch

from zero_train.testing import free_port, run_ranks

pytestmark = pytest.mark.tier("slow")

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent
STEPS = 20
RESUME_AT = 10
# the two-node run: the one-node run's first 10 steps and first evaluation, under the same 20-step schedule
TWO_NODE_STEPS = 10
BLOCK = 32
COMMON = [
    "--model",
    "tiny",
    "--block-size",
    str(BLOCK),
    "--seed",
    "3",
    "--no-progress",
    "--eval-batches",
    "4",
]
ENV = dict(
    os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1"
)


def _config(stage: int) -> dict:
    """A config with HF-style "auto" values (filled from the flags) and small buckets (CPU memory)."""
    zero: dict = {"stage": stage, "reduce_bucket_size": 200_000}
    if stage in (1, 2):
        zero["allgather_bucket_size"] = 200_000
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size=200_000, stage3_param_persistence_threshold=1000)
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": 0.01, "torch_adam": True}},
        "scheduler": {
            "type": "WarmupCosineLR",
            "params": {"warmup_num_steps": "auto", "total_num_steps": "auto", "warmup_type": "linear"},
        },
        "zero_optimization": zero,
    }


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> pathlib.Path:
    """A ~150 kB real-text corpus (Python stdlib sources as paragraphs) and configs for stages 0-3."""
    from zero_train.hf.offline import stdlib_files

    root = tmp_path_factory.mktemp("train")
    text = "\n\n".join(path.read_text(errors="replace") for path in stdlib_files(150_000))
    (root / "corpus.txt").write_text(text)
    for stage in range(4):
        (root / f"zero{stage}.json").write_text(json.dumps(_config(stage)))
    # the schedule's horizon written out: a run stopped early (--max-steps 10) keeps the 20-step schedule
    for stage in (1, 2):
        fixed = _config(stage)
        fixed["scheduler"]["params"]["total_num_steps"] = STEPS
        (root / f"zero{stage}-fixed.json").write_text(json.dumps(fixed))
    return root


def _flags(workdir: pathlib.Path, stage: int | str, engine: str, *extra: str) -> list[str]:
    return [
        "--deepspeed_config", str(workdir / f"zero{stage}.json"), "--engine", engine,
        "--dataset", str(workdir / "corpus.txt"), *COMMON, "--micro-batch-size", "2", "--grad-accum", "2",
        "--lr", "3e-3", "--warmup-steps", "3", *extra,
    ]  # fmt: skip


def _losses(metrics_file: pathlib.Path) -> list[float]:
    records = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]


def _assert_learns(losses: list[float]) -> None:
    assert len(losses) == STEPS
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.5, f"loss did not go down: first 5 {first:.3f}, last 5 {last:.3f}"


def _ds2_flags(
    workdir: pathlib.Path, metrics_file: pathlib.Path, stage: int | str = 2, steps: int = STEPS
) -> list[str]:
    """scripts/train.py and its flags for the ZeRO-2 launcher runs (one node, and two nodes below)."""
    return ["scripts/train.py", *_flags(workdir, stage, "deepspeed", "--max-steps", str(steps), "--eval-every", "10",
                                        "--metrics-file", str(metrics_file))]  # fmt: skip


@pytest.fixture(scope="module")
def ds2_one_node(workdir) -> subprocess.CompletedProcess:
    """`deepspeed --num_gpus 2` on ZeRO-2: 2 ranks on one node, metrics in workdir/ds2/metrics.jsonl."""
    cmd = [str(BIN / "deepspeed"), "--num_gpus", "2", "--master_port", str(free_port()),
           *_ds2_flags(workdir, workdir / "ds2" / "metrics.jsonl")]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_deepspeed_launcher_zero2_learns_and_writes_metrics(workdir, ds2_one_node):
    proc = ds2_one_node
    records = [json.loads(line) for line in (workdir / "ds2" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    for record in steps:
        assert {"step", "loss", "lr", "grad_norm", "tokens_per_s", "memory"} <= record.keys()
        assert record["grad_norm"] > 0 and record["tokens_per_s"] > 0
        assert len(record["memory"]) == 2 and all(m["allocated_bytes"] > 0 for m in record["memory"])
    assert [e["step"] for e in evals] == [10, STEPS]  # every 10 steps; the last: the final evaluation
    assert all(abs(e["perplexity"] - torch.tensor(e["eval_loss"]).exp().item()) < 1e-6 * e["perplexity"]
               for e in evals)  # fmt: skip
    _assert_learns([r["loss"] for r in steps])
    assert f"step {STEPS}/{STEPS} | loss" in proc.stdout  # the fixed step line, rank 0 only
    assert proc.stdout.count(f"step {STEPS}/{STEPS} |") == 1


def test_deepspeed_hostfile_two_nodes_without_ssh_equal_one_node(workdir, ds2_one_node):
    """Two `deepspeed --hostfile --no_ssh` launches on 127.0.0.1 (node ranks 0 and 1, one rank each) are
    the same 2-rank world as `deepspeed --num_gpus 2`: same rank order, same gloo sums, so the same losses
    and gradient norms to the last bit (over the first TWO_NODE_STEPS steps, the schedule's horizon fixed at
    STEPS so that the learning rates are the one-node run's)."""
    hostfile = workdir / "hostfile"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")  # DeepSpeed refuses a host listed twice
    port, metrics = str(free_port()), workdir / "two-nodes" / "metrics.jsonl"
    nodes = [
        subprocess.Popen([str(BIN / "deepspeed"), "--hostfile", str(hostfile), "--no_ssh", "--node_rank", str(rank),
                          "--master_addr", "127.0.0.1", "--master_port", port,
                          *_ds2_flags(workdir, metrics, "2-fixed", TWO_NODE_STEPS)],
                         cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
        for rank in (0, 1)
    ]  # fmt: skip
    try:
        outputs = [node.communicate(timeout=300)[0] for node in nodes]
    finally:  # a node that died leaves the other waiting in a collective: stop both with their ranks
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    for node, output in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, output[-3000:]
    last = f"step {TWO_NODE_STEPS}/{TWO_NODE_STEPS} |"
    assert "world size 2" in outputs[0] and last in outputs[0]
    assert last not in outputs[1]  # rank 0 is on node 0
    one_node = [json.loads(line) for line in (workdir / "ds2" / "metrics.jsonl").read_text().splitlines()]
    two_nodes = [json.loads(line) for line in metrics.read_text().splitlines()]
    keys = ("step", "loss", "grad_norm", "lr", "eval_loss")
    assert [r["step"] for r in two_nodes if "loss" in r] == list(range(1, TWO_NODE_STEPS + 1))
    assert [{k: r.get(k) for k in keys} for r in two_nodes] == [
        {k: r.get(k) for k in keys} for r in one_node if r["step"] <= TWO_NODE_STEPS
    ]


def _train_runs(rank: int, world_size: int, runs: list[list[str]], probe_batch: torch.Tensor) -> list[dict]:
    """Run each argv through the loop in this rank; return summaries (+ logits of the trained model)."""
    from zero_train.runtime.dist import init_distributed
    from zero_train.train.args import parse_args
    from zero_train.train.loop import Trainer
    from zero_train.train.setup import plan_run

    results = []
    for argv in runs:
        args = parse_args(argv)
        trainer = Trainer(args, plan_run(args, world_size=world_size), init_distributed())
        summary = trainer.run()
        if args.checkpoint.export_hf:
            model = trainer.engine.model
            model.eval()
            with torch.no_grad():  # a collective under ZeRO-3: every rank runs it
                summary["logits"] = model(input_ids=probe_batch).logits.float().tolist()  # no shared memory
        trainer.close()  # as run_training does: the next run starts without this engine
        results.append(summary)
    return results


def _probe_batch() -> torch.Tensor:
    return torch.randint(0, 8192, (2, BLOCK), generator=torch.Generator().manual_seed(0))


def _assert_export_matches(folder: str, logits: list) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        exported = model(input_ids=_probe_batch()).logits
    torch.testing.assert_close(exported, torch.tensor(logits), rtol=0, atol=1e-5)
    assert len(AutoTokenizer.from_pretrained(folder)) == 8192


@pytest.fixture(scope="module")
def loop_runs(workdir) -> tuple[pathlib.Path, list[dict]]:
    """Every in-process run of this module in ONE spawn of 2 ranks (one start-up): ddp, zero1 stopped at step
    10 and resumed, DeepSpeed ZeRO-1, then ZeRO-3 (last: its HfDeepSpeedConfig stays alive)."""
    out = workdir / "loop"
    runs = [
        _flags(workdir, 0, "ddp", "--max-steps", str(STEPS), "--metrics-file", str(out / "ddp.jsonl"),
               "--export-hf", str(out / "ddp-hf"), "--memory-report", str(out / "ddp-memory.json"),
               "--output-dir", str(out / "ddp-run"), "--report-to", "jsonl,tensorboard"),
        _flags(workdir, "1-fixed", "zero1", "--max-steps", str(RESUME_AT), "--save-every", "5",
               "--metrics-file", str(out / "part.jsonl"), "--save-dir", str(out / "ckpt")),
        _flags(workdir, "1-fixed", "zero1", "--max-steps", str(STEPS), "--metrics-file", str(out / "part.jsonl"),
               "--save-dir", str(out / "ckpt"), "--resume", "auto"),
        _flags(workdir, 1, "deepspeed", "--max-steps", str(STEPS), "--metrics-file", str(out / "ds1.jsonl")),
        _flags(workdir, 3, "deepspeed", "--max-steps", str(STEPS), "--metrics-file", str(out / "ds3.jsonl"),
               "--export-hf", str(out / "ds3-hf")),
    ]  # fmt: skip
    return out, run_ranks(_train_runs, 2, args=(runs, _probe_batch()), timeout_s=900)


def test_ddp_zero1_parity_resume_export_memory_report(loop_runs):
    out, results = loop_runs
    ddp, resumed = _losses(out / "ddp.jsonl"), _losses(out / "part.jsonl")
    _assert_learns(ddp)
    assert results[0][2]["start_step"] == RESUME_AT
    # our ZeRO-1 is DDP's arithmetic, sharded: identical fp32 loss curves, steps 1-10 before the stop ...
    assert resumed[:RESUME_AT] == ddp[:RESUME_AT]
    assert resumed == ddp  # ... and 11-20 after the resume, exactly as uninterrupted
    assert (out / "ckpt" / "latest").read_text().strip() == f"step-{STEPS:08d}"
    _assert_export_matches(str(out / "ddp-hf"), results[0][0]["logits"])

    from zero_train.memory.record import load_record

    record = load_record(out / "ddp-memory.json")
    assert record["engine"] == "ddp" and record["world_size"] == 2 and record["steps"] == STEPS
    assert [r["rank"] for r in record["ranks"]] == [0, 1]
    assert {p["name"] for p in record["ranks"][0]["phases"]} >= {"model_built", "engine_initialized", "step"}


def test_tensorboard_holds_each_ranks_memory_as_the_jsonl_does(loop_runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _ = loop_runs
    records = [r for r in map(json.loads, (out / "ddp.jsonl").read_text().splitlines()) if "loss" in r]
    events = EventAccumulator(str(out / "ddp-run" / "runs" / "tensorboard"))
    events.Reload()
    for rank in (0, 1):
        for kind in ("allocated", "peak"):
            logged = [(event.step, event.value) for event in events.Scalars(f"memory/rank{rank}_{kind}_mib")]
            expected = [(r["step"], r["memory"][rank][f"{kind}_bytes"] / 2**20) for r in records]
            assert [step for step, _ in logged] == [step for step, _ in expected] and len(logged) == STEPS
            assert [value for _, value in logged] == pytest.approx([value for _, value in expected], rel=1e-6)
    assert all(len(r["memory"]) == 2 for r in records)  # each rank's own, gathered to rank 0


def test_deepspeed_zero1_and_zero3_learn_and_zero3_exports(loop_runs):
    out, results = loop_runs
    for name in ("ds1", "ds3"):
        _assert_learns(_losses(out / f"{name}.jsonl"))
    _assert_export_matches(str(out / "ds3-hf"), results[0][4]["logits"])


def _assert_one_line_exit_2(proc: subprocess.CompletedProcess, *, lines: int, needle: str) -> None:
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert len(errors) == lines and all(needle in line for line in errors), proc.stderr[-2000:]


def _bad_config(workdir: pathlib.Path) -> pathlib.Path:
    path = workdir / "bad.json"
    path.write_text("{not json")
    return path


def _batch_config(workdir: pathlib.Path) -> pathlib.Path:
    path = workdir / "batch5.json"
    path.write_text(json.dumps({"train_batch_size": 5, "train_micro_batch_size_per_gpu": 2}))
    return path


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("unknown_preset", "tinyy"),
        ("unreadable_config", "bad.json"),
        ("batch_does_not_fit", "5"),
        ("block_above_context", "context of 256"),
        ("save_every_without_dir", "--save-dir"),
        ("unknown_engine", "--engine"),
    ],
)
@pytest.mark.tier("quick")
def test_bad_input_before_training(workdir, capsys, monkeypatch, case, needle):
    from zero_train.runtime.errors import run_cli
    from zero_train.train.args import parse_args
    from zero_train.train.loop import run_training

    argv = {
        "unknown_preset": ["--engine", "ddp", "--model", "tinyy"],
        "unreadable_config": ["--deepspeed_config", str(_bad_config(workdir)), "--engine", "ddp"],
        "batch_does_not_fit": ["--deepspeed_config", str(_batch_config(workdir)), "--engine", "ddp"],
        "block_above_context": ["--engine", "ddp", "--block-size", "512"],
        "save_every_without_dir": ["--engine", "ddp", "--save-every", "5"],
        "unknown_engine": ["--engine", "zero9"],
    }[case]
    monkeypatch.setenv("WORLD_SIZE", "2")  # as under a launcher: every check here runs before any collective
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(SystemExit) as exit_info:
        run_cli(lambda: run_training(parse_args(argv)))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.count("\n") == 1 and err.startswith("error:") and needle in err, err


def test_missing_dataset_deepspeed_launcher_every_rank(workdir):
    cmd = [str(BIN / "deepspeed"), "--num_gpus", "2", "--master_port", str(free_port()), "scripts/train.py",
           "--engine", "ddp", "--dataset", str(workdir / "no-such-dir/"), "--max-steps", "2"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
    _assert_one_line_exit_2(proc, lines=2, needle="does not exist")
