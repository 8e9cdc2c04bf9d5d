"""Our ZeRO-3 (zero_train.sharding.zero3.model) in the per-phase peak model, term by term from the code.

Units (sharding/zero3/units.py): each transformer block, the input embedding, an untied LM head, and the root
(a GPT-2's position embedding and final norm: here counted in the blocks, as peak_fsdp2 does). Each unit is
one flat buffer cut into N equal slices; a rank keeps its slice (e x Psi / N over all units), fp32 masters of
it for a 16-bit model, Adam's moments of its trainable pieces. What lives only for part of a step:

    forward         the root and the unit computing the logits (the head, or a tied embedding, which stays
                    gathered from its first use to the end of the pass) beside the activations and logits
    backward_start  the larger of two moments: at the head, the same plus the last block (prefetched) and
                    the loss's gradients (the head's whole weight gradient among them); in the last block's
                    backward, it and the next block gathered (and a tied embedding), its whole gradients
                    beside their flat copy, and the head's gradient (tied: waiting for the embedding's
                    contribution; untied: its reduce-scatter in flight)
    backward_end    every unit's gradient slice (g x Psi / N, g the accumulation dtype's bytes; c those on the wire), the gathered
                    embedding, and its gradient on its way out: a tied one's two contributions and their sum
                    (3 e V h, autograd adds them before the hook), then copied into the unit's flat buffer
                    (c V h); on gloo the exchange's receive buffer beside it ((N - 1) / N c V h)
    step            the gradient slices, their fp32 copies (16-bit model: the masters' .grad) and the foreach
                    AdamW's temporaries on the owned pieces

Gradient accumulation: the gradient slices of earlier micro-batches live through the later ones (every
micro-batch is reduce-scattered, nothing whole is kept). Activation checkpointing: the end of backward may
peak while the first block is recomputed (peak_terms.activation_terms).

One rank is no exception: a gathered unit is a copy of its slice (Unit.begin_gather) and gradients still pass
through the unit's flat buffer (GradientReducer._launch); only gloo's receive buffers need peers.

LoRA: a unit mixing frozen and trainable parameters is two (sharding/zero3/model.py), so the frozen base costs its
slice (e x Psi_frozen / N) and its gathers only; gradients, masters and moments are the adapters' (`owned`
is this rank's slice of them), and whole gradients exist only for a block's adapters (peft's targets, all-linear
included, leave the embedding and LM head frozen: no head gradient, no tied copies).
"""

from __future__ import annotations

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
    our_gradient_bytes,
    tied_gradient_copies,
)
from zero_train.memory.model.sharder_layout import SharderLayout, Share


def trained_units(run: Run) -> tuple[int, int, int]:
    """(input embedding, untied LM head, one block) elements that take gradients: gathered_units without LoRA;
    with it, the adapters, all in the blocks."""
    if not run.shape.frozen_base:
        return gathered_units(run)
    layers = run.shape.num_layers
    return 0, 0, run.trained // layers if layers else run.trained


def zero3_phases(run: Run, share: Share, layout: SharderLayout | None = None) -> Phases:
    """{phase: {term: bytes}} for our ZeRO-3 on rank `share.rank` (its slice: `share.owned` elements; the
    whole model's flat layout stands for the units', which differ by under N elements per unit)."""
    e, n = run.element_bytes, run.world_size
    g, c = our_gradient_bytes(run)  # the slices accumulate in g, gradients travel in c (fp32 by default)
    embedding, head, block = gathered_units(run)
    owned = share.owned
    frozen_slice = -(-(run.shape.num_params - run.trained) // n)  # LoRA's base: 1/N, no grads/masters/moments
    rest = dict(
        params=e * (owned + frozen_slice),
        master_params=FP32_BYTES * owned if run.mixed else 0,
        optimizer_states=2 * FP32_BYTES * owned,
    )
    slices = dict(grads=g * owned)
    held = dict(accumulated_grads=g * owned) if run.grad_accum > 1 else {}
    terms = activation_terms(run)
    gathered = e * (head or embedding)  # the unit computing the logits (at N = 1 too: a copy of the slice)
    prefetched = e * block
    forward = add_terms(
        held, dict(activations=terms.saved_bytes, loss_temporaries=terms.loss_bytes, gathered_params=gathered)
    )
    at_head = add_terms(
        held,
        dict(
            activations=terms.saved_bytes,
            loss_gradients=loss_backward(run),
            gathered_params=gathered + prefetched,
        ),
    )
    backward_start = largest_moment(
        at_head,
        add_terms(held, _last_block(run, (embedding, head, block), c), dict(activations=terms.saved_bytes)),
    )
    last = _embedding_leaves(run, trained_units(run)[0], c)
    end = add_terms(slices, dict(gathered_params=e * embedding), last)
    if terms.recompute_bytes:
        recompute = add_terms(
            slices, dict(gathered_params=e * (embedding + block), recomputed_block=terms.recompute_bytes)
        )
        end = largest_moment(end, recompute)
    step = add_terms(
        slices,
        dict(
            fp32_grads=FP32_BYTES * owned if g != FP32_BYTES else 0,
            adamw_temporaries=local_step_temporaries(run, owned),
        ),
    )
    return {
        "forward": add_terms(rest, forward),
        "backward_start": add_terms(rest, backward_start),
        "backward_end": add_terms(rest, end),
        "step": add_terms(rest, step),
    }


def _embedding_leaves(run: Run, embedding: int, c: int) -> dict[str, int]:
    """The embedding's gradient at the end of backward, its largest moment: a tied one's two contributions
    and their sum; else the whole gradient beside its copy in the flat buffer; or the buffer beside the
    gloo exchange's receive buffer."""
    e, n = run.element_bytes, run.world_size
    tied = dict(tied_gradient_copies=3 * tied_gradient_copies(run))
    copying = dict(pending_grads=e * embedding, reduce_scatter_buffer=c * embedding)
    received = c * embedding * (n - 1) // n if run.backend == "gloo" else 0
    exchanging = dict(reduce_scatter_buffer=c * embedding + received)
    return largest_moment(tied, copying, exchanging)


def _last_block(run: Run, units: tuple[int, int, int], c: int) -> dict[str, int]:
    """The last block's backward, after the head's: it, the block prefetched after it and a tied embedding
    gathered (`units`: gathered_units); its whole gradients copied into its flat buffer; and either a tied head's
    gradient waiting for the embedding's contribution, or an untied head's gradients on their way (flat
    buffer, on gloo the exchange's receive buffer), in flight until this block's are launched."""
    e, n = run.element_bytes, run.world_size
    embedding, head, block = units
    _, head_trained, block_trained = trained_units(run)
    received = (n - 1) / n if run.backend == "gloo" else 0.0
    waiting = dict(tied_gradient_copies=tied_gradient_copies(run))
    if head:
        waiting = dict(reduce_scatter_buffer=int(c * head_trained * (1 + received)))
    else:
        waiting["reduce_scatter_buffer"] = c * block_trained
    return add_terms(
        dict(gathered_params=e * ((0 if head else embedding) + 2 * block), pending_grads=e * block_trained),
        waiting,
    )
