"""zero_train: train Hugging Face causal LMs with ZeRO-sharded optimizers.

Modules:
    dist          DistInfo / init_distributed(): the distributed environment, read once.
    errors        UsageError: the one exception type a user can cause (one line, exit code 2).
    ds_config     the one place that knows DeepSpeed's JSON keys: builds and validates configs.
    sharding      pure partition arithmetic + the hand-written ZeRO-1 optimizer (Zero1Optimizer).
    engines       deepspeed / zero1 / ddp behind one small protocol.
    hf, data      Hugging Face models, tokenizers and datasets (offline defaults included).
    train_loop    the engine-agnostic training loop.
    memory        measurement (CPU allocator / CUDA stats), theory (paper, DeepSpeed, ours), comm ledger.
    report        run records -> Markdown, PNG plots, JSON.
"""

__version__ = "0.1.0"
