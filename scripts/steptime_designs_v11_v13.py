"""The step-time check's designs v11-v13 (scripts/steptime_designs.py imports them): each design's bench sets and
why, kept exactly as committed before its run, so that a stored run can be re-scored from this file."""

from __future__ import annotations

from steptime_designs_v1_v6 import ENGINES, GPT2, TINY

SETS_V11 = [
    dict(name="cal-gpt2-25m-w2", role="calibration", world_size=2, engines=ENGINES, **GPT2),
    dict(name="gpt2-25m-w1-b2x32-accum2", role="held-out", world_size=1, model="gpt2-25m", micro_batch_size=2,
         block_size=32, grad_accum=2, engines="ddp,zero2,ds1,fsdp2-z3"),
    dict(name="cal-llama-tiny-w2", role="calibration", world_size=2, engines=ENGINES, **TINY),
    dict(name="llama-tiny-w2-b1x64-ckpt", role="held-out", world_size=2, model="llama-tiny", micro_batch_size=1,
         block_size=64, gradient_checkpointing=True, engines="zero1,zero2,ds3,fsdp2-z2"),
    dict(name="cal-gpt2-25m-w1", role="calibration", world_size=1, engines=ENGINES, **GPT2),
    dict(name="llama-tiny-w4-b2x128", role="held-out", world_size=4, model="llama-tiny", micro_batch_size=2,
         block_size=128, engines="ddp,zero3,ds3,fsdp2-z3"),
    dict(name="cal-llama-tiny-w1", role="calibration", world_size=1, engines=ENGINES, **TINY),
    dict(name="tiny-w2-b8x32-accum2", role="held-out", world_size=2, model="tiny", micro_batch_size=8, block_size=32,
         grad_accum=2, engines="ddp,zero3,ds1,ds2"),
    dict(name="qwen2-tiny-w1-b2x64-ckpt-accum2", role="held-out", world_size=1, model="qwen2-tiny",
         micro_batch_size=2, block_size=64, grad_accum=2, gradient_checkpointing=True,
         engines="zero1,zero3,ds2,fsdp2-z2"),
    dict(name="gpt2-25m-w4-b1x32-ckpt", role="held-out", world_size=4, model="gpt2-25m", micro_batch_size=1,
         block_size=32, gradient_checkpointing=True, engines="zero1,zero2,ds1,ds2"),
]  # fmt: skip
"""Design v11, fixed (and committed) after v10's run and the model change chosen on v3-v10's stored runs
(scripts/steptime_crossval.py, leave-one-run-out, 199 cells): the loss's work at the LM head split into a part
stretched by ranks / cores and a part not (host_work.SHARED per_logit_rank_s, beside per_logit_s), before its own
run measured anything. v1-v10's cells have all been seen: v11 fits as v10 does (per engine per micro-batch, per
parameter per reduction, per sync point and per sync point per peer; shared per logit element stretched and not,
per checkpointed layer, per sync point per rank beyond the cores and per collective call; relative error,
non-negative) on v3's-v10's quiet runs' cells rescaled to this run's speed and its own calibration cells (v3's 36
again, alternating) once; then the step scale from those 36. It holds out 24 NEW cells, none of v1-v10's (model,
ranks, micro-batch x tokens, accumulation, checkpointing) combinations, chosen by coverage: gpt2-25m at 2 x 32
with accumulation on 1 rank and at 1 x 32 checkpointed on 4; llama-tiny at 1 x 64 checkpointed on 2 and at
2 x 128 on 4 (neither); the GPT-2 shaped tiny at 8 x 32 with accumulation on 2; qwen2-tiny at 2 x 64
checkpointed with accumulation on 1. Every engine in at least two held-out sets (ddp, zero1, zero2, zero3, ds1,
ds2: three; ds3, fsdp2-z2, fsdp2-z3: two); 1, 2 and 4 ranks, two sets each; four model shapes; checkpointing in
three sets, accumulation in three (one both), neither in one. 7 steps, the median of 5."""
SETS_V12 = [
    dict(name="cal-gpt2-25m-w2", role="calibration", world_size=2, engines=ENGINES, **GPT2),
    dict(name="llama-60m-w1-b1x32", role="held-out", world_size=1, model="llama-60m", micro_batch_size=1,
         block_size=32, engines="ddp,zero3,ds2,fsdp2-z3"),
    dict(name="cal-llama-tiny-w2", role="calibration", world_size=2, engines=ENGINES, **TINY),
    dict(name="gpt2-25m-w2-b1x32-ckpt", role="held-out", world_size=2, model="gpt2-25m", micro_batch_size=1,
         block_size=32, gradient_checkpointing=True, engines="ddp,zero2,ds3,fsdp2-z3"),
    dict(name="cal-gpt2-25m-w1", role="calibration", world_size=1, engines=ENGINES, **GPT2),
    dict(name="qwen2-tiny-w4-b2x64-ckpt-accum2", role="held-out", world_size=4, model="qwen2-tiny",
         micro_batch_size=2, block_size=64, grad_accum=2, gradient_checkpointing=True,
         engines="zero2,ds3,fsdp2-z2,fsdp2-z3"),
    dict(name="cal-llama-tiny-w1", role="calibration", world_size=1, engines=ENGINES, **TINY),
    dict(name="tiny-w1-b4x128-ckpt-accum2", role="held-out", world_size=1, model="tiny", micro_batch_size=4,
         block_size=128, grad_accum=2, gradient_checkpointing=True, engines="zero1,zero2,ds1,fsdp2-z2"),
    dict(name="llama-tiny-w2-b8x32-accum2", role="held-out", world_size=2, model="llama-tiny", micro_batch_size=8,
         block_size=32, grad_accum=2, engines="zero1,zero3,ds1,ds2"),
    dict(name="llama-tiny-w4-b4x32", role="held-out", world_size=4, model="llama-tiny", micro_batch_size=4,
         block_size=32, engines="ddp,zero1,ds1,ds3"),
]  # fmt: skip
"""Design v12, fixed (and committed) after v11's run, before its own run measured anything. No model change: v11's
fit (per engine per micro-batch, per parameter per reduction, per sync point and per sync point per peer; shared
per logit element stretched and not, per checkpointed layer, per sync point per rank beyond the cores and per
collective call; relative error, non-negative) on v3's-v11's quiet runs' cells rescaled to this run's speed and
its own calibration cells (v3's 36 again, alternating) once; then the step scale from those 36. What changes is
the MEASUREMENT, for calibration and held-out cells alike: each engine runs twice in its set's one launch, the
two runs interleaved (every engine once, then every engine again), 6 steps each of which 2 warm-up; a cell's
step is the median over its two runs of each run's median of 4 steps (their mean). On the stored runs the same
calibration cell, measured once per run, moved 10% (std of log, after each run's speed; median |deviation|
5.6%, 90th percentile 14%) between v3-v11 (v7 left out), where a run's median of 5 steps moves ~4% by its own
steps: most of it is the run's, not its steps'; two runs of one cell in one launch differed by 6.6-9.5% (std,
2026-11-29 03:31-03:33, cal-llama-tiny-w2 three times and cal-gpt2-25m-w1 twice). It holds out 24 NEW cells,
none of v1-v11's (model, ranks, micro-batch x tokens, accumulation, checkpointing) combinations, chosen by
coverage: llama-60m at 1 x 32 on 1 rank (neither); gpt2-25m at 1 x 32 checkpointed on 2; qwen2-tiny at 2 x 64
checkpointed with accumulation on 4; the GPT-2 shaped tiny at 4 x 128 checkpointed with accumulation on 1;
llama-tiny at 8 x 32 with accumulation on 2 and at 4 x 32 on 4 (neither). Every engine in at least two held-out
sets (ddp, zero1, zero2, ds1, ds3, fsdp2-z3: three; zero3, ds2, fsdp2-z2: two); 1, 2 and 4 ranks, two sets each;
five model shapes; checkpointing in three sets, accumulation in three (two both), neither in two."""
SETS_V13 = [
    dict(name="cal-gpt2-25m-w2", role="calibration", world_size=2, engines=ENGINES, **GPT2),
    dict(name="tiny-w2-b2x64", role="held-out", world_size=2, model="tiny", micro_batch_size=2, block_size=64,
         engines="ddp,zero1,ds2,fsdp2-z3"),
    dict(name="cal-llama-tiny-w2", role="calibration", world_size=2, engines=ENGINES, **TINY),
    dict(name="qwen2-tiny-w1-b2x128-accum2", role="held-out", world_size=1, model="qwen2-tiny", micro_batch_size=2,
         block_size=128, grad_accum=2, engines="zero2,zero3,ds1,ds3"),
    dict(name="cal-gpt2-25m-w1", role="calibration", world_size=1, engines=ENGINES, **GPT2),
    dict(name="llama-tiny-w4-b1x64-ckpt", role="held-out", world_size=4, model="llama-tiny", micro_batch_size=1,
         block_size=64, gradient_checkpointing=True, engines="ddp,zero2,ds2,fsdp2-z2"),
    dict(name="cal-llama-tiny-w1", role="calibration", world_size=1, engines=ENGINES, **TINY),
    dict(name="gpt2-25m-w1-b1x32-ckpt", role="held-out", world_size=1, model="gpt2-25m", micro_batch_size=1,
         block_size=32, gradient_checkpointing=True, engines="zero1,zero3,ds3,fsdp2-z3"),
    dict(name="llama-60m-w2-b1x32", role="held-out", world_size=2, model="llama-60m", micro_batch_size=1,
         block_size=32, engines="ddp,zero3,ds1,fsdp2-z2"),
    dict(name="qwen2-tiny-w4-b2x32-ckpt-accum2", role="held-out", world_size=4, model="qwen2-tiny",
         micro_batch_size=2, block_size=32, grad_accum=2, gradient_checkpointing=True,
         engines="zero1,ds1,ds3,fsdp2-z3"),
]  # fmt: skip
"""Design v13, fixed (and committed) after v12's run and the model change chosen on v3-v12's stored runs
(scripts/steptime_crossval.py --fit v13, leave-one-run-out, 247 cells: 8.54% median |error|, 241 within 25%, 298
of 302 pairs, -24.8% .. +31.9%; the 17 cells measured under 0.07 s signed median +7.5%, median |error| 13.4%;
v12's fit 8.68%, 239, 297, -35.5% .. +33.4%, +12.0%, 17.5%), before its own run measured anything: a wait's
cost per engine grows with the step's other terms (host_work.TERMS per_sync_work_s, in place of per_sync_s), and
each held-out cell is scaled by the run's calibration cells of its nearest calibration shape and ranks
(host_work.nearest_rows; FIT_OF scale "nearest") instead of all 36. v1-v12's cells have all been seen: v13 fits
per engine per micro-batch, per parameter per reduction, per sync point per second of the other terms and per
sync point per peer; shared per logit element stretched and not, per checkpointed layer, per sync point per rank
beyond the cores and per collective call (relative error, non-negative), on v3's-v12's quiet runs' cells
rescaled to this run's speed and its own calibration cells (v3's 36 again, alternating) once. The measurement
is v12's (each engine twice in its set's launch, interleaved; 6 steps of which 2 warm-up). It holds out 24 NEW
cells, none of v1-v12's (model, ranks, micro-batch x tokens, accumulation, checkpointing) combinations, chosen by
coverage and for small steps (the remaining miss): the GPT-2 shaped tiny at 2 x 64 on 2 ranks (neither);
qwen2-tiny at 2 x 128 with accumulation on 1 and at 2 x 32 checkpointed with accumulation on 4; llama-tiny at
1 x 64 checkpointed on 4; gpt2-25m at 1 x 32 checkpointed on 1; llama-60m at 1 x 32 on 2 (neither). Every
engine in at least two held-out sets (ddp, zero1, zero3, ds1, ds3, fsdp2-z3: three; zero2, ds2, fsdp2-z2: two);
1, 2 and 4 ranks, two sets each; five model shapes; checkpointing in three sets, accumulation in two (one both),
neither in two."""
