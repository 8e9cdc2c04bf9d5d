"""Step time predicted before a run, beside the memory model (docs/steptime.md: how it does against runs).

- ``constants``: every constant of the model, with its source; ``presets``: GPUs and links (datasheets).
- ``machine``: a machine's rates and links, from a preset (with overrides) or a calibration JSON.
- ``comm``: an engine's collectives on a set-up (zero_train.registry's `collectives`): calls, bytes, seconds.
- ``step``: one optimizer step as named terms (compute, exposed communication, optimizer, offload); tokens/s,
  MFU and the time to train N tokens.
- ``ranking``: `zero-train plan`'s set-ups that fit, ranked by predicted time.
- ``calibrate``: `zero-train calibrate`: this machine's rates measured into a JSON.
"""
