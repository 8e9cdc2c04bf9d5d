"""The pieces of our peak model (zero_train.memory.model.peak): a run's settings and the transient terms.

Each term is what a line of code allocates, with the bytes it was measured to add here (torch 2.13 CPU,
DeepSpeed 0.19.8, gpt2-25m: 24,833,280 params, tied 8,192 x 384 embedding, micro-batch 2 x block 64),
from the probe's phase records (runs/docs-report) and from an exact tally of every tensor the ops of
one step allocate (a TorchDispatchMode over the same engines). Notation: Psi parameters, N ranks, e bytes
per element of the model dtype (4 fp32, 2 bf16/fp16), T = micro-batch x block tokens, V vocabulary,
h width.
"""

from __future__ import annotations

from dataclasses import dataclass

from zero_train.ds_config.parse import gradient_dtypes
from zero_train.memory.model.theory import (
    ACTIVATION_VALUES_PER_TOKEN_CHANNEL,
    DEFAULT_REDUCE_BUCKET_SIZE,
    ModelShape,
    activation_bytes,
)

ADAMW_TEMPORARY_BYTES = 8
"""torch.optim.AdamW's single-tensor step (foreach=False, what DeepSpeed's torch_adam runs on CPU)
computes `denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)`: two fp32 temporaries of the
tensor it updates are alive at once, 8 bytes per element (measured: +25.17 MB = 8 x the 3,145,728-element
embedding, +8.0 bytes/element on DeepSpeed's flat partition)."""
FOREACH_TEMPORARY_BYTES = 4
"""The foreach (multi-tensor) step our local engines run on CPU (engines/optim.py) takes the square root of
every exp_avg_sq at once (`torch._foreach_sqrt`): 4 bytes per element it updates (measured: 4.0 for AdamW,
Adam and SGD with momentum, 5M elements in 3 tensors). On CUDA the fused kernels keep none."""
FP32_BYTES = 4
FP64_BYTES = 8


def _int_setting(zero: dict, key: str, default: int) -> int:
    value = zero.get(key, default)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _given_bucket(config: dict) -> int | None:
    value = (config.get("zero_optimization") or {}).get("reduce_bucket_size")
    return None if value is None or value == "auto" else _int_setting({"v": value}, "v", None)


@dataclass(kw_only=True, slots=True, frozen=True)
class DeepSpeedSettings:
    """The DeepSpeed settings that change what a rank allocates (DeepSpeed's defaults where unset or "auto")."""

    reduce_bucket_size: int = DEFAULT_REDUCE_BUCKET_SIZE
    """Elements of the gradient reduce bucket (zero_optimization.reduce_bucket_size)."""
    contiguous_gradients: bool = True
    """Gradients are copied into the reduce bucket (the bucket exists only with this on)."""
    overlap_comm: bool = False
    """Two reduce buckets instead of one (DeepSpeed's default: on for stage 3 only)."""
    torch_adam: bool = False
    """optimizer.params.torch_adam: torch's AdamW on the flat partition (its temporaries); else FusedAdam."""
    max_live_parameters: int = 1_000_000_000
    """ZeRO-3: parameters gathered at once at most (stage3_max_live_parameters)."""
    persistence_threshold: int = 100_000
    """ZeRO-3: tensors below this many elements stay whole on every rank (stage3_param_persistence_threshold)."""
    sub_group_size: int = 1_000_000_000
    """ZeRO-3: elements of the partition the optimizer steps at a time (sub_group_size)."""
    communication_data_type: str | None = None
    """The gradients' dtype on the wire (communication_data_type, lower case); None: the model's dtype."""
    reduce_bucket_given: int | None = None
    """reduce_bucket_size as the config sets it (None: absent or "auto"); our zero1/zero2 size their own
    buckets without it (sharding.accounting.default_bucket_elements)."""
    gradient_dtypes: tuple[str, str] = ("fp32", "fp32")
    """Our sharders' (accumulation, communication) gradient dtypes (ds_config.parse.gradient_dtypes)."""

    @classmethod
    def from_config(cls, ds_config: dict | None, stage: int) -> DeepSpeedSettings:
        """Read a DeepSpeed config (None: DeepSpeed's defaults)."""
        config = ds_config or {}
        zero = config.get("zero_optimization", {}) or {}
        overlap = zero.get("overlap_comm")
        return cls(
            reduce_bucket_size=_int_setting(zero, "reduce_bucket_size", DEFAULT_REDUCE_BUCKET_SIZE),
            contiguous_gradients=bool(zero.get("contiguous_gradients", True)),
            overlap_comm=stage == 3 if not isinstance(overlap, bool) else overlap,
            torch_adam=bool(((config.get("optimizer") or {}).get("params") or {}).get("torch_adam", False)),
            max_live_parameters=_int_setting(zero, "stage3_max_live_parameters", 1_000_000_000),
            persistence_threshold=_int_setting(zero, "stage3_param_persistence_threshold", 100_000),
            sub_group_size=_int_setting(zero, "sub_group_size", 1_000_000_000),
            communication_data_type=str(config.get("communication_data_type") or "").lower() or None,
            reduce_bucket_given=_given_bucket(config),
            gradient_dtypes=gradient_dtypes(config),
        )


DTYPE_BYTES = {"fp32": FP32_BYTES, "bf16": 2, "fp16": 2}


def our_gradient_bytes(run: Run) -> tuple[int, int]:
    """(accumulation, communication) bytes per gradient element of our sharders (fp32 unless the config says
    otherwise: ds_config.parse.gradient_dtypes, as engines/precision.py grad_dtypes reads it)."""
    accumulate, communicate = run.deepspeed.gradient_dtypes
    return DTYPE_BYTES[accumulate], DTYPE_BYTES[communicate]


@dataclass(kw_only=True, slots=True, frozen=True)
class Run:
    """One training run as the peak model sees it (what every engine's terms are computed from)."""

    shape: ModelShape
    """The model."""
    world_size: int
    """N, the data-parallel ranks."""
    precision: str
    """"fp32", "bf16" or "fp16"."""
    micro_batch_size: int
    """Samples per micro-batch (one micro-batch per step is modelled)."""
    block_size: int
    """Tokens per sample."""
    deepspeed: DeepSpeedSettings
    """DeepSpeed's settings (read by the ds engines only)."""
    backend: str = "nccl"
    """"gloo" (CPU) or "nccl" (GPU): gloo's all-gather allocates a flat output buffer."""
    grad_accum: int = 1
    """Micro-batches per optimizer step: from the second on, gradients of the earlier ones are held."""
    gradient_checkpointing: bool = False
    """Activation checkpointing: blocks keep their input only and recompute in backward."""
    activation_count: ActivationTerms | None = None
    """Activations counted on the real architecture (zero_train.memory.model.activations), or None: the
    GPT-2 formula of `activation_terms`."""

    @property
    def element_bytes(self) -> int:
        """e: bytes of one parameter (and gradient) element in the model dtype."""
        return FP32_BYTES if self.precision == "fp32" else 2

    @property
    def mixed(self) -> bool:
        """16-bit model with fp32 master weights (the paper's mixed-precision Adam)."""
        return self.precision != "fp32"

    @property
    def tokens(self) -> int:
        """T = micro-batch x block."""
        return self.micro_batch_size * self.block_size

    @property
    def trained(self) -> int:
        """Parameters that get gradients, masters and optimizer states (LoRA: the adapters; else every one)."""
        return self.shape.trainable_params

    @property
    def largest_tensor(self) -> int:
        """Elements of the largest trainable tensor (the largest module's when tensors are unknown)."""
        return max(self.shape.trained_numels, default=self.shape.largest_layer_params)


@dataclass(kw_only=True, slots=True, frozen=True)
class ActivationTerms:
    """One micro-batch's activation terms (the fields of zero_train.memory.model.activations.ActivationCount)."""

    saved_bytes: int
    """Bytes autograd holds at the end of forward (each storage once; with checkpointing the blocks' inputs)."""
    loss_bytes: int
    """The logits and loss temporaries alive at the end of forward."""
    recompute_bytes: int
    """With checkpointing: one block's activations, recomputed during backward (0 without)."""


def activation_terms(run: Run) -> ActivationTerms:
    """The run's activation terms: counted on the architecture when the run carries them, else GPT-2's formula.

    The formula (theory.activation_bytes): ACTIVATION_VALUES_PER_TOKEN_CHANNEL values per token and channel
    per block, plus the LM head's inputs and the fp32 log-softmax. With checkpointing (Hugging Face's,
    non-reentrant torch.utils.checkpoint) a block keeps only its input, T x h values, and backward
    recomputes one block at a time (its full activations alive while that block's backward runs).
    """
    if run.activation_count is not None:
        return run.activation_count
    saved = activation_bytes(
        run.shape, micro_batch_size=run.micro_batch_size, block_size=run.block_size, precision=run.precision
    )
    block = run.tokens * run.shape.hidden_size * run.element_bytes
    if not (run.gradient_checkpointing and saved):
        return ActivationTerms(saved_bytes=saved, loss_bytes=loss_forward(run), recompute_bytes=0)
    per_block_saved = ACTIVATION_VALUES_PER_TOKEN_CHANNEL * block
    return ActivationTerms(
        saved_bytes=saved - run.shape.num_layers * (per_block_saved - block),
        loss_bytes=loss_forward(run),
        recompute_bytes=per_block_saved,
    )


def activations(run: Run) -> int:
    """Bytes autograd saves for backward during one micro-batch's forward (`activation_terms`)."""
    return activation_terms(run).saved_bytes


def loss_forward(run: Run) -> int:
    """The end of forward: the logits (T x V in the model dtype), and for a 16-bit model the fp32 copy the
    loss upcasts them to (transformers' ForCausalLMLoss); the log-softmax is among the activations."""
    logits = run.tokens * run.shape.vocab_size
    return logits * run.element_bytes + (logits * FP32_BYTES if run.mixed else 0)


def loss_backward_moments(run: Run) -> tuple[int, int]:
    """The start of backward, beside the activations: two moments (0, 0 if the shape is unknown).

    At log_softmax's backward: the fp32 gradients of the log-probabilities and of the logits, 2 x T x V x 4
    (the saved log-softmax still alive). At the LM head's weight-gradient matmul: the logits' gradient
    (T x V x e) and the V x h weight gradient, the first gradient of backward, while the log-softmax
    (T x V x 4) is already freed; a tied weight's gradient stays alive until the embedding's arrives
    (docs/memory_model.md#the-peak-model).

    Returns:
        (at log_softmax's backward, at the LM head's matmul), bytes beside the activations.
    """
    vocab, width = run.shape.vocab_size, run.shape.hidden_size
    if not (vocab and width):
        return 0, 0
    logits = run.tokens * vocab
    at_log_softmax = 2 * logits * FP32_BYTES
    head_gradient = (
        0 if run.shape.frozen_base else vocab * width * run.element_bytes
    )  # LoRA: the head is frozen
    at_head_matmul = logits * run.element_bytes + head_gradient - logits * FP32_BYTES
    return at_log_softmax, at_head_matmul


def loss_backward(run: Run) -> int:
    """The larger of the two moments of `loss_backward_moments`."""
    return max(loss_backward_moments(run))


def tied_gradient_copies(run: Run) -> int:
    """Bytes of a tied embedding's gradient (0 if untied or frozen, as under LoRA): autograd adds the LM head's and the embedding's
    contributions before the gradient hook, so both and their sum are alive at once at the end of backward
    (measured on gpt2-25m with DDP: all gradients + 2 x 12.58 MB)."""
    return 0 if run.shape.frozen_base else run.shape.tied_embedding_params * run.element_bytes


def adamw_temporaries(numel: int) -> int:
    """The single-tensor AdamW temporaries of a tensor of `numel` fp32 elements (ADAMW_TEMPORARY_BYTES)."""
    return ADAMW_TEMPORARY_BYTES * int(numel)


def local_step_temporaries(run: Run, updated: int) -> int:
    """The local engines' optimizer temporaries for `updated` elements: foreach on CPU, fused (none) on CUDA."""
    return 0 if run.backend == "nccl" else FOREACH_TEMPORARY_BYTES * int(updated)


def reduce_buckets(run: Run, stage: int) -> int:
    """DeepSpeed's contiguous reduce bucket(s), reduce_bucket_size elements of the gradient dtype each."""
    settings = run.deepspeed
    if not settings.contiguous_gradients:
        return 0
    count = 2 if settings.overlap_comm and stage < 3 else 1
    return count * settings.reduce_bucket_size * run.element_bytes


def gathered_units(run: Run) -> tuple[int, int, int]:
    """(input embedding, untied LM head (0 if tied), one block) in elements: the units our ZeRO-3 gathers, and
    FSDP2's (whose root is the embedding and the head together)."""
    shape = run.shape
    embedding = min(shape.vocab_size * shape.hidden_size, shape.num_params)
    head = 0 if shape.tied_embedding_params or not embedding else min(embedding, shape.num_params - embedding)
    rest = shape.num_params - embedding - head
    block = rest // shape.num_layers if shape.num_layers else rest
    return embedding, head, block


Phases = dict[str, dict[str, int]]
"""phase -> term -> bytes: what every peak_*.py model returns."""


def add_terms(*parts: dict[str, int]) -> dict[str, int]:
    """The terms of several dicts, summed by name, zero terms dropped."""
    total: dict[str, int] = {}
    for part in parts:
        for name, value in part.items():
            total[name] = total.get(name, 0) + int(value)
    return {name: value for name, value in total.items() if value}


def largest_moment(*moments: dict[str, int]) -> dict[str, int]:
    """The moment of a phase holding the most bytes (the first on ties)."""
    return max(moments, key=lambda terms: sum(terms.values()))
