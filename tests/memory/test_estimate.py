"""`zero-train estimate` and the theory behind it: the paper's numbers, DeepSpeed's estimator, bad input."""

from __future__ import annotations

import json

import pytest

from zero_train.cli.main import main
from zero_train.memory.model import theory
from zero_train.memory.model.gpu_terms import GpuMargin, transient

pytestmark = pytest.mark.tier("quick")

PAPER_GB = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.88}  # ZeRO paper, 7.5B params, 64 ranks (Figure 1 / Table 1)


def run_estimate(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["estimate", *argv])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("stage", theory.STAGES)
def test_paper_formula_reproduces_the_papers_example(stage):
    gigabytes = theory.paper_bytes(7_500_000_000, 64, stage, precision="bf16") / 1e9
    assert round(gigabytes, 3 - len(str(int(gigabytes)))) == pytest.approx(PAPER_GB[stage])


def test_pure_fp32_is_16_bytes_per_param_and_zero1_shards_the_moments():
    assert theory.paper_bytes(1000, 1, 0, precision="fp32") == 16_000
    assert theory.paper_bytes(1000, 4, 1, precision="fp32") == 8_000 + 8_000 / 4


def test_cli_table_shows_the_paper_numbers(capsys):
    out = run_estimate(capsys, "--params", "7.5e9", "--world-size", "64")
    rows = [line.split() for line in out.splitlines() if line.startswith(("DDP", "ZeRO-"))]
    paper_column = [row[3] if row[0] == "DDP" else row[1] for row in rows]
    assert paper_column == ["120", "31.4", "16.6", "1.88"]


def test_json_has_the_same_numbers_and_calls_deepspeeds_estimator(capsys):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    result = json.loads(run_estimate(capsys, "--params", "7.5e9", "--world-size", "64", "--json"))
    by_stage = {row["stage"]: row for row in result["stages"]}
    for stage, gigabytes in PAPER_GB.items():
        assert by_stage[stage]["paper_bytes"] / 1e9 == pytest.approx(gigabytes, rel=5e-3)
    assert by_stage[0]["deepspeed_bytes"] is None and by_stage[1]["deepspeed_bytes"] is None
    expected2 = estimate_zero2_model_states_mem_needs(7_500_000_000, num_gpus_per_node=64, cpu_offload=False)[
        1
    ]
    expected3 = estimate_zero3_model_states_mem_needs(
        7_500_000_000, 0, num_gpus_per_node=64, cpu_offload=False, cpu_offload_params=False
    )[1]
    assert by_stage[2]["deepspeed_bytes"] == expected2 == 2 * 7_500_000_000 + 18 * 7_500_000_000 // 64
    assert by_stage[3]["deepspeed_bytes"] == expected3


def test_gpu_memory_picks_the_lowest_stage_whose_peak_fits_in_the_gpu_minus_the_named_margin(capsys):
    argv = ["--params", "7.5e9", "--world-size", "64", "--json"]
    result = json.loads(run_estimate(capsys, *argv, "--gpu-memory", "10"))
    # ours is the peak: 16-bit params whole (15 GB) at stages 0-2, whole gradients during ZeRO-1's backward
    # (15 GB more), DeepSpeed's 1 GB default reduce bucket; ZeRO-3: 1.88 + 2 GB gathered (max_live 1e9) + 1
    assert [row["fits"] for row in result["stages"]] == [False, False, False, True]
    assert result["recommended_stage"] == 3
    assert "recommended: ZeRO-3" in run_estimate(
        capsys, "--params", "7.5e9", "--world-size", "64", "--gpu-memory", "10"
    )
    # the GPU keeps the CUDA context and NCCL's buffers free (64 ranks: 32 channels x 2 peers x 10 MiB + 0.4 GB),
    # and each stage the allocator's slack for what its peak churns: our peak gets the rest
    nccl = 0.4e9 + 32 * 2 * 10 * 2**20
    assert result["gpu_margin"] == dict(cuda_context=GpuMargin().lazy_context_bytes, nccl_buffers=int(nccl))
    assert result["usable_gpu_bytes"] == int(10e9 - 0.45e9 - nccl)
    zero2 = result["stages"][2]
    assert 17.5e9 < zero2["ours_bytes"] < 18e9 and 0.02e9 < zero2["allocator_slack_bytes"] < 0.1 * 18e9
    for gpu_memory, stage in ((19.5, 3), (20, 2), (34.5, 2), (35, 1)):  # ZeRO-2 needs 17.6 + 0.5 + 1.5
        answer = json.loads(run_estimate(capsys, *argv, "--gpu-memory", str(gpu_memory)))
        usable = answer["usable_gpu_bytes"]
        assert usable == int(gpu_memory * 1e9 - 0.45e9 - nccl)
        assert answer["recommended_stage"] == stage
        assert all(row["fits"] == (row["ours_bytes"] + row["allocator_slack_bytes"] <= usable)
                   for row in answer["stages"])  # fmt: skip
    own = json.loads(run_estimate(capsys, *argv, "--gpu-memory", "20", "--gpu-margin", "2"))
    assert own["gpu_margin"] == dict(set_by_user=2 * 10**9) and own["recommended_stage"] == 2
    assert all(row["allocator_slack_bytes"] == 0 for row in own["stages"])  # the user's margin is all of it
    cpu = json.loads(run_estimate(capsys, *argv, "--gpu-memory", "10", "--device", "cpu"))
    assert cpu["gpu_margin"] == {} and cpu["usable_gpu_bytes"] == 10e9
    table = run_estimate(capsys, "--params", "7.5e9", "--world-size", "64", "--gpu-memory", "21")
    assert "GPU margin 1.52 GB (CUDA context 0.45, NCCL buffers 1.1; and per set-up, allocator slack" in table
    assert "NOT measured on this hardware" in table and "19.5 of 21 GB usable per GPU" in table


def test_the_gpu_margin_follows_the_settings_it_depends_on():
    """NCCL's buffers by peers, channels and buffer size; the context by module loading; the slack by the churned
    bytes and the allocator's mode (docs/gpu.md has each rule's source)."""
    margin, mib = GpuMargin(), 2**20
    assert margin.terms(world_size=1, environ={})["nccl_buffers"] == 0
    assert margin.nccl_bytes(2, {}) == 0.4e9 + 32 * 10 * mib  # one peer at 2 ranks
    assert (
        margin.nccl_bytes(8, {}) == margin.nccl_bytes(1024, {}) == 0.4e9 + 64 * 10 * mib
    )  # two at any scale
    assert (
        margin.nccl_bytes(8, dict(NCCL_MAX_NCHANNELS="4", NCCL_BUFFSIZE=str(mib))) == 0.4e9 + 8 * 8 * mib
    )  # 1 + 4.69 + 0.5 MiB -> 8
    assert margin.terms(world_size=2, environ=dict(CUDA_MODULE_LOADING="EAGER"))["cuda_context"] == 0.67e9
    slack = margin.terms(world_size=2, transient_bytes=10**9, environ={})["allocator_slack"]
    expandable = dict(PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:128,expandable_segments:True")
    assert slack == 0.5e9 + 20 * mib
    assert (
        margin.terms(world_size=2, transient_bytes=10**9, environ=expandable)["allocator_slack"]
        == 0.05e9 + 20 * mib
    )
    assert transient(dict(params=5, grads=7, activations=11, loss_temporaries=13)) == 24


def test_ours_is_the_peak_zero1_holds_whole_gradients_in_backward(capsys):
    """The estimate must predict the PEAK: ZeRO-1 reduces only after backward produced all 2 Psi of gradients."""
    result = json.loads(run_estimate(capsys, "--params", "7.5e9", "--world-size", "64", "--json"))
    psi, zero1 = 7_500_000_000, result["stages"][1]
    assert zero1["ours_peak_phase"] == "backward_end"
    assert zero1["ours_phases"]["backward_end"]["grads"] == 2 * psi  # whole 16-bit gradients
    assert zero1["ours_bytes"] >= zero1["paper_bytes"]  # the paper counts them whole too (31.4 GB)
    assert zero1["ours_categories"]["grads"] == pytest.approx(2 * psi / 64, abs=2)  # step boundary: partition
    for row in result["stages"]:
        assert row["ours_bytes"] == max(sum(terms.values()) for terms in row["ours_phases"].values())
        states = sum(
            row["ours_categories"][c] for c in ("params", "grads", "master_params", "optimizer_states")
        )
        assert row["ours_bytes"] >= states


def test_model_counts_params_buffers_and_activations(capsys, tmp_path):
    from zero_train.hf.models import count_params, load_model

    config = tmp_path / "ds.json"
    config.write_text(
        json.dumps({"zero_optimization": {"stage": 2, "reduce_bucket_size": 1000}, "bf16": {"enabled": True}})
    )
    argv = ["--model", "tiny", "--world-size", "2", "--config", str(config), "--block-size", "64", "--json"]
    result = json.loads(run_estimate(capsys, *argv))
    assert result["num_params"] == count_params(load_model("tiny"))
    assert result["precision"] == "bf16"
    stage2 = result["stages"][2]
    # DeepSpeed ZeRO-2 holds its reduce bucket during backward only (released at its end)
    assert stage2["ours_phases"]["backward_end"]["comm_buffers"] == 1000 * 2
    assert stage2["ours_categories"]["comm_buffers"] == 0
    assert stage2["ours_categories"]["activations"] == stage2["ours_phases"]["forward"]["activations"] > 0
    assert (
        result["stages"][3]["deepspeed_bytes"]
        > result["stages"][2]["deepspeed_bytes"] - 2 * result["num_params"]
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--world-size", "2"],  # neither --model nor --params
        ["--params", "-5", "--world-size", "2"],
        ["--params", "1e6", "--world-size", "0"],
        ["--params", "1e6", "--model", "tiny", "--world-size", "2"],
        ["--model", "no-such-model-xyz", "--world-size", "2"],
        ["--params", "1e6", "--world-size", "2", "--config", "/nonexistent/ds.json"],
        ["--model", "tiny", "--world-size", "2", "--block-size", "100000"],
    ],
)
def test_bad_inputs_exit_2_with_one_line(argv, capsys):
    """In this process, as tests/ds_config/test_config_bad_input.py runs `config`: an exception other than the
    usage error escapes main() and fails here (the command line's own launch: tests/package/test_hostile_input.py)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["estimate", *argv])
    captured = capsys.readouterr()
    assert exit_info.value.code == 2, captured
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in captured.err, captured.err


def test_offload_moves_optimizer_states_to_the_host_as_deepspeed_allocates_them():
    """DeepSpeed's offload estimators agree with ours: device model states exactly; host per node: both take the
    fp32 model every rank builds on the host (4 Psi x 8 ranks; DeepSpeed adds a 1.5 buffer factor); while training
    ours (each buffer named, memory.model.offload) lies between DeepSpeed's bare 16 (ZeRO-2) / 18 (ZeRO-3) bytes
    per parameter and those times 1.5. ZeRO-3 builds the model partitioned (zero.Init): no full fp32 copy."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    from transformers import LlamaConfig

    from zero_train.memory.model.estimate import estimate_setup

    offload = {"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}
    ds_config = {"zero_optimization": {"stage": 3, **offload}, "bf16": {"enabled": True}}
    config = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                         num_attention_heads=8, max_position_embeddings=64)  # fmt: skip
    result = estimate_setup(config, world_size=8, block_size=16, ds_config=ds_config, host_memory_bytes=1e12,
                            stages=(2, 3))  # fmt: skip
    zero2, zero3 = result.stages
    psi = result.num_params
    part = -(-psi // 8)
    cpu2, gpu2 = estimate_zero2_model_states_mem_needs(psi, num_gpus_per_node=8, cpu_offload=True)
    assert zero2.device_phases["step"]["params"] == gpu2 == 2 * psi  # the 16-bit model stays on the device
    for phases in (zero2.device_phases, zero3.device_phases):
        assert not any(
            {"master_params", "optimizer_states", "fp32_grads"} & set(terms) for terms in phases.values()
        )
    host2 = zero2.host_per_rank
    assert (host2["master_params"], host2["optimizer_states"], host2["fp32_grads"]) == (
        4 * part,
        8 * part,
        4 * part,
    )
    assert (
        host2["param_copy"] == 2 * part and host2["grad_staging_buffer"] == 2 * 32000 * 512
    )  # the embedding
    assert (
        zero2.host_per_node_bytes == 8 * zero2.host_startup_per_rank == 8 * 4 * psi and cpu2 == 1.5 * 32 * psi
    )
    assert 16 * psi < 8 * sum(host2.values()) < 1.5 * 16 * psi
    cpu3, _, _ = estimate_zero3_model_states_mem_needs(
        psi, 32000 * 512, num_gpus_per_node=8, cpu_offload=True, cpu_offload_params=True
    )
    assert cpu3 == 1.5 * 18 * psi  # no fp32 copy per rank: zero.Init builds the model partitioned
    assert zero3.host_per_rank == dict(master_params=4 * part, optimizer_states=8 * part, fp32_grads=4 * part,
                                       grads=2 * part, params=2 * part)  # fmt: skip
    assert 18 * psi < zero3.host_per_node_bytes == 8 * sum(zero3.host_per_rank.values()) < cpu3
    assert zero3.device_phases["step"].get("params", 0) == 2 * 512 * 9  # only the persistent norms stay
    tight = estimate_setup(config, world_size=8, block_size=16, ds_config=ds_config,
                           host_memory_bytes=zero3.host_per_node_bytes - 1, stages=(3,))  # fmt: skip
    assert zero3.fits_host and tight.stages[0].fits_host is False and tight.stages[0].fits is None


def test_a_config_json_is_estimated_with_activations_counted_on_its_architecture(capsys, tmp_path):
    import torch

    from zero_train.hf.models import model_config
    from zero_train.memory.model.activations import count_activations

    config = model_config("llama-tiny")
    config.to_json_file(tmp_path / "config.json")
    argv = [
        "--model",
        str(tmp_path / "config.json"),
        "--world-size",
        "2",
        "--block-size",
        "64",
        "--device",
        "cpu",
    ]
    result = json.loads(
        run_estimate(capsys, *argv, "--gradient-checkpointing", "--grad-accum", "4", "--json")
    )
    count = count_activations(config, micro_batch_size=1, block_size=64, dtype=torch.bfloat16,
                              gradient_checkpointing=True)  # fmt: skip
    assert result["activations"] == count.as_dict() and count.recompute_bytes > 0
    assert (result["grad_accum"], result["gradient_checkpointing"]) == (4, True)
    for row in result["stages"]:
        assert row["ours_phases"]["forward"]["activations"] == count.saved_bytes
        assert row["host_per_rank"] == {}
        assert row["host_per_node_bytes"] == 2 * row["host_startup_per_rank"]
    assert result["stages"][0]["host_startup_per_rank"] == 4 * result["num_params"]
    assert result["gpu_margin"] == {}


@pytest.mark.parametrize(
    "offload, stage2, stage3",
    [
        ({"offload_optimizer": {"device": "cpu"}}, dict(cpu_offload=True), dict(cpu_offload=True, cpu_offload_params=False)),
        ({"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}, dict(cpu_offload=True),
         dict(cpu_offload=True, cpu_offload_params=True)),
        ({"offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}, dict(cpu_offload=True), None),
        ({"offload_param": {"device": "cpu"}}, dict(cpu_offload=False), None),
        ({}, dict(cpu_offload=False), dict(cpu_offload=False, cpu_offload_params=False)),
    ],
)  # fmt: skip
def test_the_deepspeed_column_is_deepspeeds_own_estimate_for_the_set_ups_offload(offload, stage2, stage3):
    """Offload rows carry DeepSpeed's offload estimate (GPU, and host per node), called directly here on 2 nodes
    of 8 GPUs; where DeepSpeed has none (ZeRO-1, NVMe at ZeRO-3, offload_param alone) the column is empty."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    from transformers import LlamaConfig

    from zero_train.memory.model.estimate import estimate_setup

    config = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                         num_attention_heads=8, max_position_embeddings=64)  # fmt: skip
    ds_config = {"zero_optimization": {"stage": 3, **offload}, "bf16": {"enabled": True}}
    result = estimate_setup(config, world_size=16, gpus_per_node=8, block_size=16, ds_config=ds_config,
                            host_memory_bytes=1e12, stages=(1, 2, 3))  # fmt: skip
    zero1, zero2, zero3 = result.stages
    psi, largest = result.num_params, 32000 * 512
    assert zero1.deepspeed_bytes is None and zero1.deepspeed_host_per_node_bytes is None
    cpu2, gpu2 = estimate_zero2_model_states_mem_needs(psi, num_gpus_per_node=8, num_nodes=2, **stage2)
    assert (zero2.deepspeed_bytes, zero2.deepspeed_host_per_node_bytes) == (gpu2, cpu2)
    if stage3 is None:
        assert zero3.deepspeed_bytes is None and zero3.deepspeed_host_per_node_bytes is None
        return
    cpu3, gpu3, _ = estimate_zero3_model_states_mem_needs(
        psi, largest, num_gpus_per_node=8, num_nodes=2, **stage3
    )
    assert (zero3.deepspeed_bytes, zero3.deepspeed_host_per_node_bytes) == (gpu3, cpu3)
    if stage3["cpu_offload"]:  # the offload rows: DeepSpeed's figures move off the GPU as ours do
        plain = estimate_setup(config, world_size=16, gpus_per_node=8, block_size=16, stages=(3,)).stages[0]
        assert (
            zero3.deepspeed_bytes < plain.deepspeed_bytes
            and zero3.device_peak_bytes < plain.device_peak_bytes
        )


def test_without_a_block_size_the_estimate_takes_the_context_at_most_4096_tokens_and_says_so(
    capsys, tmp_path
):
    from zero_train.hf.models import max_context, model_config
    from zero_train.memory.model.estimate import DEFAULT_BLOCK_SIZE, default_block_size

    qwen = model_config("qwen2.5-7b")
    assert (max_context(qwen), default_block_size(qwen)) == (131_072, DEFAULT_BLOCK_SIZE) == (131_072, 4096)
    long_context = model_config("llama-tiny")
    long_context.max_position_embeddings = 131_072
    long_context.to_json_file(tmp_path / "config.json")
    argv = ["--model", str(tmp_path / "config.json"), "--world-size", "2", "--device", "cpu"]
    result = json.loads(run_estimate(capsys, *argv, "--json"))
    assert (result["block_size"], result["default_block_size"]) == (4096, True)
    assert result["activations"]["tokens"] == 4096
    table = run_estimate(capsys, *argv)
    assert "x block 4096 (default: the context, at most 4,096)" in table
    assert "no --block-size: 4,096 tokens per sample" in table
    short = json.loads(
        run_estimate(capsys, "--model", "tiny", "--world-size", "2", "--device", "cpu", "--json")
    )
    assert (short["block_size"], short["default_block_size"]) == (256, True)  # tiny's context
    given = json.loads(run_estimate(capsys, *argv, "--block-size", "64", "--json"))
    assert (given["block_size"], given["default_block_size"]) == (64, False)


MEASURED_8_RANKS = {"zero1": (9.000, 2.445), "zero2": (5.500, 2.445)}
"""(model states, comm_buffers) in B/param, measured by `zero-train profile` at 8 gloo ranks on a GPT-2 of 2 x 128
with the 50,257-token vocabulary (docs/zero1.md, "Measured: whole tensors per rank vs equal slices")."""
STATES = ("params", "grads", "master_params", "optimizer_states")


def test_our_zero_at_8_ranks_is_the_papers_and_the_measured_and_at_64_has_no_padding():
    from transformers import GPT2Config

    from zero_train.memory.model.estimate import estimate_setup

    def estimate(config, world_size: int, device: str) -> dict:
        ds_config = {
            "zero_optimization": {"stage": 1, "reduce_bucket_size": config.n_embd**2}
        }  # as generated
        result = estimate_setup(config, world_size=world_size, precision="fp32", micro_batch_size=1, block_size=8,
                                ds_config=ds_config, device=device, engines=tuple(MEASURED_8_RANKS))  # fmt: skip
        return {row.engine: row for row in result.stages}, config.n_embd**2

    small, _ = estimate(
        GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=50257, n_positions=256), 8, "cpu"
    )
    # GPT-2 small's shapes: 124.4M parameters, the embedding (38.6M) 19.85 x Psi/64
    large, bucket = estimate(GPT2Config(), 64, "cuda")
    for engine, (measured_states, measured_buffers) in MEASURED_8_RANKS.items():
        row, psi = small[engine], 6_862_464
        states = sum(row.boundary[name] for name in STATES) / psi
        assert states == pytest.approx(row.paper_bytes / psi, rel=1e-4)  # fp32: 4 + 4 + 8/N, or 4 + 12/N
        assert states == pytest.approx(measured_states, rel=0.02)
        assert row.boundary["comm_buffers"] / psi == pytest.approx(
            measured_buffers, rel=0.02
        )  # gloo's receive
        row = large[engine]
        assert sum(row.boundary[name] for name in STATES) == pytest.approx(row.paper_bytes, rel=1e-6)
        buckets = 2 * bucket * 4 if engine == "zero2" else 0  # ZeRO-2's two bucket buffers (docs/zero2.md)
        assert (
            row.boundary["comm_buffers"] <= buckets + 2 * 64 * 4
        )  # + padding: fewer than N elements per buffer
