"""Memory predicted before a run (see README.md in this folder for what the model was derived from).

- ``theory``: model shapes and the ZeRO paper's formulas.
- ``deepspeed_estimate``: DeepSpeed's own model-state estimators, called (stages 2 and 3, with offload).
- ``peak``: our per-phase peak model (end of forward, start/end of backward, optimizer step; peak = max).
- ``activations``: what one micro-batch's forward and backward hold, counted on the real architecture built on
  fake tensors (no memory), with or without activation checkpointing; ``watch``: its two instruments (saved-tensor
  hooks, live bytes per op).
- ``peak_terms`` / ``peak_engines``: its terms, and which engine holds which term in which phase.
- ``flat_partition`` / ``sharder_layout``: what each rank owns (DeepSpeed's flat slices; our sharders' layout),
  for the ranks that differ only, so an answer costs the same at 8 ranks and at 10^6.
- ``limits``: the inputs estimate and plan answer for (one table; one refusal line each).
- ``estimate``: one training set-up, every ZeRO stage: device bytes per rank by phase, host bytes per rank and node.
- ``offload``: DeepSpeed offload (optimizer / parameters, cpu and nvme): what moves off the device and where.
- ``gpu_terms``: the GPU margin kept free beyond the tensors the peak model counts (CUDA context, NCCL buffers,
  allocator slack; assumed, not measured here).
- ``peak_fsdp2``: FSDP2 (torch fully_shard per block + root) in the per-phase peak model.
- ``plan``: the cheapest training set-up that fits (`zero-train plan`), on top of the peak model.
- ``versions``: the torch and DeepSpeed versions the peak model was derived with; a warning when they differ.
"""
