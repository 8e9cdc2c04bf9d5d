"""FSDP2 (zero_train.engines.fsdp2: torch fully_shard per block + root) in the per-phase peak model.

Every parameter tensor is split over the N ranks along its first dimension (P = sum ceil(n / N) elements
per rank), in fp32: the shards are the optimizer's parameters, and with a 16-bit policy also the masters.
A unit (one transformer block, or the root: embeddings, final norm, LM head) is all-gathered in the
compute dtype for its forward and again for its backward, and its gradients are reduce-scattered (fp32 by
default) into the fp32 gradient shards as soon as its backward ends. The two modes differ in what stays
gathered:

    stage 3 (reshard_after_forward=True)   the root (FSDP2 never reshards the root after forward: backward
                                           needs it at once) + the block being computed (in backward also
                                           the next one, which FSDP2 prefetches)
    stage 2 (reshard_after_forward=False)  every block, from its forward until its backward ends: e x Psi at
                                           the end of forward, as DeepSpeed ZeRO-2 holds the whole model

Units: the root is the embedding (and an untied LM head); the blocks share the rest evenly (a GPT-2's
position embedding is counted in the blocks: < 1% of a block on the presets).
"""

from __future__ import annotations

# The same terms as peak_zero3 imports: both models are sums of peak_terms' pieces, written once there.
from zero_train.memory.model.peak_terms import (
    FP32_BYTES,
    Phases,
    Run,
    activation_terms,
    add_terms,
    gathered_units,
    largest_moment,
    local_step_temporaries,
    loss_backward,
    tied_gradient_copies,
)


def shard_elements(run: Run, *, trained: bool = False) -> int:
    """P: elements of this rank's shards (every tensor split along dim 0, rounded up per tensor); with
    `trained`, of the trainable tensors only (LoRA: the adapters)."""
    if trained and run.shape.frozen_base:
        return sum(-(-n // run.world_size) for n in run.shape.trained_numels)
    numels = run.shape.param_numels or (run.shape.num_params,)
    return sum(-(-n // run.world_size) for n in numels)


def unit_elements(run: Run) -> tuple[int, int]:
    """(root, one block) parameter elements, the all-gather units: the root is the embedding and an untied head."""
    embedding, head, block = gathered_units(run)
    return embedding + head, block


def fsdp2_rest(run: Run) -> dict[str, int]:
    """Between steps: the fp32 shards (params in fp32, master_params under a 16-bit policy) and Adam's moments;
    LoRA: the frozen base's shards in the compute dtype (zero_train.engines.fsdp2 stores them so)."""
    trained = shard_elements(run, trained=True)
    frozen = shard_elements(run) - trained
    shards = FP32_BYTES * trained
    return dict(
        params=run.element_bytes * frozen + (0 if run.mixed else shards),
        master_params=shards if run.mixed else 0,
        optimizer_states=2 * shards,
    )


def fsdp2_boundary(run: Run) -> dict[str, int]:
    """The probe's categories at the step boundary: at rest + the fp32 gradient shards."""
    return add_terms(fsdp2_rest(run), dict(grads=FP32_BYTES * shard_elements(run, trained=True)))


def fsdp2_phases(run: Run, stage: int) -> Phases:
    """{phase: {term: bytes}} for FSDP2 in the mode of config stage 2 or 3.

    Args:
        run: the run.
        stage: 3 reshards every block after its forward; 2 keeps the blocks gathered until their backward.
    """
    e, psi = run.element_bytes, run.shape.num_params
    root, block = unit_elements(run)
    rest, grad_shards = fsdp2_rest(run), dict(grads=FP32_BYTES * shard_elements(run, trained=True))
    during_forward = e * (root + block) if stage == 3 else e * psi
    during_backward = e * (root + 2 * block) if stage == 3 else e * psi  # backward prefetches the next block
    terms = activation_terms(run)
    saved = terms.saved_bytes
    # accumulation: the fp32 gradient shards of earlier micro-batches live through the later ones
    held = dict(accumulated_grads=grad_shards["grads"]) if run.grad_accum > 1 else {}
    root_reduce = dict(
        gathered_params=e * root,
        # the reduce dtype's copy of the root's gradients (LoRA: the root is frozen)
        fp32_grads=FP32_BYTES * root if run.mixed and not run.shape.frozen_base else 0,
        tied_gradient_copies=3 * tied_gradient_copies(run),
    )
    return dict(
        forward=add_terms(
            rest,
            held,
            dict(gathered_params=during_forward, activations=saved, loss_temporaries=terms.loss_bytes),
        ),
        backward_start=add_terms(
            rest,
            held,
            dict(gathered_params=during_backward, activations=saved, loss_gradients=loss_backward(run)),
        ),
        backward_end=add_terms(rest, _recompute_or_reduce(run, grad_shards, root_reduce, e * (root + block))),
        step=add_terms(
            rest,
            grad_shards,
            dict(adamw_temporaries=local_step_temporaries(run, shard_elements(run, trained=True))),
        ),
    )


def _recompute_or_reduce(run: Run, grad_shards: dict, root_reduce: dict, gathered: int) -> dict[str, int]:
    """The end of backward: the root's gradients reduced, or with checkpointing the first block recomputed (its
    activations beside the gradient shards, the root and that block gathered), whichever holds more. Backward
    recomputes a block only after the loss's gradients are gone (the head's matmul comes first), so the
    recomputed block is a moment of its own, as for every other engine (peak_engines._recompute)."""
    end = add_terms(grad_shards, root_reduce)
    recompute = activation_terms(run).recompute_bytes
    if not recompute:
        return end
    return largest_moment(
        end, add_terms(grad_shards, dict(gathered_params=gathered, recomputed_block=recompute))
    )
