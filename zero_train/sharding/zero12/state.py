"""ZeRO-1/2's state dicts and full weights: the shared shard format (state_dict.py) with the fp32 masters in it.

A shard holds this rank's pieces of optimizer state and, for a bf16/fp16 model, of the fp32 masters. Loading
takes this rank's own shard, or a consolidated (plain torch) state dict at any world size: each rank then
cuts out the pieces it owns now (re-sharding). The full masters come to one rank one piece at a time
(`gathered_master_params`, for checkpoints and exports) or to every rank at once (`full_master_params`).
"""

from __future__ import annotations

import torch

from zero_train.runtime.errors import UsageError
from zero_train.sharding import state_dict as shards
from zero_train.sharding.comm.gather import cpu_copy, gather_tensor
from zero_train.sharding.step import PieceOptimizer
from zero_train.sharding.zero12.segments import Segment


class ShardedState(PieceOptimizer):
    """state_dict / load_state_dict / consolidated_state_dict and the full masters of ShardedOptimizer.

    ShardedOptimizer (sharded.py) subclasses it and builds the segments declared here.
    """

    _segments: list[Segment]
    """Every segment, oldest first (ShardedOptimizer builds them)."""

    def _mixed(self) -> bool:
        return any(segment.has_master_copies for segment in self._segments)

    def _masters_in_shard(self) -> bool:
        return self._mixed()

    def load_state_dict(self, state_dict: dict) -> None:
        """Load this rank's shard, or a consolidated (plain torch) state dict at any world size.

        A consolidated dict (`consolidated_state_dict`, `consolidate_shards`, or a plain inner optimizer's
        `state_dict()`) re-shards: each rank cuts out the pieces it owns now.

        Raises:
            UsageError: a shard of another rank, world size or of the whole-tensor layout; param groups that
                don't match.
        """
        shards.check_groups_match(state_dict["param_groups"], self.param_groups)
        fmt, saved_at = state_dict.get("format"), (state_dict.get("world_size"), state_dict.get("rank"))
        fix = "merge all shards with zero_train.sharding.consolidate_shards([...]) and load the result"
        if fmt == shards.WHOLE_TENSOR_FORMAT:
            raise UsageError(f"this optimizer shard was written by the whole-tensor layout ({fmt}); {fix}")
        if fmt == shards.SHARD_FORMAT and saved_at != (self.world_size, self.rank):
            raise UsageError(
                f"this optimizer shard was saved by rank {saved_at[1]} of {saved_at[0]}, "
                f"but this is rank {self.rank} of {self.world_size}; {fix} to re-shard"
            )
        if fmt == shards.SHARD_FORMAT:
            states, masters = (
                shards.saved_pieces([state_dict]),
                shards.saved_pieces([state_dict], "master_params"),
            )
        else:  # consolidated: one whole piece per parameter
            states = shards.whole_pieces(state_dict["state"], self.param_groups)
            masters = shards.whole_pieces(state_dict.get("master_params") or {}, self.param_groups)
        for group, saved in zip(self.param_groups, state_dict["param_groups"], strict=True):
            group.update(shards.hyperparameters(saved))
        shards.load_states(self._pieces, self._inner, states, self.param_groups)
        index = shards.global_indices(self.param_groups)
        for owned in self._pieces:
            found = masters.get(index[id(owned.param)])
            if found:
                place = owned.piece.tensor_offset, owned.piece.length
                owned.master.detach().copy_(shards.cut(found, *place, owned.master.shape))
            elif owned.holder.has_master_copies:  # masters from the loaded model weights
                owned.master.detach().copy_(owned.holder.model_view(owned.piece))
        if self.loss_scaler is not None and state_dict.get("loss_scaler"):
            self.loss_scaler.load_state_dict(state_dict["loss_scaler"])

    def consolidated_state_dict(self, to: int = 0) -> dict | None:
        """The full optimizer state on rank `to` (None elsewhere), loadable into the plain inner optimizer.

        Collective (a gather of every rank's shard). The result also carries "master_params" and
        "loss_scaler", which torch's load_state_dict ignores.
        """
        gathered = shards.gather_shards(self.state_dict(), to=to, process_group=self.process_group)
        return None if gathered is None else shards.consolidate_shards(gathered)

    def gathered_master_params(self, to: int = 0) -> list[torch.Tensor] | None:
        """The full master weight of every parameter on rank `to`, in CPU memory, in param_groups order.

        Collective, one piece at a time from its owner (zero_train.sharding.comm.gather): the other ranks never
        hold more than one extra piece, unlike `full_master_params`. None on the other ranks. Without
        master copies (fp32 model) rank `to` copies its own parameters; nothing travels.
        """
        all_params = [p for g in self.param_groups for p in g["params"]]
        if not self._mixed():
            return [cpu_copy(p) for p in all_params] if self.rank == to else None
        where = {id(p): (s, i) for s in self._segments for i, p in enumerate(s.params)}
        gathered = []
        for param in all_params:
            if id(param) not in where:  # never trainable: every rank has it, in the model's dtype
                gathered.append(cpu_copy(param).to(self.master_dtype) if self.rank == to else None)
                continue
            segment, position = where[id(param)]
            parts = [
                gather_tensor(
                    segment.master_view(piece).reshape(-1) if rank == self.rank else None,
                    owner=rank,
                    to=to,
                    shape=(piece.length,),
                    dtype=self.master_dtype,
                    process_group=self.process_group,
                )
                for rank, piece in segment.partition.pieces_of(position)
            ]
            gathered.append(torch.cat(parts).view(param.shape) if self.rank == to else None)
        return gathered if self.rank == to else None

    def full_master_params(self) -> list[torch.Tensor]:
        """The full master weight of every parameter on EVERY rank, in param_groups order (an all-gather).

        Costs every rank the whole fp32 model (4 Psi bytes); to write or export, use
        `gathered_master_params`. Without master copies (fp32 model) these are the parameters themselves.
        """
        all_params = [p for g in self.param_groups for p in g["params"]]
        if not self._mixed():
            return [p.detach() for p in all_params]
        full = {}
        for segment in self._segments:
            flat = segment.gathered_masters(self.process_group)
            for param, offset in zip(segment.params, segment.partition.offsets, strict=True):
                full[id(param)] = flat[offset : offset + param.numel()].view_as(param)
        return [full[id(p)] if id(p) in full else p.detach().to(self.master_dtype) for p in all_params]
