"""DeepSpeed offload in our peak model (zero_train.memory.model.offload, peak.engine_peak).

- the host and device terms for `tiny` (2 ranks, bf16, accumulation 2) equal the bytes of DeepSpeed 0.19.8's
  own offload buffers, as scripts/measure_offload.py measured them (24 of 24 terms; that script JIT-builds
  DeepSpeedCPUAdam, 73 s here, so it is not in the suite);
- a CPU run's phases (one memory) are the device's phases plus every host term; a GPU answer keeps the
  device's phases only, without the fp32 masters and Adam states that moved to the host.
"""

from __future__ import annotations

import pytest

from zero_train.ds_config.generate import ConfigRequest, generate_config
from zero_train.hf.models import model_config
from zero_train.memory.model import offload
from zero_train.memory.model.flat_partition import partition_of
from zero_train.memory.model.peak import engine_peak
from zero_train.memory.model.peak_terms import DeepSpeedSettings, Run, loss_backward_moments
from zero_train.memory.model.theory import model_shape

pytestmark = pytest.mark.tier("quick")

MEASURED = {  # scripts/measure_offload.py, DeepSpeed 0.19.8, 2 CPU ranks: bytes of DeepSpeed's buffers by rank
    2: {
        "master_params": (1_281_536, 1_281_536), "fp32_grads": (1_281_536, 1_281_536),
        "optimizer_states": (2_563_072, 2_563_072), "param_copy": (640_768, 640_768),
        "grad_staging_buffer": (1_048_576, 1_048_576), "accumulated_grads": (1_048_576, 1_281_536),
    },
    3: {
        "master_params": (1_281_536, 1_281_536), "fp32_grads": (1_281_536, 1_281_536),
        "optimizer_states": (2_563_072, 2_563_072), "grads": (640_768, 640_768), "params": (640_768, 640_768),
    },
}  # fmt: skip
MEASURED_DEVICE_STAGING = 1_048_576  # ZeRO-2's temp_grad_buffer_for_gpu_offload, both ranks


def _config(stage: int) -> dict:
    request = ConfigRequest(stage=stage, precision="bf16", micro_batch_size=2, grad_accum=2, world_size=2,
                            hidden_size=64, offload_optimizer="cpu",
                            offload_param="cpu" if stage == 3 else "none")  # fmt: skip
    return generate_config(request)


@pytest.mark.parametrize("stage", [2, 3])
def test_offload_terms_equal_deepspeeds_measured_buffers(stage):
    config = _config(stage)
    run = Run(shape=model_shape(model_config("tiny")), world_size=2, precision="bf16", micro_batch_size=2,
              block_size=32, deepspeed=DeepSpeedSettings.from_config(config, stage), grad_accum=2)  # fmt: skip
    settings = offload.OffloadSettings.from_config(config)
    for part in (partition_of(run.shape, run.world_size, rank) for rank in range(run.world_size)):
        inputs = offload.rank_inputs(stage, run, part)
        host = offload.host_terms(inputs, settings)
        assert host == {term: by_rank[part.rank] for term, by_rank in MEASURED[stage].items()}
        device = offload.device_phases({"step": {"grads": 10**9}}, inputs, settings)["step"]
        assert device.get("offload_grad_buffer", 0) == (MEASURED_DEVICE_STAGING if stage == 2 else 0)


@pytest.mark.parametrize("engine", ["ds2", "ds3"])
def test_cpu_run_adds_host_terms_to_every_device_phase(engine):
    stage = int(engine[-1])
    config = _config(stage)
    shape = model_shape(model_config("llama-tiny"))
    common = dict(precision="bf16", micro_batch_size=2, block_size=32, ds_config=config, grad_accum=2)
    cpu = engine_peak(engine, shape, 2, backend="gloo", **common)
    gpu = engine_peak(engine, shape, 2, backend="nccl", rank=cpu.rank, **common)
    split = engine_peak(engine, shape, 2, backend="gloo", host_in_phases=False, rank=cpu.rank, **common)
    plain = engine_peak(engine, shape, 2, backend="nccl", rank=cpu.rank, **dict(common, ds_config=None))
    run = Run(shape=shape, world_size=2, precision="bf16", micro_batch_size=2, block_size=32,
              deepspeed=DeepSpeedSettings.from_config(config, stage), grad_accum=2)  # fmt: skip
    part = partition_of(run.shape, run.world_size, cpu.rank)
    host = offload.host_terms(
        offload.rank_inputs(stage, run, part), offload.OffloadSettings.from_config(config)
    )
    assert host["master_params"] == 4 * part.elements and host["optimizer_states"] == 8 * part.elements
    for phase, device_terms in split.phases.items():
        assert cpu.phase_bytes[phase] == sum(device_terms.values()) + sum(host.values())
        assert "master_params" not in gpu.phases[phase] and "optimizer_states" not in gpu.phases[phase]
    assert {k: v for k, v in gpu.phases.items() if k != "step"} == {
        k: v for k, v in split.phases.items() if k != "step"
    }
    # what left the device: at least the fp32 masters and Adam's moments (16 bytes/element less 2 at rest)
    assert (
        plain.phase_bytes["forward"] - gpu.phase_bytes["forward"]
        >= 12 * part.elements - 4 * run.largest_tensor
    )
    if (
        stage == 2
    ):  # without the device's gradient partition, log_softmax's backward is the larger moment again
        at_log_softmax = loss_backward_moments(run)[0]
        start = split.phases["backward_start"]
        assert start["loss_gradients"] == at_log_softmax and "grads" not in start
    boundary = cpu.boundary  # the probe's categories on one memory: the host's states come back
    assert (
        boundary["master_params"] == 4 * part.elements and boundary["optimizer_states"] == 8 * part.elements
    )


MEASURED_STEP = {  # docs/report/matrix.json, the offload cells' step phase (peak minus other between steps)
    ("gpt2", 2, "fp32", 1): (112_579_024, 112_579_200),
    ("llama", 2, "bf16", 4): (108_563_072, 108_430_992),
    ("gpt2", 3, "bf16", 1): (61_613_488, 61_612_528, 61_612_496),
    ("llama", 3, "fp32", 4): (131_478_912, 131_879_024, 131_416_464),
}


@pytest.mark.parametrize("cell", list(MEASURED_STEP))
def test_zero2_offload_step_equals_the_measured_step(cell):
    """ZeRO-2 offload's step on a CPU rank: the 16-bit model, the device staging buffer, gloo's all-gather
    buffer and every host term (no norm copy, no fp32 conversion: DeepSpeedCPUAdam steps on the host)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from zero_train.hf.offline import OFFLINE_VOCAB_SIZE
    from zero_train.report.matrix import ARCHITECTURES

    architecture, world_size, precision, grad_accum = cell
    kwargs = dict(ARCHITECTURES[architecture])
    shape = model_shape(CONFIG_MAPPING[kwargs.pop("model_type")](**kwargs, vocab_size=OFFLINE_VOCAB_SIZE))
    config = generate_config(ConfigRequest(stage=2, precision=precision, micro_batch_size=2, grad_accum=grad_accum,
                                           world_size=world_size, hidden_size=256, offload_optimizer="cpu"))  # fmt: skip
    for rank, measured in enumerate(MEASURED_STEP[cell]):
        model = engine_peak("ds2", shape, world_size, precision=precision, micro_batch_size=2, block_size=128,
                            ds_config=config, backend="gloo", rank=rank, grad_accum=grad_accum)  # fmt: skip
        assert 0 <= measured - model.phase_bytes["step"] < 4096  # allocator bookkeeping (1.5-3.5 KB measured)
