"""Measure DeepSpeed's offload buffers and compare them, term by term, with our offload model.

    python scripts/measure_offload.py                          # JIT build in /tmp/zt-ext, then 2 CPU ranks
    python scripts/measure_offload.py --extensions-dir DIR --json offload.json

Trains `tiny` (GPT-2 shaped, 0.64M parameters) on 2 gloo ranks in bf16 with gradient accumulation 2, twice:
DeepSpeed ZeRO-2 with `offload_optimizer: cpu`, then ZeRO-3 with `offload_optimizer` and `offload_param: cpu`
(DeepSpeedCPUAdam, whose kernel is JIT-built once under --extensions-dir). After one optimizer step each rank
reads the bytes of DeepSpeed's own offload buffers (zero_train.engines.deepspeed_offload) and our model's
terms for its partition (zero_train.memory.model.offload.host_terms, the device staging buffer of
device_phases). Exit 0 when every term equals, 1 otherwise.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time

from zero_train.ds_config import resolve_auto, train_settings
from zero_train.ds_config.generate import ConfigRequest, generate_config
from zero_train.runtime.errors import run_cli
from zero_train.runtime.parser import OneLineParser

CASES = {
    "ds2-offload": dict(stage=2, offload_optimizer="cpu", offload_param="none"),
    "ds3-offload": dict(stage=3, offload_optimizer="cpu", offload_param="cpu"),
}
PRECISION = "bf16"
GRAD_ACCUM = 2
MICRO_BATCH = (2, 32)  # sequences x tokens


def _parser():
    parser = OneLineParser(prog="measure_offload.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--extensions-dir", default="/tmp/zt-ext", help="TORCH_EXTENSIONS_DIR (default /tmp/zt-ext)"
    )
    parser.add_argument("--json", default=None, help="also write the comparison here")
    return parser


def _config(case: dict, world_size: int) -> tuple:
    """(settings, resolved DeepSpeed config) as `zero-train config` generates them."""
    from zero_train.hf.models import model_config

    request = ConfigRequest(precision=PRECISION, micro_batch_size=MICRO_BATCH[0], grad_accum=GRAD_ACCUM,
                            world_size=world_size, hidden_size=model_config("tiny").n_embd, **case)  # fmt: skip
    cfg = generate_config(request)
    settings = train_settings(cfg, world_size=world_size)
    return settings, resolve_auto(cfg, settings)


def _ours(stage: int, ds_config: dict, rank: int, world_size: int) -> dict[str, dict[str, int]]:
    """Our offload terms for this rank's partition: host_terms, and the device staging buffer."""
    from zero_train.hf.models import model_config
    from zero_train.memory.model import offload
    from zero_train.memory.model.flat_partition import partition_of
    from zero_train.memory.model.peak_terms import DeepSpeedSettings, Run
    from zero_train.memory.model.theory import model_shape

    run = Run(shape=model_shape(model_config("tiny")), world_size=world_size, precision=PRECISION,
              micro_batch_size=MICRO_BATCH[0], block_size=MICRO_BATCH[1],
              deepspeed=DeepSpeedSettings.from_config(ds_config, stage), grad_accum=GRAD_ACCUM)  # fmt: skip
    part = partition_of(run.shape, run.world_size, rank)
    inputs, settings = offload.rank_inputs(stage, run, part), offload.OffloadSettings.from_config(ds_config)
    device = {} if stage == 3 else dict(offload_grad_buffer=inputs.element_bytes * inputs.largest_tensor)
    return dict(host=offload.host_terms(inputs, settings), device=device)


def _measure_ranks(rank: int, world_size: int) -> dict:
    """In each rank: train one step of each case, read DeepSpeed's buffers beside ours."""
    import torch

    from zero_train.engines import build_engine
    from zero_train.engines.deepspeed_offload import offload_buffers
    from zero_train.hf.models import build_model, model_config
    from zero_train.runtime.dist import DistInfo

    info = DistInfo(
        rank=rank, world_size=world_size, local_rank=rank, device=torch.device("cpu"), backend="gloo"
    )
    results = {}
    for name, case in CASES.items():
        settings, ds_config = _config(case, world_size)
        ours = _ours(case["stage"], ds_config, rank, world_size)  # before DeepSpeed rewrites the config dict
        torch.manual_seed(0)
        engine = build_engine("deepspeed", model_fn=lambda: build_model(model_config("tiny")),
                              settings=settings, ds_config=ds_config, dist_info=info)  # fmt: skip
        generator = torch.Generator().manual_seed(rank)
        for _ in range(GRAD_ACCUM):
            engine.forward_backward(torch.randint(0, 1000, MICRO_BATCH, generator=generator))
        engine.step()
        results[name] = dict(deepspeed=offload_buffers(engine.ds_engine), ours=ours)
        del engine
    return results


def _rows(by_rank: list[dict]) -> list[dict]:
    """One row per (case, rank, side, term): DeepSpeed's bytes, ours, equal or not."""
    rows = []
    for rank, results in enumerate(by_rank):
        for case, result in results.items():
            for side in ("host", "device"):
                theirs, ours = result["deepspeed"][side], result["ours"][side]
                for term in sorted(set(theirs) | set(ours)):
                    rows.append(dict(case=case, rank=rank, side=side, term=term, deepspeed=theirs.get(term, 0),
                                     ours=ours.get(term, 0), equal=theirs.get(term, 0) == ours.get(term, 0)))  # fmt: skip
    return rows


def main(argv: list[str]) -> int:
    """Build the kernel (timed), measure on 2 ranks, print the comparison; exit 1 on any difference."""
    from zero_train.engines.deepspeed_offload import build_cpu_adam
    from zero_train.testing import run_ranks

    args = _parser().parse_args(argv)
    load = os.getloadavg()[0]
    build_s = build_cpu_adam(args.extensions_dir)  # sets TORCH_EXTENSIONS_DIR for the ranks too
    print(
        f"DeepSpeedCPUAdam kernel: {build_s:.1f} s to build or load in {args.extensions_dir} (load {load:.1f})"
    )
    started = time.perf_counter()
    rows = _rows(run_ranks(_measure_ranks, 2, timeout_s=900))
    print(f"2 ranks, {', '.join(CASES)}: {time.perf_counter() - started:.0f} s")
    print(f"{'case':<12} {'rank':>4} {'side':<6} {'term':<22} {'DeepSpeed':>11} {'ours':>11}")
    for row in rows:
        mark = "" if row["equal"] else "  DIFFERS"
        print(f"{row['case']:<12} {row['rank']:>4} {row['side']:<6} {row['term']:<22} {row['deepspeed']:>11,} "
              f"{row['ours']:>11,}{mark}")  # fmt: skip
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(dict(build_s=build_s, rows=rows), indent=1))
    equal = sum(row["equal"] for row in rows)
    print(f"{equal} of {len(rows)} terms equal DeepSpeed's buffers byte for byte")
    return 0 if equal == len(rows) else 1


if __name__ == "__main__":
    run_cli(lambda: main(sys.argv[1:]))
