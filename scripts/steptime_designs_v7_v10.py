"""The step-time check's designs v7-v10 (scripts/steptime_designs.py imports them): each design's bench sets,
kept exactly as committed before its run, so that a stored run can be re-scored from this file."""

from __future__ import annotations

from steptime_designs_v1_v6 import ENGINES, GPT2, TINY

SETS_V7 = [
    dict(name="cal-gpt2-25m-w2", role="calibration", world_size=2, engines=ENGINES, **GPT2),
    dict(name="qwen2-tiny-w4-b2x128-accum2", role="held-out", world_size=4, model="qwen2-tiny", micro_batch_size=2,
         block_size=128, grad_accum=2, engines="zero1,zero2,ds1,ds3"),
    dict(name="cal-llama-tiny-w2", role="calibration", world_size=2, engines=ENGINES, **TINY),
    dict(name="gpt2-25m-w4-b1x32", role="held-out", world_size=4, model="gpt2-25m", micro_batch_size=1,
         block_size=32, engines="ddp,zero2,ds3,fsdp2-z2"),
    dict(name="cal-gpt2-25m-w1", role="calibration", world_size=1, engines=ENGINES, **GPT2),
    dict(name="tiny-w2-b2x128", role="held-out", world_size=2, model="tiny", micro_batch_size=2, block_size=128,
         engines="ddp,zero3,ds2,fsdp2-z2"),
    dict(name="cal-llama-tiny-w1", role="calibration", world_size=1, engines=ENGINES, **TINY),
    dict(name="llama-tiny-w2-b4x64-ckpt-accum2", role="held-out", world_size=2, model="llama-tiny",
         micro_batch_size=4, block_size=64, grad_accum=2, gradient_checkpointing=True,
         engines="zero1,zero2,ds3,fsdp2-z3"),
    dict(name="llama-60m-w1-b1x32-accum2", role="held-out", world_size=1, model="llama-60m", micro_batch_size=1,
         block_size=32, grad_accum=2, engines="zero1,zero3,ds1,fsdp2-z2"),
    dict(name="qwen2-tiny-w1-b2x256-ckpt", role="held-out", world_size=1, model="qwen2-tiny", micro_batch_size=2,
         block_size=256, gradient_checkpointing=True, engines="ddp,zero3,ds2,fsdp2-z3"),
]  # fmt: skip
"""Design v7, fixed (and committed) after v6's run and the model changes it led to (the host-work fit
non-negative; a rank's waits counted where it blocks, step.sync_points, and a term per wait per rank beyond the
cores), before its own run measured anything. v1-v6's cells have all been seen: v7 fits (relative error,
non-negative) per engine per micro-batch and per parameter per reduction, and shared per logit element, per
checkpointed layer, per sync point and per sync point per rank beyond the cores (in place of v5's and v6's per
call), on v3's, v4's, v5's and v6's quiet runs' cells (docs/steptime-quiet/seen/) and its own calibration cells
(v3's 36 again, alternating); chosen on those cells only (scripts/steptime_crossval.py). It holds out 24 NEW
cells, none of v1-v6's (model, ranks, micro-batch x tokens, accumulation, checkpointing) combinations: qwen2-tiny
at 2 x 128 with accumulation on 4 ranks and at 2 x 256 checkpointed on 1; gpt2-25m at 1 x 32 on 4; the GPT-2
shaped tiny at 2 x 128 on 2; llama-tiny at 4 x 64 checkpointed with accumulation on 2; llama-60m at 1 x 32 with
accumulation on 1. Every engine in at least two held-out sets (ddp, zero1, zero2, zero3, ds3, fsdp2-z2: three;
ds1, ds2, fsdp2-z3: two); 1, 2 and 4 ranks, two sets each; five model shapes; checkpointing in two sets,
accumulation in three, neither in two. 7 steps, the median of 5."""
SETS_V8 = [
    dict(name="cal-gpt2-25m-w2", role="calibration", world_size=2, engines=ENGINES, **GPT2),
    dict(name="llama-tiny-w4-b1x128", role="held-out", world_size=4, model="llama-tiny", micro_batch_size=1,
         block_size=128, engines="ddp,zero1,ds2,fsdp2-z3"),
    dict(name="cal-llama-tiny-w2", role="calibration", world_size=2, engines=ENGINES, **TINY),
    dict(name="gpt2-25m-w2-b1x32-accum2", role="held-out", world_size=2, model="gpt2-25m", micro_batch_size=1,
         block_size=32, grad_accum=2, engines="zero2,zero3,ds1,fsdp2-z2"),
    dict(name="cal-gpt2-25m-w1", role="calibration", world_size=1, engines=ENGINES, **GPT2),
    dict(name="qwen2-tiny-w2-b2x64-ckpt", role="held-out", world_size=2, model="qwen2-tiny", micro_batch_size=2,
         block_size=64, gradient_checkpointing=True, engines="ddp,zero3,ds3,fsdp2-z3"),
    dict(name="cal-llama-tiny-w1", role="calibration", world_size=1, engines=ENGINES, **TINY),
    dict(name="tiny-w1-b2x128-accum2", role="held-out", world_size=1, model="tiny", micro_batch_size=2,
         block_size=128, grad_accum=2, engines="zero1,zero2,ds2,fsdp2-z2"),
    dict(name="llama-60m-w1-b1x64", role="held-out", world_size=1, model="llama-60m", micro_batch_size=1,
         block_size=64, engines="ddp,zero3,ds1,ds3"),
    dict(name="tiny-w4-b8x32-ckpt-accum2", role="held-out", world_size=4, model="tiny", micro_batch_size=8,
         block_size=32, grad_accum=2, gradient_checkpointing=True, engines="zero1,ds2,ds3,fsdp2-z2"),
]  # fmt: skip
"""Design v8, fixed (and committed) after v7's run and the calibration change it led to (contention the median
of 3 interleaved alone/together rounds, capped at 1 where it is recorded), before its own run measured anything.
v1-v7's cells have all been seen: v8 fits as v7 does (relative error, non-negative, the same per-engine and
shared terms) on v3's-v7's quiet runs' cells (docs/steptime-quiet/seen/) and its own calibration cells (v3's 36
again, alternating). It holds out 24 NEW cells, none of v1-v7's (model, ranks, micro-batch x tokens,
accumulation, checkpointing) combinations: llama-tiny at 1 x 128 on 4 ranks; the GPT-2 shaped tiny at 8 x 32
checkpointed with accumulation on 4 and at 2 x 128 with accumulation on 1; gpt2-25m at 1 x 32 with accumulation
on 2; qwen2-tiny at 2 x 64 checkpointed on 2; llama-60m at 1 x 64 on 1 (neither). Every engine in at least two
held-out sets (ddp, zero1, zero3, ds2, ds3, fsdp2-z2: three; zero2, ds1, fsdp2-z3: two); 1, 2 and 4 ranks, two
sets each; five model shapes; checkpointing in two sets, accumulation in three, neither in two. 7 steps, the
median of 5."""
SETS_V9 = [
    dict(name="cal-gpt2-25m-w2", role="calibration", world_size=2, engines=ENGINES, **GPT2),
    dict(name="qwen2-tiny-w4-b4x32-ckpt", role="held-out", world_size=4, model="qwen2-tiny", micro_batch_size=4,
         block_size=32, gradient_checkpointing=True, engines="ddp,zero2,ds2,fsdp2-z3"),
    dict(name="cal-llama-tiny-w2", role="calibration", world_size=2, engines=ENGINES, **TINY),
    dict(name="gpt2-25m-w1-b1x64-ckpt", role="held-out", world_size=1, model="gpt2-25m", micro_batch_size=1,
         block_size=64, gradient_checkpointing=True, engines="zero1,zero3,ds3,fsdp2-z2"),
    dict(name="cal-gpt2-25m-w1", role="calibration", world_size=1, engines=ENGINES, **GPT2),
    dict(name="llama-tiny-w2-b2x64", role="held-out", world_size=2, model="llama-tiny", micro_batch_size=2,
         block_size=64, engines="ddp,zero1,ds1,fsdp2-z3"),
    dict(name="cal-llama-tiny-w1", role="calibration", world_size=1, engines=ENGINES, **TINY),
    dict(name="tiny-w1-b4x64-accum2", role="held-out", world_size=1, model="tiny", micro_batch_size=4,
         block_size=64, grad_accum=2, engines="zero2,zero3,ds3,fsdp2-z2"),
    dict(name="llama-60m-w2-b1x32-accum2", role="held-out", world_size=2, model="llama-60m", micro_batch_size=1,
         block_size=32, grad_accum=2, engines="ddp,zero2,ds1,ds2"),
    dict(name="llama-tiny-w4-b2x64-ckpt-accum2", role="held-out", world_size=4, model="llama-tiny",
         micro_batch_size=2, block_size=64, grad_accum=2, gradient_checkpointing=True,
         engines="zero1,ds1,ds3,fsdp2-z2"),
]  # fmt: skip
"""Design v9, fixed (and committed) after v8's run and the model changes chosen on v3-v8's stored runs
(scripts/steptime_crossval.py, leave-one-run-out): every step scaled by the run's own calibration cells'
measured / predicted (Machine.step_scale, host_work.run_scale), and the cost of a wait fitted per engine
(host_work.TERMS per_sync_s; shared in v7 and v8), before its own run measured anything. v1-v8's cells have all
been seen: v9 fits per engine per micro-batch, per parameter per reduction and per sync point, shared per logit
element, per checkpointed layer and per sync point per rank beyond the cores (relative error, non-negative), on
v3's-v8's quiet runs' cells (docs/steptime-quiet/seen/), each run's cells rescaled to this run's speed
(host_work.at_speed), and its own calibration cells (v3's 36 again, alternating) once; then the step scale from
those 36. It holds out 24 NEW cells, none of v1-v8's (model, ranks, micro-batch x tokens, accumulation,
checkpointing) combinations: qwen2-tiny at 4 x 32 checkpointed on 4 ranks; gpt2-25m at 1 x 64 checkpointed on 1;
llama-tiny at 2 x 64 on 2 (neither) and at 2 x 64 checkpointed with accumulation on 4; the GPT-2 shaped tiny at
4 x 64 with accumulation on 1; llama-60m at 1 x 32 with accumulation on 2. Every engine in at least two held-out
sets (ddp, zero1, zero2, ds1, ds3, fsdp2-z2: three; zero3, ds2, fsdp2-z3: two); 1, 2 and 4 ranks, two sets each;
five model shapes; checkpointing in three sets, accumulation in three (one both), neither in one. 7 steps, the
median of 5."""
SETS_V10 = [
    dict(name="cal-gpt2-25m-w2", role="calibration", world_size=2, engines=ENGINES, **GPT2),
    dict(name="gpt2-25m-w2-b2x32-accum2", role="held-out", world_size=2, model="gpt2-25m", micro_batch_size=2,
         block_size=32, grad_accum=2, engines="zero1,zero3,ds2,fsdp2-z3"),
    dict(name="cal-llama-tiny-w2", role="calibration", world_size=2, engines=ENGINES, **TINY),
    dict(name="qwen2-tiny-w1-b4x64-ckpt", role="held-out", world_size=1, model="qwen2-tiny", micro_batch_size=4,
         block_size=64, gradient_checkpointing=True, engines="ddp,zero2,ds3,fsdp2-z2"),
    dict(name="cal-gpt2-25m-w1", role="calibration", world_size=1, engines=ENGINES, **GPT2),
    dict(name="llama-tiny-w4-b4x64-accum2", role="held-out", world_size=4, model="llama-tiny", micro_batch_size=4,
         block_size=64, grad_accum=2, engines="ddp,zero3,ds1,ds3"),
    dict(name="cal-llama-tiny-w1", role="calibration", world_size=1, engines=ENGINES, **TINY),
    dict(name="tiny-w2-b4x64", role="held-out", world_size=2, model="tiny", micro_batch_size=4, block_size=64,
         engines="zero2,ds1,ds3,fsdp2-z3"),
    dict(name="llama-60m-w1-b1x32-ckpt", role="held-out", world_size=1, model="llama-60m", micro_batch_size=1,
         block_size=32, gradient_checkpointing=True, engines="zero1,zero2,ds2,fsdp2-z2"),
    dict(name="gpt2-25m-w4-b1x64-ckpt-accum2", role="held-out", world_size=4, model="gpt2-25m",
         micro_batch_size=1, block_size=64, grad_accum=2, gradient_checkpointing=True,
         engines="ddp,zero3,ds1,fsdp2-z2"),
]  # fmt: skip
"""Design v10, fixed (and committed) after v9's run and the model changes chosen on v3-v9's stored runs
(scripts/steptime_crossval.py, leave-one-run-out): a wait's cost growing with the ranks it waits for, per engine
(host_work.TERMS per_sync_peer_s), and a cost per collective call shared by every engine beside the waits
(per_call_s, as in v5 and v6), before its own run measured anything. v1-v9's cells have all been seen: v10
fits per engine per micro-batch, per parameter per reduction, per sync point and per sync point per peer,
shared per logit element, per checkpointed layer, per sync point per rank beyond the cores and per collective
call (relative error, non-negative), on v3's-v9's quiet runs' cells rescaled to this run's speed and its own
calibration cells (v3's 36 again, alternating) once; then the step scale from those 36. It holds out 24 NEW
cells, none of v1-v9's (model, ranks, micro-batch x tokens, accumulation, checkpointing) combinations, chosen by
coverage: gpt2-25m at 2 x 32 with accumulation on 2 ranks and at 1 x 64 checkpointed with accumulation on 4;
qwen2-tiny at 4 x 64 checkpointed on 1; llama-tiny at 4 x 64 with accumulation on 4; the GPT-2 shaped tiny at
4 x 64 on 2 (neither); llama-60m at 1 x 32 checkpointed on 1. Every engine in at least two held-out sets (ddp,
zero2, zero3, ds1, ds3, fsdp2-z2: three, ds3 at 1, 2 and 4 ranks; zero1, ds2, fsdp2-z3: two); 1, 2 and 4
ranks, two sets each; five model shapes; checkpointing in three sets, accumulation in
three (one both), neither in one. 7 steps, the median of 5."""
