"""The designs of the step-time check (scripts/steptime_check.py): each design's bench sets, which of them
calibrate and which are held out, the host-work terms it fits, and its steps. Each design was fixed and committed
before its own run measured anything; a later design holds out cells no earlier one used.
"""

from __future__ import annotations

from steptime_designs_v1_v6 import ENGINES, GPT2, SETS_V1, SETS_V2, SETS_V3, SETS_V4, SETS_V5, SETS_V6, TINY
from steptime_designs_v7_v10 import SETS_V7, SETS_V8, SETS_V9, SETS_V10
from steptime_designs_v11_v13 import SETS_V11, SETS_V12, SETS_V13
from steptime_designs_v14_v16 import SETS_V14, SETS_V15, SETS_V16

SETS_V17 = [
    dict(name="cal-gpt2-25m-w2", role="calibration", world_size=2, engines=ENGINES, **GPT2),
    dict(name="llama-tiny-w4-b1x256", role="held-out", world_size=4, model="llama-tiny", micro_batch_size=1,
         block_size=256, engines="zero1,zero2,zero3,ds1"),
    dict(name="cal-llama-tiny-w2", role="calibration", world_size=2, engines=ENGINES, **TINY),
    dict(name="llama-tiny-w4-b4x64-ckpt", role="held-out", world_size=4, model="llama-tiny", micro_batch_size=4,
         block_size=64, gradient_checkpointing=True, engines="ds1,ds2,ds3,fsdp2-z2"),
    dict(name="cal-gpt2-25m-w1", role="calibration", world_size=1, engines=ENGINES, **GPT2),
    dict(name="qwen2-tiny-w1-b4x256", role="held-out", world_size=1, model="qwen2-tiny", micro_batch_size=4,
         block_size=256, engines="zero3,ds1,ds2,fsdp2-z3"),
    dict(name="cal-llama-tiny-w1", role="calibration", world_size=1, engines=ENGINES, **TINY),
    dict(name="gpt2-25m-w2-b1x64-ckpt-accum2", role="held-out", world_size=2, model="gpt2-25m", micro_batch_size=1,
         block_size=64, grad_accum=2, gradient_checkpointing=True, engines="ddp,zero1,ds3,fsdp2-z3"),
    dict(name="llama-tiny-w1-b8x64-ckpt-accum2", role="held-out", world_size=1, model="llama-tiny",
         micro_batch_size=8, block_size=64, grad_accum=2, gradient_checkpointing=True,
         engines="zero3,ds3,fsdp2-z2,fsdp2-z3"),
    dict(name="llama-60m-w2-b1x64-ckpt", role="held-out", world_size=2, model="llama-60m", micro_batch_size=1,
         block_size=64, gradient_checkpointing=True, engines="ddp,zero2,ds2,fsdp2-z2"),
]  # fmt: skip
"""Design v17, fixed (and committed, together with v18) after v16's run, before either run measured anything. No
model change: v16's fit (a host cost per ATen op; per engine per micro-batch, per parameter per reduction, per
sync point per second of the other terms and per sync point per peer; shared per logit element stretched and
not, per sync point per rank beyond the cores, per collective call and per op; relative error, non-negative) with
v16's cells seen: on v3's-v16's quiet runs' cells rescaled to this run's speed and its own calibration cells,
each held-out cell scaled by its nearest calibration shape's and ranks' cells. Leave-one-run-out on v3-v16 (343
cells, scripts/steptime_crossval.py --fit v16 --runs v3,...,v16): 8.74% median |error|, 330 within 25%, 405 of
409 pairs, 8 of 14 runs with every cell within 25%. v14's measurement (every set launched once in each of three
rounds, round 2 reversed; a cell the median over its launches). 24 new cells drawn (scripts/steptime_draw.py
--seed 17 --before v17, drawn once), none of v1-v16's combinations: llama-tiny 1 x 256 on 4 ranks (neither),
4 x 64 checkpointed on 4 and 8 x 64 checkpointed with accumulation on 1; qwen2-tiny 4 x 256 on 1 (neither);
gpt2-25m 1 x 64 checkpointed with accumulation on 2; llama-60m 1 x 64 checkpointed on 2. The rule, written
before either run: v17 and v18 (v17 replicated on new cells, its fit exactly) run back to back; the check counts
as met only if BOTH meet all three targets (every cell within 25%, median |error| within 10%, every pair more
than 15% apart ordered right): on the stored runs this model meets the every-cell target in about three runs of
five, so one pass (v14's) was not taken as the answer."""
SETS_V18 = [
    dict(name="cal-gpt2-25m-w2", role="calibration", world_size=2, engines=ENGINES, **GPT2),
    dict(name="llama-60m-w1-b2x32-ckpt-accum2", role="held-out", world_size=1, model="llama-60m",
         micro_batch_size=2, block_size=32, grad_accum=2, gradient_checkpointing=True,
         engines="ddp,zero2,ds1,fsdp2-z2"),
    dict(name="cal-llama-tiny-w2", role="calibration", world_size=2, engines=ENGINES, **TINY),
    dict(name="llama-tiny-w2-b4x128-ckpt", role="held-out", world_size=2, model="llama-tiny", micro_batch_size=4,
         block_size=128, gradient_checkpointing=True, engines="zero3,ds1,ds3,fsdp2-z2"),
    dict(name="cal-gpt2-25m-w1", role="calibration", world_size=1, engines=ENGINES, **GPT2),
    dict(name="qwen2-tiny-w4-b1x256-accum2", role="held-out", world_size=4, model="qwen2-tiny", micro_batch_size=1,
         block_size=256, grad_accum=2, engines="zero2,zero3,ds3,fsdp2-z2"),
    dict(name="cal-llama-tiny-w1", role="calibration", world_size=1, engines=ENGINES, **TINY),
    dict(name="qwen2-tiny-w2-b2x256-ckpt-accum2", role="held-out", world_size=2, model="qwen2-tiny",
         micro_batch_size=2, block_size=256, grad_accum=2, gradient_checkpointing=True,
         engines="zero1,ds2,ds3,fsdp2-z3"),
    dict(name="tiny-w4-b4x256", role="held-out", world_size=4, model="tiny", micro_batch_size=4, block_size=256,
         engines="ddp,zero1,ds1,fsdp2-z3"),
    dict(name="gpt2-25m-w1-b1x64", role="held-out", world_size=1, model="gpt2-25m", micro_batch_size=1,
         block_size=64, engines="zero2,zero3,ds2,fsdp2-z3"),
]  # fmt: skip
"""Design v18, fixed and committed with v17, before either run measured anything: v17 REPLICATED on new cells.
v17's fit exactly (v17's own cells NOT added) and measurement; 24 new cells drawn (scripts/steptime_draw.py
--seed 18 --before v18, drawn once), none of v1-v17's combinations: llama-60m 2 x 32 checkpointed with
accumulation on 1 rank; llama-tiny 4 x 128 checkpointed on 2; qwen2-tiny 1 x 256 with accumulation on 4 and
2 x 256 checkpointed with accumulation on 2; the GPT-2 shaped tiny 4 x 256 on 4 and gpt2-25m 1 x 64 on 1
(neither). Judged by v17's rule: met only if v17 and v18 both meet all three targets."""
SETS_V19 = [
    dict(name="cal-gpt2-25m-w2", role="calibration", world_size=2, engines=ENGINES, **GPT2),
    dict(name="llama-60m-w2-b1x64-ckpt-accum2", role="held-out", world_size=2, model="llama-60m",
         micro_batch_size=1, block_size=64, grad_accum=2, gradient_checkpointing=True,
         engines="zero2,zero3,ds1,ds3"),
    dict(name="cal-llama-tiny-w2", role="calibration", world_size=2, engines=ENGINES, **TINY),
    dict(name="qwen2-tiny-w1-b1x32-ckpt", role="held-out", world_size=1, model="qwen2-tiny", micro_batch_size=1,
         block_size=32, gradient_checkpointing=True, engines="ddp,zero1,ds2,fsdp2-z2"),
    dict(name="cal-gpt2-25m-w1", role="calibration", world_size=1, engines=ENGINES, **GPT2),
    dict(name="qwen2-tiny-w2-b1x256-accum2", role="held-out", world_size=2, model="qwen2-tiny", micro_batch_size=1,
         block_size=256, grad_accum=2, engines="ddp,zero2,ds1,fsdp2-z3"),
    dict(name="cal-llama-tiny-w1", role="calibration", world_size=1, engines=ENGINES, **TINY),
    dict(name="qwen2-tiny-w1-b4x32", role="held-out", world_size=1, model="qwen2-tiny", micro_batch_size=4,
         block_size=32, engines="ds1,ds2,ds3,fsdp2-z2"),
    dict(name="llama-tiny-w4-b2x64-accum2", role="held-out", world_size=4, model="llama-tiny", micro_batch_size=2,
         block_size=64, grad_accum=2, engines="zero1,zero2,zero3,fsdp2-z3"),
    dict(name="tiny-w4-b8x32-ckpt", role="held-out", world_size=4, model="tiny", micro_batch_size=8, block_size=32,
         gradient_checkpointing=True, engines="zero3,ds2,ds3,fsdp2-z3"),
]  # fmt: skip
"""Design v19, fixed (and committed, together with v20) after v17's and v18's runs, before either run measured
anything. No model change: v18's fit with v17's and v18's cells seen (leave-one-run-out on v3-v18, 391 cells,
scripts/steptime_crossval.py --fit v19: 8.55% median |error|, 377 within 25%, 452 of 459 pairs, 8 of 16 runs with
every cell within 25%); v14's measurement. 24 new cells drawn (scripts/steptime_draw.py --seed 19 --before v19,
drawn once), none of v1-v18's combinations: llama-60m 1 x 64 checkpointed with accumulation on 2 ranks;
qwen2-tiny 1 x 32 checkpointed on 1, 1 x 256 with accumulation on 2 and 4 x 32 on 1 (neither); llama-tiny 2 x 64
with accumulation on 4; the GPT-2 shaped tiny 8 x 32 checkpointed on 4. The rule, v17's, written before either
run: v19 and v20 (v19 replicated on new cells, its fit exactly) run back to back, and the check counts as met
only if BOTH meet all three targets. Written before them too: if they do not, no further design is run on this
machine and issue 39's on-machine check is reported as not met here (the last pair of eighteen designs'
evidence; docs/steptime.md)."""
SETS_V20 = [
    dict(name="cal-gpt2-25m-w2", role="calibration", world_size=2, engines=ENGINES, **GPT2),
    dict(name="gpt2-25m-w2-b1x64-ckpt", role="held-out", world_size=2, model="gpt2-25m", micro_batch_size=1,
         block_size=64, gradient_checkpointing=True, engines="zero2,ds1,ds3,fsdp2-z2"),
    dict(name="cal-llama-tiny-w2", role="calibration", world_size=2, engines=ENGINES, **TINY),
    dict(name="tiny-w4-b8x128", role="held-out", world_size=4, model="tiny", micro_batch_size=8, block_size=128,
         engines="zero3,ds1,ds3,fsdp2-z3"),
    dict(name="cal-gpt2-25m-w1", role="calibration", world_size=1, engines=ENGINES, **GPT2),
    dict(name="llama-60m-w2-b1x64-accum2", role="held-out", world_size=2, model="llama-60m", micro_batch_size=1,
         block_size=64, grad_accum=2, engines="zero1,zero3,ds2,fsdp2-z2"),
    dict(name="cal-llama-tiny-w1", role="calibration", world_size=1, engines=ENGINES, **TINY),
    dict(name="llama-tiny-w4-b1x64-ckpt-accum2", role="held-out", world_size=4, model="llama-tiny",
         micro_batch_size=1, block_size=64, grad_accum=2, gradient_checkpointing=True,
         engines="ddp,ds2,ds3,fsdp2-z3"),
    dict(name="llama-tiny-w1-b4x256-ckpt", role="held-out", world_size=1, model="llama-tiny", micro_batch_size=4,
         block_size=256, gradient_checkpointing=True, engines="ddp,zero1,zero2,fsdp2-z3"),
    dict(name="qwen2-tiny-w1-b1x256", role="held-out", world_size=1, model="qwen2-tiny", micro_batch_size=1,
         block_size=256, engines="zero2,zero3,ds1,fsdp2-z2"),
]  # fmt: skip
"""Design v20, fixed and committed with v19, before either run measured anything: v19 REPLICATED on new cells.
v19's fit exactly (v19's own cells NOT added) and measurement; 24 new cells drawn (scripts/steptime_draw.py
--seed 20 --before v20, drawn once), none of v1-v19's combinations: gpt2-25m 1 x 64 checkpointed on 2 ranks;
the GPT-2 shaped tiny 8 x 128 on 4 (neither); llama-60m 1 x 64 with accumulation on 2; llama-tiny 1 x 64
checkpointed with accumulation on 4 and 4 x 256 checkpointed on 1; qwen2-tiny 1 x 256 on 1 (neither). Judged by
v19's rule: met only if v19 and v20 both meet all three targets."""
DESIGNS = {"v1": (SETS_V1, ("per_micro_batch_s", "per_param_s")),
           "v2": (SETS_V2, ("per_micro_batch_s", "per_param_s", "per_comm_s")),
           "v3": (SETS_V3, ("per_micro_batch_s", "per_param_s")),
           "v4": (SETS_V4, ("per_micro_batch_s", "per_param_s")),
           "v5": (SETS_V5, ("per_micro_batch_s", "per_param_s")),
           "v6": (SETS_V6, ("per_micro_batch_s", "per_param_s")),
           "v7": (SETS_V7, ("per_micro_batch_s", "per_param_s")),
           "v8": (SETS_V8, ("per_micro_batch_s", "per_param_s")),
           "v9": (SETS_V9, ("per_micro_batch_s", "per_param_s", "per_sync_s")),
           "v10": (SETS_V10, ("per_micro_batch_s", "per_param_s", "per_sync_s", "per_sync_peer_s")),
           "v11": (SETS_V11, ("per_micro_batch_s", "per_param_s", "per_sync_s", "per_sync_peer_s")),
           "v12": (SETS_V12, ("per_micro_batch_s", "per_param_s", "per_sync_s", "per_sync_peer_s")),
           "v13": (SETS_V13, ("per_micro_batch_s", "per_param_s", "per_sync_work_s", "per_sync_peer_s")),
           "v14": (SETS_V14, ("per_micro_batch_s", "per_param_s", "per_sync_work_s", "per_sync_peer_s")),
           "v15": (SETS_V15, ("per_micro_batch_s", "per_param_s", "per_sync_work_s", "per_sync_peer_s")),
           "v16": (SETS_V16, ("per_micro_batch_s", "per_param_s", "per_sync_work_s", "per_sync_peer_s")),
           "v17": (SETS_V17, ("per_micro_batch_s", "per_param_s", "per_sync_work_s", "per_sync_peer_s")),
           "v18": (SETS_V18, ("per_micro_batch_s", "per_param_s", "per_sync_work_s", "per_sync_peer_s")),
           "v19": (SETS_V19, ("per_micro_batch_s", "per_param_s", "per_sync_work_s", "per_sync_peer_s")),
           "v20": (SETS_V20, ("per_micro_batch_s", "per_param_s", "per_sync_work_s", "per_sync_peer_s"))}  # fmt: skip
STEPS_OF = {"v1": dict(steps=5, warmup=2), "v2": dict(steps=5, warmup=2), "v3": dict(steps=5, warmup=2),
            "v4": dict(steps=7, warmup=2), "v5": dict(steps=7, warmup=2), "v6": dict(steps=7, warmup=2),
            "v7": dict(steps=7, warmup=2), "v8": dict(steps=7, warmup=2), "v9": dict(steps=7, warmup=2),
            "v10": dict(steps=7, warmup=2), "v11": dict(steps=7, warmup=2), "v12": dict(steps=6, warmup=2, repeats=2),
            "v13": dict(steps=6, warmup=2, repeats=2), "v14": dict(steps=6, warmup=2, repeats=1, rounds=3),
            "v15": dict(steps=6, warmup=2, repeats=1, rounds=3), "v16": dict(steps=6, warmup=2, repeats=1, rounds=3),
            "v17": dict(steps=6, warmup=2, repeats=1, rounds=3),
            "v18": dict(steps=6, warmup=2, repeats=1, rounds=3),
            "v19": dict(steps=6, warmup=2, repeats=1, rounds=3),
            "v20": dict(steps=6, warmup=2, repeats=1, rounds=3)}  # fmt: skip
"""Each design's bench steps, warm-up steps (left out of a run's median) and runs per cell ("repeats", default 1:
interleaved in the set's one launch; the cell's step the median over its runs of each run's median) and launches
per set ("rounds", default 1; v14: 3, the cell's step the median over its launches of each launch's median)."""
SHARED_TERMS = ("per_logit_s", "per_ckpt_layer_s", "per_call_s")
FIT_OF = {
    "v5": dict(shared=SHARED_TERMS, relative=True, seen=("v3", "v4")),
    "v6": dict(shared=SHARED_TERMS, relative=True, seen=("v3", "v4", "v5")),
    "v7": dict(
        shared=("per_logit_s", "per_ckpt_layer_s", "per_sync_s", "per_oversubscribed_sync_s"),
        relative=True,
        seen=("v3", "v4", "v5", "v6"),
    ),
    "v8": dict(
        shared=("per_logit_s", "per_ckpt_layer_s", "per_sync_s", "per_oversubscribed_sync_s"),
        relative=True,
        seen=("v3", "v4", "v5", "v6", "v7"),
    ),
    "v9": dict(
        shared=("per_logit_s", "per_ckpt_layer_s", "per_oversubscribed_sync_s"),
        relative=True,
        seen=("v3", "v4", "v5", "v6", "v7", "v8"),
        speed=True,
        scale=True,
    ),
    "v10": dict(
        shared=("per_logit_s", "per_ckpt_layer_s", "per_oversubscribed_sync_s", "per_call_s"),
        relative=True,
        seen=("v3", "v4", "v5", "v6", "v7", "v8", "v9"),
        speed=True,
        scale=True,
    ),
    "v11": dict(
        shared=(
            "per_logit_s",
            "per_logit_rank_s",
            "per_ckpt_layer_s",
            "per_oversubscribed_sync_s",
            "per_call_s",
        ),
        relative=True,
        seen=("v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10"),
        speed=True,
        scale=True,
    ),
    "v12": dict(
        shared=(
            "per_logit_s",
            "per_logit_rank_s",
            "per_ckpt_layer_s",
            "per_oversubscribed_sync_s",
            "per_call_s",
        ),
        relative=True,
        seen=("v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10", "v11"),
        speed=True,
        scale=True,
    ),
    "v13": dict(
        shared=(
            "per_logit_s",
            "per_logit_rank_s",
            "per_ckpt_layer_s",
            "per_oversubscribed_sync_s",
            "per_call_s",
        ),
        relative=True,
        seen=("v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10", "v11", "v12"),
        speed=True,
        scale="nearest",
    ),
    "v16": dict(
        shared=("per_logit_s", "per_logit_rank_s", "per_oversubscribed_sync_s", "per_call_s", "per_op_s"),
        relative=True,
        seen=("v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10", "v11", "v12", "v13", "v14", "v15"),
        speed=True,
        scale="nearest",
    ),
}
"""How a design fits host work beyond its per-engine terms (v1-v4: none of this): terms shared by every engine
(timing.host_work.SHARED), least squares on relative error, and earlier runs' cells (steptime_check.SEEN) beside
its own calibration cells. Since design v7 every fit is non-negative (timing.host_work: a re-report of v5 or v6
fits them so too). v9: "speed", earlier runs' cells rescaled to the run's speed (host_work.at_speed); "scale",
every step x the run's own calibration cells' measured / predicted (host_work.run_scale); "own" (default 1),
how often the run's own calibration cells count. v13: scale "nearest", each cell x the run's calibration cells
of its nearest calibration shape and ranks (host_work.nearest_rows). v14: v13's, with v13's cells seen. v15:
v14's, exactly (a replication: v14's cells not added). v16: a cost per ATen op in place of the one per
checkpointed layer, v14's and v15's cells seen. v17: v16's, with v16's cells seen. v18: v17's, exactly. v19: v18's,
with v17's and v18's cells seen. v20: v19's, exactly."""
FIT_OF["v14"] = FIT_OF["v13"] | dict(seen=(*FIT_OF["v13"]["seen"], "v13"))  # v13's fit, v13's cells seen
FIT_OF["v15"] = FIT_OF["v14"]  # a replication: v14's fit exactly
FIT_OF["v17"] = FIT_OF["v16"] | dict(seen=(*FIT_OF["v16"]["seen"], "v16"))  # v16's fit, v16's cells seen
FIT_OF["v18"] = FIT_OF["v17"]  # a replication: v17's fit exactly
FIT_OF["v19"] = FIT_OF["v18"] | dict(seen=(*FIT_OF["v18"]["seen"], "v17", "v18"))  # v18's, v17/v18 seen
FIT_OF["v20"] = FIT_OF["v19"]  # a replication: v19's fit exactly
