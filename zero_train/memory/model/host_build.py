"""Host bytes per rank while train.py builds the model, by how it is loaded (before training allocates anything).

    model_build_bytes(engine_spec("ds2"), shape, world_size=8, load_dtype="bf16", precision="bf16", device="cuda")

Every engine but DeepSpeed's ZeRO-3 builds the whole model on each rank's host in `--load-dtype` (fp32: 4
bytes/param, what train.py always did; bf16: 2), then the engine casts it to the training precision and moves it
to the device (zero_train.train.setup.model_builder). ZeRO-3 (ds3) builds under DeepSpeed's zero.Init: each
module's parameters are made on the rank's device in the config's precision and partitioned as soon as the module
exists, so on a GPU the host holds none of them. On CPU ranks (the device is the host) a rank holds its partition,
and then transformers initialises the weights module by module, each gathered whole (rank 0 draws them and
broadcasts): the largest set it gathers at once (ModelShape.init_gather_numels, e.g. the embedding) is alive
together with gloo's receive buffers. FSDP2 builds the whole model like the others (train.py does not build it on
the meta device). Measured against train.py's own build on CPU ranks: docs/memory_model.md ("Host memory while the
model is built").
"""

from __future__ import annotations

from zero_train.ds_config.keys import LOAD_DTYPES
from zero_train.memory.model.theory import ModelShape, precision_bytes
from zero_train.registry import DEEPSPEED, EngineSpec

GLOO_THREADS = 2
"""Worker threads of torch's gloo process group (ProcessGroupGloo's default): collectives DeepSpeed launches
asynchronously (a multi-tensor gather) run this many at a time, each with its own receive buffer."""


def builds_under_zero_init(spec: EngineSpec) -> bool:
    """DeepSpeed at ZeRO-3: train.py builds the model inside zero.Init (transformers' HfDeepSpeedConfig)."""
    return spec.family == DEEPSPEED and spec.stage == 3


def init_gather_numels(shape: ModelShape) -> int:
    """Elements alive while ZeRO-3's weight initialisation gathers its largest set on CPU ranks: the gathered
    tensors, plus gloo's copy of each in flight (gloo's allgather receives into a flat buffer of its own and copies
    it out: ProcessGroupGloo's allgather), GLOO_THREADS at a time."""
    gathered = shape.init_gather_numels or (shape.largest_layer_params,)
    return sum(gathered) + sum(gathered[:GLOO_THREADS])


def model_build_bytes(
    spec: EngineSpec, shape: ModelShape, *, world_size: int, load_dtype: str, precision: str, device: str
) -> int:
    """Host bytes one rank holds at the highest point of building the model.

    Args:
        spec: the engine (zero_train.registry).
        shape: the model.
        world_size: ranks (zero.Init's partitions).
        load_dtype: train.py's --load-dtype (a key of LOAD_DTYPES).
        precision: the training precision (zero.Init builds in it).
        device: "cuda" (zero.Init builds on the GPU: nothing on the host) or "cpu" (the device is the host).
    """
    if not builds_under_zero_init(spec):
        return LOAD_DTYPES[load_dtype] * shape.num_params
    if device == "cuda":
        return 0
    partition = -(-shape.num_params // world_size)
    return precision_bytes(precision)["params"] * (partition + init_gather_numels(shape))
