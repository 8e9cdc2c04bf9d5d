"""Host memory by how the model is loaded: train.py's --load-dtype against the estimate, and what plan then allows.

- train.py's own model build (zero_train.train.setup.model_builder) of llama-60m in fp32 and in bf16: the bytes the
  CPU allocator gains during the build are the estimate's start-up host term (memory.model.host_build) within
  10%, and the bf16 build holds exactly the weights the fp32 build rounds to (a bf16 run starts the same).
- DeepSpeed ZeRO-3 on 2 CPU ranks: train.py's build under zero.Init (a 91M-parameter Llama, its embedding and LM
  head the largest modules) is the estimate's term within 10%: the partition, plus the largest set transformers
  gathers to initialise the weights held twice (DeepSpeed's buffer and gloo's receive buffer).
- The estimate: --load-dtype bf16 halves the start-up host bytes of the stages that build the whole model on
  each rank; ZeRO-3 builds under zero.Init on the GPU (no model bytes on the host), on CPU ranks its partition
  and, twice, the largest set gathered to initialise the weights.
- plan for Llama-2-70B on 256 x 8 GPUs with 2,000 GB per node: in fp32 every stage 0-2 set-up is rejected for
  host memory (8 x 276 GB per node); in bf16 none is.
- A bf16-loaded `tiny` trained in fp32 by ddp, our zero2, FSDP2 and DeepSpeed ZeRO-2 (2 ranks): the same losses.
(The same comparison at 0.32B parameters under torchrun, ZeRO-3's zero.Init included: scripts/measure_host_build.py,
docs/memory_model.md "Host memory while the model is built".)
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from zero_train.engines.precision import PRECISION_DTYPES
from zero_train.memory import measure

pytestmark = pytest.mark.tier("quick")

GB = 1e9


def _train_build(load_dtype: str):
    """train.py's model_fn for llama-60m in `load_dtype`: (the model, the allocator bytes its build added)."""
    from zero_train.train.args import parse_args
    from zero_train.train.setup import model_builder, plan_run

    config = parse_args(["--model", "llama-60m", "--engine", "ddp", "--load-dtype", load_dtype])
    build = model_builder(config.model, plan_run(config, world_size=1), seed=3)
    before = measure.allocated_bytes("cpu")
    measure.reset_peak("cpu")
    model = build()
    grown = max(measure.peak_bytes("cpu"), measure.allocated_bytes("cpu")) - before
    return model, grown


def test_train_builds_in_the_load_dtype_with_the_host_bytes_the_estimate_predicts():
    from zero_train.hf.models import model_config
    from zero_train.memory.model.host_build import model_build_bytes
    from zero_train.memory.model.theory import model_shape
    from zero_train.registry import engine_spec

    shape = model_shape(model_config("llama-60m"))
    models = {}
    for load_dtype in ("fp32", "bf16"):
        model, grown = _train_build(load_dtype)
        predicted = model_build_bytes(engine_spec("ddp"), shape, world_size=1, load_dtype=load_dtype,
                                      precision="bf16", device="cpu")  # fmt: skip
        assert abs(grown - predicted) <= 0.10 * predicted, (load_dtype, grown, predicted)
        assert {p.dtype for p in model.parameters()} == {PRECISION_DTYPES[load_dtype]}
        models[load_dtype] = model
    for (name, fp32), bf16 in zip(
        models["fp32"].named_parameters(), models["bf16"].parameters(), strict=True
    ):
        assert torch.equal(fp32.to(torch.bfloat16), bf16), name


ZERO_INIT_MODEL = dict(
    model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=1024, intermediate_size=2816,
    num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=16, vocab_size=32_000,
    max_position_embeddings=64, tie_word_embeddings=False, rms_norm_eps=1e-5,
)  # fmt: skip


def _zero_init_build_in_ranks(rank: int, world_size: int, argv: list[str]) -> int:
    """train.py's engine set-up in this rank (no step): the host bytes its model build added (the probe's)."""
    from zero_train.runtime.dist import init_distributed
    from zero_train.train.args import parse_args
    from zero_train.train.loop import Trainer
    from zero_train.train.setup import plan_run

    args = parse_args(argv)
    trainer = Trainer(args, plan_run(args, world_size=world_size), init_distributed())
    built = trainer.probe.phases["model_built"]["peak_bytes"] - trainer.probe.baseline_bytes
    trainer.close()
    return built


@pytest.mark.tier("multiproc")
def test_zero3_builds_under_zero_init_on_cpu_ranks_with_the_host_bytes_the_estimate_predicts(tmp_path):
    from zero_train.hf.models import model_config
    from zero_train.memory.model.host_build import model_build_bytes
    from zero_train.memory.model.theory import model_shape
    from zero_train.registry import engine_spec
    from zero_train.testing import run_ranks

    (tmp_path / "config.json").write_text(json.dumps(ZERO_INIT_MODEL))
    (tmp_path / "zero3.json").write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
        "optimizer": {"type": "SGD", "params": {"lr": 1e-3}}, "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": 3, "reduce_bucket_size": 100_000, "stage3_prefetch_bucket_size": 100_000},
    }))  # fmt: skip
    argv = ["--model", str(tmp_path / "config.json"), "--engine", "deepspeed", "--precision", "fp32",
            "--deepspeed_config", str(tmp_path / "zero3.json"), "--block-size", "32", "--micro-batch-size", "1",
            "--no-progress", "--memory-report", str(tmp_path / "memory.json")]  # fmt: skip
    built = run_ranks(_zero_init_build_in_ranks, 2, args=(argv,), timeout_s=600)
    shape = model_shape(model_config(str(tmp_path / "config.json")))
    assert shape.init_gather_numels == (32_000 * 1024, 1024)  # the embedding with the final norm
    predicted = model_build_bytes(engine_spec("ds3"), shape, world_size=2, load_dtype="fp32", precision="fp32",
                                  device="cpu")  # fmt: skip
    for rank_bytes in built:
        assert abs(rank_bytes - predicted) <= 0.10 * predicted, (built, predicted)


def test_the_estimate_s_host_start_up_follows_the_load_dtype_and_zero_init():
    from zero_train.hf.models import model_config
    from zero_train.memory.model.estimate import estimate_setup

    config = model_config("llama-3-8b")
    rows = {}
    for load_dtype in ("fp32", "bf16"):
        for device in ("cuda", "cpu"):
            result = estimate_setup(
                config, world_size=8, block_size=256, load_dtype=load_dtype, device=device
            )
            rows[load_dtype, device] = {row.stage: row for row in result.stages}
    psi = result.num_params
    for stage in (0, 1, 2):
        assert rows["fp32", "cuda"][stage].host_startup_per_rank == 4 * psi
        assert rows["bf16", "cuda"][stage].host_startup_per_rank == 2 * psi
        assert rows["bf16", "cuda"][stage].host_per_node_bytes == 8 * 2 * psi
    # the largest set transformers gathers to initialise: the embedding with the final norm (untied: the LM head
    # is as large), each held twice, DeepSpeed's buffer and gloo's
    gathered = 128256 * 4096 + 4096
    for load_dtype in ("fp32", "bf16"):
        assert rows[load_dtype, "cuda"][3].host_startup_per_rank == 0
        assert rows[load_dtype, "cpu"][3].host_startup_per_rank == 2 * (-(-psi // 8) + 2 * gathered)
    with pytest.raises(ValueError, match="load dtype"):
        estimate_setup(config, world_size=8, block_size=256, load_dtype="fp16")


def test_plan_keeps_70b_stages_0_to_2_for_host_memory_when_the_model_loads_in_bf16():
    from zero_train.hf.models import model_config
    from zero_train.memory.model.plan import PlanRequest, make_plan
    from zero_train.memory.model.theory import model_shape

    config = model_config("llama-2-70b")
    shape, rejected = model_shape(config), {}
    for load_dtype in ("fp32", "bf16"):
        request = PlanRequest(shape=shape, config=config, nodes=256, gpus_per_node=8, gpu_memory_gb=80,
                              host_memory_gb=2000, global_batch_size=2048, block_size=512, load_dtype=load_dtype)  # fmt: skip
        plan = make_plan(request)
        rejected[load_dtype] = {c.setup.name: c.reason for c in plan.rejected if c.setup.stage < 3}
    assert rejected["fp32"] and all("host" in reason for reason in rejected["fp32"].values())
    assert 8 * 4 * shape.num_params > 2000 * GB > 8 * 2 * shape.num_params
    assert not any("host" in reason for reason in rejected["bf16"].values()), rejected["bf16"]


def _runs_in_ranks(rank: int, world_size: int, runs: dict[str, list[str]]) -> dict[str, list[float]]:
    """Each named argv through train.py's loop in this rank: its step losses."""
    from zero_train.runtime.dist import init_distributed
    from zero_train.train.args import parse_args
    from zero_train.train.loop import Trainer
    from zero_train.train.setup import plan_run

    losses = {}
    for name, argv in runs.items():
        args = parse_args(argv)
        trainer = Trainer(args, plan_run(args, world_size=world_size), init_distributed())
        trainer.run()
        trainer.close()
        if rank == 0:  # rank 0 writes the metrics
            lines = pathlib.Path(args.output.metrics_file).read_text().splitlines()
            losses[name] = [record["loss"] for record in map(json.loads, lines) if "loss" in record]
    return losses


@pytest.mark.tier("slow")
def test_every_engine_trains_a_bf16_loaded_model_in_fp32_as_ddp_does(tmp_path):
    """--load-dtype bf16 with fp32 training: ddp, our zero2, FSDP2 and DeepSpeed ZeRO-2 (which casts to bf16 or
    fp16 itself but never to fp32) all start from the bf16 weights in fp32 and train alike; the fp32 load starts
    elsewhere."""
    from zero_train.hf.offline import stdlib_files
    from zero_train.testing import run_ranks

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(path.read_text(errors="replace") for path in stdlib_files(60_000)))
    config = tmp_path / "zero2.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                                  "zero_optimization": {"stage": 2, "reduce_bucket_size": 200_000,
                                                        "allgather_bucket_size": 200_000}}))  # fmt: skip
    common = ["--model", "tiny", "--block-size", "32", "--seed", "3", "--no-progress", "--dataset", str(corpus),
              "--deepspeed_config", str(config), "--precision", "fp32", "--max-steps", "4", "--lr", "3e-3",
              "--warmup-steps", "1", "--eval-batches", "1"]  # fmt: skip
    runs = {
        f"{engine}-{load}": [*common, "--engine", engine, "--load-dtype", load,
                             "--metrics-file", str(tmp_path / f"{engine}-{load}.jsonl")]
        for engine, load in (("ddp", "fp32"), ("ddp", "bf16"), ("zero2", "bf16"), ("fsdp2", "bf16"),
                             ("deepspeed", "bf16"))
    }  # fmt: skip
    losses = run_ranks(_runs_in_ranks, 2, args=(runs,), timeout_s=600)[0]
    reference = losses["ddp-bf16"]
    assert len(reference) == 4
    for name in ("zero2-bf16", "fsdp2-bf16", "deepspeed-bf16"):
        assert losses[name] == pytest.approx(reference, rel=1e-5), name
    # the load dtype took effect: other weights (bf16 rounding of the weights moved the first loss by 2e-6
    # relative on `tiny`; an engine computing in bf16, 8 significant bits, would miss the 1e-5 above)
    assert losses["ddp-fp32"] != reference
