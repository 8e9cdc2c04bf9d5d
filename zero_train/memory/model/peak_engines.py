"""Per engine, the bytes one rank holds at the highest point of each phase (zero_train.memory.model.peak).

Every function returns {phase: {term: bytes}} for the phases of zero_train.memory.model.peak.PHASES. Terms named
like the probe's categories (params, grads, master_params, optimizer_states, comm_buffers) are model
states; the others are transients (zero_train.memory.model.peak_terms). States "at rest" are what the engine
keeps between steps, i.e. during the next forward.
"""

from __future__ import annotations

from zero_train.memory.model.flat_partition import Partition
from zero_train.memory.model.peak_terms import (
    FP32_BYTES,
    FP64_BYTES,
    Phases,
    Run,
    activation_terms,
    activations,
    adamw_temporaries,
    add_terms,
    largest_moment,
    local_step_temporaries,
    loss_backward,
    loss_backward_moments,
    our_gradient_bytes,
    reduce_buckets,
    tied_gradient_copies,
)
from zero_train.memory.model.sharder_layout import SharderLayout, Share, zero1_comm_buffers, zero2_buffers


def _phases(rest: dict, *, forward: dict, backward_start: dict, backward_end: dict, step: dict) -> Phases:
    return dict(
        forward=add_terms(rest, forward),
        backward_start=add_terms(rest, backward_start),
        backward_end=add_terms(rest, backward_end),
        step=add_terms(rest, step),
    )


def _owned_step(run: Run, share: Share) -> dict[str, int]:
    """Our ZeRO-1/2's step: the owned gradients cast to fp32 (a 16-bit accumulator; an fp32 one, the default, is
    the masters' gradients itself) and AdamW's temporaries over the owned elements."""
    return dict(
        fp32_grads=FP32_BYTES * share.owned if our_gradient_bytes(run)[0] != FP32_BYTES else 0,
        adamw_temporaries=local_step_temporaries(run, share.owned),
    )


def _owned_phases(run: Run, share: Share, rest: dict, end: dict) -> Phases:
    """Our ZeRO-1/2's phases over what they hold at `rest`: every engine's forward, `end` at the end of backward
    (with a recomputed block where checkpointing), the owned step."""
    forward, backward_start = _forward_terms(run)
    return _phases(
        rest,
        forward=forward,
        backward_start=backward_start,
        backward_end=_recompute(run, {}, end),
        step=_owned_step(run, share),
    )


def _forward_terms(run: Run, held: dict | None = None) -> tuple[dict, dict]:
    """(forward, backward_start) transients every engine shares: activations and the loss's tensors, plus
    `held`, what the engine keeps from earlier micro-batches (`_accumulated`)."""
    terms = activation_terms(run)
    return (
        add_terms(dict(activations=terms.saved_bytes, loss_temporaries=terms.loss_bytes), held or {}),
        add_terms(dict(activations=terms.saved_bytes, loss_gradients=loss_backward(run)), held or {}),
    )


def _accumulated(run: Run, grads: int) -> dict[str, int]:
    """Gradient accumulation: from the second micro-batch of a step on, the `grads` bytes the engine keeps
    between micro-batches live through its forward and backward (nothing with one micro-batch per step)."""
    return dict(accumulated_grads=grads) if run.grad_accum > 1 else {}


def _accumulating(run: Run) -> dict[str, int]:
    """Accumulating into an existing gradient (autograd's AccumulateGrad: `grad += new`): the new gradient
    of the largest tensor is alive beside the old one (0 with one micro-batch per step)."""
    return dict(accumulating_gradient=run.element_bytes * run.largest_tensor) if run.grad_accum > 1 else {}


def _recompute(run: Run, held: dict, end: dict) -> dict:
    """The end of backward with activation checkpointing: the larger of `end` and the first block's
    recomputation (its activations alive beside the gradients `held` by then); `end` without it."""
    recompute = activation_terms(run).recompute_bytes
    return largest_moment(end, add_terms(held, dict(recomputed_block=recompute))) if recompute else end


def ddp_phases(run: Run, share: Share, layout: SharderLayout | None = None) -> Phases:
    """torch DDP (zero_train.engines.ddp; `share` owns everything) or ZeroRedundancyOptimizer under DDP.

    `layout` is not read (neither holds a sharder's buffers): taken so every replicated or whole-tensor model is
    called alike (zero_train.memory.model.peak).

    At rest: the model, DDP's flat gradient buckets (a second copy of every gradient,
    gradient_as_bucket_view=False), fp32 masters of a 16-bit model (whole, also under torch's ZeRO), Adam's
    moments (the owned share only with torch's ZeRO). Backward allocates every gradient (e Psi); the step
    keeps them, adds the fp32 master gradients of a 16-bit model (MasterWeights.grads_to_master: 4 Psi)
    and AdamW's temporaries for its largest tensor (in-sample figures: docs/memory_model.md#the-peak-model).
    """
    e, psi, trained = run.element_bytes, run.shape.num_params, run.trained
    rest = dict(
        params=e * psi,
        master_params=FP32_BYTES * trained if run.mixed else 0,
        optimizer_states=2 * FP32_BYTES * share.owned,
        comm_buffers=e * trained,  # DDP buckets the parameters that require a gradient
    )
    forward, backward_start = _forward_terms(run, _accumulated(run, e * trained))
    end = add_terms(
        dict(grads=e * trained, tied_gradient_copies=2 * tied_gradient_copies(run)), _accumulating(run)
    )
    return _phases(
        rest,
        forward=forward,
        backward_start=backward_start,
        backward_end=_recompute(run, dict(grads=e * trained), end),
        step=dict(
            grads=e * trained,
            fp32_grads=FP32_BYTES * trained if run.mixed else 0,
            adamw_temporaries=local_step_temporaries(run, share.owned),
        ),
    )


def zero1_phases(run: Run, share: Share, layout: SharderLayout) -> Phases:
    """Our ZeRO-1 (zero_train.sharding.zero12.zero1): every gradient lands in a flat buffer allocated once.

    At rest: the model, the flat gradient buffer (whole), padding and the gloo ring's receive buffer, and
    for the owned slice the fp32 masters (16-bit model) and Adam's moments. Backward only passes each
    gradient through to its slot; the step converts the owned gradients to fp32 (16-bit model, one piece
    at a time, all kept until the step ends) and runs AdamW on the owned pieces (in-sample figures:
    docs/memory_model.md#the-peak-model).
    """
    e, psi = run.element_bytes, run.shape.num_params
    g = our_gradient_bytes(run)[0]  # the flat gradient buffer's dtype: fp32 by default
    rest = dict(
        params=e * psi,
        grads=g * run.trained,  # LoRA: the flat gradient buffer holds the adapters only
        master_params=FP32_BYTES * share.owned if run.mixed else 0,
        optimizer_states=2 * FP32_BYTES * share.owned,
        comm_buffers=zero1_comm_buffers(run, layout),
    )
    # accumulation: in the flat buffer, already at rest
    end = add_terms(dict(tied_gradient_copies=3 * tied_gradient_copies(run)), _accumulating(run))
    return _owned_phases(run, share, rest, end)


def zero2_phases(run: Run, share: Share, layout: SharderLayout) -> Phases:
    """Our ZeRO-2 (zero_train.sharding.zero12.zero2): each gradient is reduced to its owner with its bucket.

    At rest: the model, the accumulator of the owned gradients (e x owned), and, kept between steps
    (DeepSpeed frees its bucket at the end of backward), the bucket buffer, the gloo ring's receive buffer
    and the parameter buffer's padding; for the owned share the fp32 masters (16-bit model) and Adam's
    moments. Backward holds each gradient until its bucket is complete: at its start that is the LM head's
    weight gradient, already in loss_backward's term; later at most the largest bucket's tensors, or at its
    end a tied embedding's two contributions and their sum. The step is ZeRO-1's (in-sample figures:
    docs/memory_model.md#the-peak-model).
    """
    e, psi = run.element_bytes, run.shape.num_params
    g = our_gradient_bytes(run)[0]  # the owned accumulator's dtype: fp32 by default
    comm_buffers, largest_bucket = zero2_buffers(run, layout)
    rest = dict(
        params=e * psi,
        grads=g * share.owned,
        master_params=FP32_BYTES * share.owned if run.mixed else 0,
        optimizer_states=2 * FP32_BYTES * share.owned,
        comm_buffers=comm_buffers,
    )
    # accumulation: into the owned accumulator at rest; every micro-step's gradients are released
    pending = dict(pending_grads=e * largest_bucket)
    end = largest_moment(pending, dict(tied_gradient_copies=3 * tied_gradient_copies(run)))
    return _owned_phases(run, share, rest, end)


def _deepspeed_step(run: Run, part: Partition, stage: int) -> dict[str, int]:
    """DeepSpeed's optimizer step (stage_1_and_2.py / stage3.py `step`), its largest moment.

    First the gradient norm, in fp64, one gradient piece at a time (an 8-byte copy of the largest). ZeRO-1/2
    then flatten the gradient partition into a copy, convert it to fp32 (the 16-bit gradients then freed),
    run torch's AdamW on that ONE flat fp32 tensor (torch_adam: partition-sized temporaries) and all-gather
    the updated parameters, on gloo through a flat output buffer of the whole model. ZeRO-3 keeps its
    gradient partition and steps an fp32 copy per sub-group (in-sample figures:
    docs/memory_model.md#the-peak-model).
    """
    e, settings, size = run.element_bytes, run.deepspeed, part.elements
    if stage == 3:
        group = min(size, settings.sub_group_size)
        temporaries = adamw_temporaries(group) if settings.torch_adam else 0
        largest_piece = -(-run.largest_tensor // run.world_size)  # ZeRO-3 splits every tensor over the ranks
        return largest_moment(
            dict(norm_fp64_copy=FP64_BYTES * largest_piece),
            dict(fp32_grads=FP32_BYTES * group, adamw_temporaries=temporaries),
        )
    held = dict(grads=e * part.touched)
    norm = add_terms(held, dict(norm_fp64_copy=FP64_BYTES * part.largest_piece))
    flatten = add_terms(
        held, dict(grad_partition_copy=e * size, fp32_grads=FP32_BYTES * size if run.mixed else 0)
    )
    update = dict(
        fp32_grads=FP32_BYTES * size, adamw_temporaries=adamw_temporaries(size) if settings.torch_adam else 0
    )
    gather = dict(gather_buffer=e * run.trained if run.backend == "gloo" and run.world_size > 1 else 0)
    return largest_moment(norm, flatten, update, gather)


def _deepspeed_rest(run: Run, part: Partition, stage: int) -> dict[str, int]:
    """What DeepSpeed keeps between steps: the 16-bit model (ZeRO-3: its partition, plus the tensors under
    stage3_param_persistence_threshold whole), an fp32 master partition (even in fp32: the optimizer steps
    a clone), Adam's moments; ZeRO-3 also its gradient partition and its reduce bucket."""
    e, size = run.element_bytes, part.elements
    rest = dict(master_params=FP32_BYTES * size, optimizer_states=2 * FP32_BYTES * size)
    if stage < 3:
        return dict(params=e * run.shape.num_params, **rest)
    threshold = run.deepspeed.persistence_threshold
    persistent = sum(n for n in run.shape.param_numels if n < threshold)
    # LoRA: the frozen base is partitioned too, but has no fp32 partition (the optimizer's is the adapters')
    partitioned = -(-run.shape.num_params // run.world_size) if run.shape.frozen_base else size
    params = e * (partitioned + persistent) if run.world_size > 1 else e * partitioned
    return dict(params=params, grads=e * size, comm_buffers=reduce_buckets(run, 3), **rest)


def _zero3_phases(run: Run, part: Partition, rest: dict) -> Phases:
    """ZeRO-3: every parameter gathered (N > 1: e x min(Psi, stage3_max_live_parameters)) from forward until
    the end of backward; gradients reduced into the kept partition (docs/memory_model.md#the-peak-model)."""
    e, psi = run.element_bytes, run.shape.num_params
    live = min(psi, run.deepspeed.max_live_parameters)
    gathered = dict(gathered_params=e * live if run.world_size > 1 else 0)
    forward, backward_start = _forward_terms(run)  # accumulation: into the gradient partition at rest
    end = add_terms(gathered, dict(tied_gradient_copies=3 * tied_gradient_copies(run)))
    return _phases(
        rest,
        forward=add_terms(forward, gathered),
        backward_start=add_terms(backward_start, gathered),
        backward_end=_recompute(run, gathered, end),
        step=_deepspeed_step(run, part, 3),
    )


def deepspeed_phases(run: Run, stage: int, part: Partition) -> Phases:
    """DeepSpeed ZeRO-1/2/3 (DeepSpeed 0.19's runtime/zero/stage_1_and_2.py and stage3.py), rank `part`.

    Backward: ZeRO-1 (no overlap_comm) lets every gradient accumulate whole and copies its partition's
    tensors out at the end (e Psi + e x touched alive); ZeRO-2 copies each gradient through the reduce
    bucket into its partition's buffer as it comes (e x touched, allocated at its first reduction: after
    the loss's gradients, while the LM head's gradient is alive); docs/memory_model.md#the-peak-model.
    """
    rest = _deepspeed_rest(run, part, stage)
    if stage == 3:
        return _zero3_phases(run, part, rest)
    e, saved = run.element_bytes, activations(run)
    tied = tied_gradient_copies(run)
    buckets = dict(comm_buffers=reduce_buckets(run, stage))
    if stage == 1:  # accumulation: whole gradients in param.grad until the boundary (reduce_gradients)
        held = _accumulated(run, e * run.trained)
        forward, backward_start = _forward_terms(run, held)
        copy = largest_moment(dict(grad_partition_copy=e * part.touched), dict(tied_gradient_copies=2 * tied))
        backward_start = add_terms(backward_start, buckets)
        grads = dict(grads=e * run.trained)
        backward_end = _recompute(
            run, add_terms(buckets, grads), add_terms(buckets, grads, copy, _accumulating(run))
        )
    else:  # accumulation: every micro-batch reduces into the partition buffer, kept until the step
        held = _accumulated(run, e * part.touched)
        forward, _ = _forward_terms(run, held)
        at_log_softmax, at_head_matmul = loss_backward_moments(run)
        first_reduction = dict(activations=saved, loss_gradients=at_head_matmul, grads=e * part.touched)
        backward_start = largest_moment(
            add_terms(dict(activations=saved, loss_gradients=at_log_softmax), held),
            add_terms(first_reduction, buckets),
        )
        grads = add_terms(buckets, dict(grads=e * part.touched))
        backward_end = _recompute(run, grads, add_terms(grads, dict(tied_gradient_copies=3 * tied)))
    return _phases(
        rest,
        forward=forward,
        backward_start=backward_start,
        backward_end=backward_end,
        step=_deepspeed_step(run, part, stage),
    )


def deepspeed_boundary(run: Run, stage: int, part: Partition) -> dict[str, int]:
    """DeepSpeed's model states at the step boundary: at rest, plus ZeRO-1/2's gradients of the tensors in the
    partition (the reduce bucket is released at the end of backward; measured comm_buffers 0 for ZeRO-1/2)."""
    rest = _deepspeed_rest(run, part, stage)
    return rest if stage == 3 else add_terms(rest, dict(grads=run.element_bytes * part.touched))
