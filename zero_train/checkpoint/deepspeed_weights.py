"""The full weights of a DeepSpeed checkpoint, reassembled by DeepSpeed's own zero_to_fp32.

`deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint` reassembles the fp32 master weights from
every rank's optimizer shard (ZeRO-1/2 flat partitions, ZeRO-3 partitioned parameters). Kept apart from
export.py because only files named deepspeed*.py import DeepSpeed (pyproject's import contracts).
"""

from __future__ import annotations

import contextlib
import io
import pathlib

import torch
from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

from zero_train.checkpoint.files import refuse_unexpected_pickles
from zero_train.runtime.errors import UsageError


def deepspeed_state_dict(ds_dir: pathlib.Path) -> dict[str, torch.Tensor]:
    """The full model weights of a DeepSpeed checkpoint folder (the one holding DeepSpeed's `latest`).

    ZeRO 1/2/3: the fp32 master weights, reassembled by DeepSpeed's own zero_to_fp32 from every rank's
    optimizer shard. ZeRO 0 (no partitioned optimizer): the module weights of mp_rank_00_model_states.pt
    (in the training dtype).
    DeepSpeed reads its files with torch.load(weights_only=False): every pickle is scanned first, and one
    that references anything but tensors and DeepSpeed's own records is refused (UsageError).
    """
    tag = _deepspeed_tag(ds_dir)
    refuse_unexpected_pickles(ds_dir / tag)
    if any((ds_dir / tag).glob("*_optim_states.pt")):
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # zero_to_fp32 prints progress lines
                return get_fp32_state_dict_from_zero_checkpoint(str(ds_dir), tag=tag)
        except ValueError as err:  # bf16 at stage 0 (BF16_Optimizer) is "not a zero checkpoint"
            if "is not a zero checkpoint" not in str(err):
                raise UsageError(f"cannot reassemble DeepSpeed checkpoint {ds_dir / tag}: {err}") from err
    model_states = ds_dir / tag / "mp_rank_00_model_states.pt"
    if not model_states.is_file():
        raise UsageError(
            f"{ds_dir / tag} has no mp_rank_00_model_states.pt; is the DeepSpeed checkpoint complete?"
        )
    return torch.load(model_states, map_location="cpu", weights_only=False)["module"]


def _deepspeed_tag(ds_dir: pathlib.Path) -> str:
    """DeepSpeed's `latest` tag, or the only tag folder present."""
    if (ds_dir / "latest").is_file():
        return (ds_dir / "latest").read_text().strip()
    # `universal*`: our conversion for resuming at another world size (engines/deepspeed_universal.py)
    tags = [p.name for p in ds_dir.iterdir() if p.is_dir() and not p.name.startswith("universal")]
    if len(tags) != 1:
        raise UsageError(
            f"{ds_dir} has no `latest` file and {len(tags)} tag folders; cannot tell which to export"
        )
    return tags[0]
