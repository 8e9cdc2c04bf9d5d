"""Zero1Optimizer: ZeRO stage 1 (optimizer-state sharding, the ZeRO paper's P_os) in plain torch.distributed.

Every rank keeps the whole model and computes whole gradients; the optimizer state (and, for a
bf16/fp16 model, the fp32 master weights) of each parameter lives on ONE rank, its owner
(`partition.py`: whole tensors, sorted-greedy). One training step:

    backward            gradients land in a flat buffer laid out by owner (a hook per parameter; no
                        communication, so gradient accumulation over micro-steps is free); inside
                        boundary_backward() the hooks also divide by N (flat_grads.py)
    reduce_gradients()  one reduce-scatter of the flat gradient buffer: each rank receives the
                        average of exactly the region it owns
    clip_grad_norm_()   per-tensor norms on the owners, one all-reduce of a vector of P floats
    step()              the inner optimizer updates only the owned (fp32 master) parameters; one
                        all-gather of the flat parameter buffer brings every rank the new weights

The model's parameters are views into the flat parameter buffer and their gradients views into the
flat gradient buffer, so the collectives read and write them in place (no copies in fp32).

    optimizer = Zero1Optimizer(model.parameters(), torch.optim.AdamW, lr=3e-4, weight_decay=0.1)
    for micro_batch in micro_batches[:-1]:     # gradient accumulation: no communication here
        optimizer.scale_loss(model(micro_batch).loss / len(micro_batches)).backward()
    with optimizer.boundary_backward():         # optional, for the last one: the hooks also divide by N
        optimizer.scale_loss(model(micro_batches[-1]).loss / len(micro_batches)).backward()
    optimizer.reduce_gradients()               # at the boundary only
    grad_norm = optimizer.clip_grad_norm_(1.0)
    optimizer.step()
    optimizer.zero_grad()
"""

from __future__ import annotations

import torch

from zero_train.runtime.errors import UsageError
from zero_train.sharding import collectives
from zero_train.sharding.flat_grads import FlatGradients
from zero_train.sharding.gather import cpu_copy, gather_tensor
from zero_train.sharding.partition import FlatLayout, balance_report, flat_layout, greedy_owners
from zero_train.sharding.state_dict import SHARD_FORMAT, check_groups_match, owned_states


class Zero1Optimizer(torch.optim.Optimizer):
    """Shards the state of any elementwise torch optimizer over the data-parallel ranks (ZeRO-1).

    Args:
        params: tensors or param-group dicts, as for any torch optimizer. Parameters with
            requires_grad=False are kept in param_groups but get no state and no communication.
        optimizer_class: the inner optimizer (torch.optim.AdamW, Adam, SGD, ...), run on the owned shard.
        process_group: the data-parallel group (None: the default group).
        master_dtype: dtype of the owned master weights; a model in another dtype (bf16/fp16) gets
            fp32 masters for its owned parameters only.
        loss_scaler: fp16 dynamic loss scaler (`.loss_scale`, `.update_scale(overflow)`); overflowing
            steps are skipped (`last_step_skipped`).
        **defaults: the inner optimizer's keyword arguments (lr, betas, weight_decay, ...).

    Raises:
        ValueError: empty parameter list (torch's message); TypeError: non-tensor entries.
        UsageError: trainable parameters of different dtypes or devices.
    """

    def __init__(
        self,
        params,
        optimizer_class: type[torch.optim.Optimizer],
        *,
        process_group=None,
        master_dtype: torch.dtype = torch.float32,
        loss_scaler=None,
        **defaults,
    ):
        self._ready = False
        self.optimizer_class = optimizer_class
        self.process_group = process_group
        self.rank, self.world_size = collectives.group_rank_and_size(process_group)
        self.master_dtype = master_dtype
        self.loss_scaler = loss_scaler
        self.last_step_skipped = False
        super().__init__(params, defaults)
        self._params: list[torch.nn.Parameter] = []  # trainable, in param-group order
        self._owners: list[int] = []
        self._grads: FlatGradients | None = None
        self._reduced = False
        self._grad_norm: torch.Tensor | None = None
        self._add_trainable([p for g in self.param_groups for p in g["params"]])
        self._ready = True

    # ---------------------------------------------------------------- layout
    def _add_trainable(self, params: list[torch.Tensor]) -> None:
        """Assign new trainable parameters to owners, then (re)build the buffers and the inner optimizer."""
        known = {id(p) for p in self._params}
        new = list({id(p): p for p in params if p.requires_grad and id(p) not in known}.values())
        if not self._params and not new:
            raise UsageError("Zero1Optimizer got no trainable parameters (all have requires_grad=False)")
        self._check_uniform(self._params + new)
        saved_states, saved_masters = self._owned_records() if self._ready else ({}, {})
        loads = self.layout.loads() if self._params else None
        self._owners += greedy_owners([p.numel() for p in new], self.world_size, loads)
        self._params += new
        self._build_buffers()
        self._build_inner()
        self._load_owned(saved_states, saved_masters)

    def _check_uniform(self, params: list[torch.Tensor]) -> None:
        if len({p.dtype for p in params}) > 1 or len({p.device for p in params}) > 1:
            found = sorted({f"{p.dtype} on {p.device}" for p in params})
            raise UsageError(
                f"Zero1Optimizer needs all trainable parameters in one dtype on one device, got {found}; "
                "cast the model with model.to(dtype) first"
            )

    def _build_buffers(self) -> None:
        """Flat parameter and gradient buffers by owner; parameters and grads become views into them."""
        self.layout: FlatLayout = flat_layout(
            [p.numel() for p in self._params], self._owners, self.world_size
        )
        self._region_lengths = self.layout.loads()  # the padding after them never travels (gloo rings)
        dtype, device = self._params[0].dtype, self._params[0].device
        self._param_buffer = torch.zeros(self.layout.total_size, dtype=dtype, device=device)
        for param, offset in zip(self._params, self.layout.offsets, strict=True):
            param_slot = self._param_buffer[offset : offset + param.numel()].view_as(param)
            param_slot.copy_(param.detach())
            param.data = param_slot
        if self._grads is not None:
            self._grads.remove_hooks()
        self._grads = FlatGradients(
            self._params, self.layout, world_size=self.world_size, dtype=dtype, device=device
        )
        self._grad_buffer, self._grad_slots = self._grads.buffer, self._grads.slots
        gloo = self.world_size > 1 and collectives.uses_p2p_rings(self.process_group)
        recv_size = min(self.layout.region_size, collectives.RECV_BUFFER_ELEMENTS)
        self._recv_buffer = torch.empty(recv_size, dtype=dtype, device=device) if gloo else None
        start, stop = self.layout.region(self.rank)
        self.has_master_copies = dtype != self.master_dtype
        region = self._param_buffer[start:stop]
        self._master_flat = region.to(self.master_dtype, copy=True) if self.has_master_copies else region

    def _build_inner(self) -> None:
        """The inner optimizer over this rank's master views, one inner group per outer group."""
        start = self.layout.region(self.rank)[0]
        owned = {id(p) for p, owner in zip(self._params, self._owners, strict=True) if owner == self.rank}
        offsets = {id(p): off - start for p, off in zip(self._params, self.layout.offsets, strict=True)}
        self._owned_params, self._masters, self._master_offsets, inner_groups = [], [], [], []
        for group in self.param_groups:
            masters = []
            for param in (p for p in group["params"] if id(p) in owned):
                local = offsets[id(param)]
                master = self._master_flat[local : local + param.numel()].view_as(param)
                self._owned_params.append(param)
                self._masters.append(master)
                self._master_offsets.append(local)
                masters.append(master)
            inner_groups.append({**self._hyperparameters(group), "params": masters})
        self._inner = self.optimizer_class(inner_groups, **self.defaults)
        for group, inner_group in zip(self.param_groups, self._inner.param_groups, strict=True):
            for key, value in self._hyperparameters(inner_group).items():
                group.setdefault(key, value)  # so LR schedulers see "lr" even if it was a default

    @staticmethod
    def _hyperparameters(group: dict) -> dict:
        return {k: v for k, v in group.items() if k != "params"}

    # ------------------------------------------------------------ the step
    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss` times the fp16 loss scale (identity without a loss scaler); call backward on the result."""
        return loss if self.loss_scaler is None else loss * self.loss_scaler.loss_scale

    def boundary_backward(self):
        """Context for the backward of the LAST micro-batch of a step (optional; the result is identical).

        Its gradient hooks write grad / N straight into the flat buffer, so reduce_gradients() skips one
        pass over the gradients (flat_grads.py). Another backward before step()/zero_grad() raises.
        """
        return self._grads.boundary_backward()

    def reduce_gradients(self) -> None:
        """Average the gradients over the ranks: each rank receives the average of the region it owns.

        Call it ONCE per optimizer step, at the gradient-accumulation boundary (after the last
        micro-batch's backward): backward itself never communicates, so micro-steps before the
        boundary cost no traffic. Idempotent until step() or zero_grad(). Afterwards the gradients of
        parameters owned by other ranks are set to None (they hold partial sums: ZeRO's gradient
        partitioning); a parameter without a gradient on some rank counts as a zero gradient there.
        Collective: every rank of the group must call it.
        """
        if self._reduced:
            return
        self._grads.average(self._params)  # divide first, as DDP's allreduce_hook does
        collectives.reduce_scatter_(
            self._grad_buffer, self._recv_buffer, self.process_group, lengths=self._region_lengths
        )
        for param, owner in zip(self._params, self._owners, strict=True):
            param.grad = self._grad_slots[id(param)] if owner == self.rank else None
        self._set_master_grads()
        self._reduced = True

    def _set_master_grads(self) -> None:
        """Owned averaged gradients -> master gradients (fp32 copy for bf16/fp16), unscaled for fp16.

        One conversion per tensor, not one of the whole region: a fresh buffer above glibc's mmap
        threshold (32 MB at most) is page-faulted in again every step (measured: 2.4x slower).
        """
        start = self.layout.region(self.rank)[0]
        for master, offset in zip(self._masters, self._master_offsets, strict=True):
            grad = self._grad_buffer[start + offset : start + offset + master.numel()].view_as(master)
            if self.has_master_copies:
                grad = grad.to(self.master_dtype)
            if self.loss_scaler is not None:
                grad.mul_(1.0 / self.loss_scaler.loss_scale)
            master.grad = grad

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the averaged gradients by their global norm, as torch.nn.utils.clip_grad_norm_ would.

        The norm is bit-identical to torch's on the unsharded averaged (unscaled) gradients: each
        owner computes the norm of each of its whole tensors, one all-reduce assembles the vector of
        per-tensor norms in parameter order, and its norm is the total. Collective.

        Args:
            max_norm: clip to this norm (math.inf: only compute the norm).
            norm_type: the p of the p-norm.

        Returns:
            The total norm before clipping (inf/nan on fp16 overflow; then nothing is clipped).
        """
        self.reduce_gradients()
        index = {id(p): i for i, p in enumerate(self._params)}
        norms = torch.zeros(len(self._params), dtype=torch.float32, device=self._param_buffer.device)
        if self._masters:
            owned_norms = torch._foreach_norm([m.grad for m in self._masters], norm_type)
            positions = torch.tensor([index[id(p)] for p in self._owned_params], device=norms.device)
            norms[positions] = torch.stack(owned_norms).to(torch.float32)
        collectives.all_reduce_sum_(norms, self.process_group)  # one owner per entry: the sum is exact
        total = torch.linalg.vector_norm(norms, norm_type)
        self._grad_norm = total
        clip_coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        if bool(torch.isfinite(total)) and float(clip_coef) < 1.0:
            for master in self._masters:
                master.grad.mul_(clip_coef)
        return total

    def _overflow(self) -> bool:
        """True if any rank's averaged gradients hold inf/nan (fp16 loss scaling)."""
        if self._grad_norm is not None:
            return not bool(torch.isfinite(self._grad_norm))
        local = all(bool(torch.isfinite(m.grad).all()) for m in self._masters)
        flag = torch.tensor([0.0 if local else 1.0], device=self._param_buffer.device)
        collectives.all_reduce_sum_(flag, self.process_group)
        return bool(flag.item() > 0)

    def step(self, closure=None, **kwargs):
        """Update the owned shard with the inner optimizer, then all-gather the new parameters.

        Reduces the gradients first if reduce_gradients() was not called. With a loss scaler, an
        overflowing step is skipped (`last_step_skipped`) and the scale updated. Collective.

        Args:
            closure: re-evaluates the model and returns the loss (run before reducing).
            **kwargs: passed to the inner optimizer's step().

        Returns:
            The closure's loss, or None.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.reduce_gradients()
        self.last_step_skipped = False
        if self.loss_scaler is not None:
            overflow = self._overflow()
            self.loss_scaler.update_scale(overflow)
            self.last_step_skipped = overflow
        if not self.last_step_skipped:
            for group, inner_group in zip(self.param_groups, self._inner.param_groups, strict=True):
                inner_group.update(self._hyperparameters(group))  # lr set by schedulers reaches the shard
            self._inner.step(**kwargs)
            if self.has_master_copies:
                start, stop = self.layout.region(self.rank)
                self._param_buffer[start:stop].copy_(self._master_flat)
            collectives.all_gather_(self._param_buffer, self.process_group, lengths=self._region_lengths)
        self._end_step()
        return loss

    def _end_step(self) -> None:
        for master in self._masters:
            master.grad = None
        self._grads.new_step()
        self._reduced = False
        self._grad_norm = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients (set_to_none) or zero them in place as views of the flat buffer."""
        trainable = {id(p) for p in self._params}
        if not set_to_none:
            self._grad_buffer.zero_()
        for group in self.param_groups:
            for param in group["params"]:
                if id(param) in trainable:
                    param.grad = None if set_to_none else self._grad_slots[id(param)]
                elif param.grad is not None:
                    param.grad = None if set_to_none else param.grad.zero_()
        self._end_step()

    def add_param_group(self, param_group: dict) -> None:
        """Add a group (collective after construction): its tensors go to the least-loaded ranks."""
        super().add_param_group(param_group)
        if self._ready:
            self._add_trainable(list(self.param_groups[-1]["params"]))

    # --------------------------------------------------------------- state
    def _global_indices(self) -> dict[int, int]:
        """id(param) -> its index in torch's state_dict numbering (all params of all groups, in order)."""
        return {id(p): i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}

    def _owned_records(self) -> tuple[dict[int, dict], dict[int, torch.Tensor]]:
        """(state, fp32 master) of each owned parameter, keyed by global index."""
        index = self._global_indices()
        states = {
            index[id(p)]: dict(self._inner.state[m])
            for p, m in zip(self._owned_params, self._masters, strict=True)
            if self._inner.state.get(m)
        }
        masters = {}
        if self.has_master_copies:
            masters = {
                index[id(p)]: m.detach().clone()
                for p, m in zip(self._owned_params, self._masters, strict=True)
            }
        return states, masters

    def _load_owned(self, states: dict[int, dict], masters: dict[int, torch.Tensor]) -> None:
        """Load the inner optimizer's state (and masters) for the owned parameters from global-index maps."""
        index = self._global_indices()
        inner = self._inner.state_dict()
        inner["state"] = {}
        for position, (param, master) in enumerate(zip(self._owned_params, self._masters, strict=True)):
            key = index[id(param)]
            if key in states:
                inner["state"][position] = {
                    k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in states[key].items()
                }
            if key in masters:
                master.detach().copy_(masters[key])
        self._inner.load_state_dict(inner)

    def state_dict(self) -> dict:
        """This rank's shard: the state of the parameters it owns, keyed like torch's state_dict.

        Returns:
            {"format", "world_size", "rank", "state": {global index: state}, "param_groups",
            "master_params": {global index: fp32 tensor} (bf16/fp16 models), "loss_scaler"}.
        """
        states, masters = self._owned_records()
        index = self._global_indices()
        groups = [
            {**self._hyperparameters(g), "params": [index[id(p)] for p in g["params"]]}
            for g in self.param_groups
        ]
        return {
            "format": SHARD_FORMAT,
            "world_size": self.world_size,
            "rank": self.rank,
            "state": states,
            "param_groups": groups,
            "master_params": masters,
            "loss_scaler": None if self.loss_scaler is None else self.loss_scaler.state_dict(),
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Load this rank's shard, or a consolidated (plain torch) state dict at any world size.

        A consolidated dict (`consolidated_state_dict`, `consolidate_shards`, or a plain inner
        optimizer's `state_dict()`) re-shards: each rank takes the parameters it owns now.

        Raises:
            UsageError: a shard saved by another rank or world size, or param groups that don't match.
        """
        check_groups_match(state_dict["param_groups"], self.param_groups)
        if state_dict.get("format") == SHARD_FORMAT and (state_dict["world_size"], state_dict["rank"]) != (
            self.world_size,
            self.rank,
        ):
            raise UsageError(
                f"this optimizer shard was saved by rank {state_dict['rank']} of {state_dict['world_size']}, "
                f"but this is rank {self.rank} of {self.world_size}; merge all shards with "
                "zero_train.sharding.consolidate_shards([...]) and load the result to re-shard"
            )
        for group, saved in zip(self.param_groups, state_dict["param_groups"], strict=True):
            group.update(self._hyperparameters(saved))
        states, masters = owned_states(state_dict)
        if self.has_master_copies and not masters:
            start, stop = self.layout.region(self.rank)
            self._master_flat.copy_(self._param_buffer[start:stop])  # masters from the loaded model weights
        self._load_owned(states, masters)
        if self.loss_scaler is not None and state_dict.get("loss_scaler"):
            self.loss_scaler.load_state_dict(state_dict["loss_scaler"])

    def consolidated_state_dict(self, to: int = 0) -> dict | None:
        """The full optimizer state on rank `to` (None elsewhere), loadable into the plain inner optimizer.

        Collective (a gather of every rank's shard). The result also carries "master_params" and
        "loss_scaler", which torch's load_state_dict ignores.
        """
        from zero_train.sharding.state_dict import consolidate_shards, gather_shards

        shards = gather_shards(self.state_dict(), to=to, process_group=self.process_group)
        return None if shards is None else consolidate_shards(shards)

    def gathered_master_params(self, to: int = 0) -> list[torch.Tensor] | None:
        """The full master weight of every parameter on rank `to`, in CPU memory, in param_groups order.

        Collective, one tensor at a time from its owner (zero_train.sharding.gather): the other ranks
        never hold more than one extra tensor, unlike `full_master_params`. None on the other ranks.
        Without master copies (fp32 model) rank `to` copies its own parameters; nothing travels.
        """
        all_params = [p for g in self.param_groups for p in g["params"]]
        if not self.has_master_copies:
            return [cpu_copy(p) for p in all_params] if self.rank == to else None
        owned = {id(p): m for p, m in zip(self._owned_params, self._masters, strict=True)}
        owner = dict(zip(map(id, self._params), self._owners, strict=True))
        gathered = []
        for param in all_params:
            if id(param) not in owner:  # frozen: every rank has it, in the model's dtype
                gathered.append(cpu_copy(param).to(self.master_dtype) if self.rank == to else None)
                continue
            gathered.append(
                gather_tensor(
                    owned.get(id(param)),
                    owner=owner[id(param)],
                    to=to,
                    shape=param.shape,
                    dtype=self.master_dtype,
                    process_group=self.process_group,
                )
            )
        return gathered if self.rank == to else None

    def full_master_params(self) -> list[torch.Tensor]:
        """The full master weight of every parameter on EVERY rank, in param_groups order (an all-gather).

        Costs every rank the whole fp32 model (4 Psi bytes); to write or export, use
        `gathered_master_params`. Without master copies (fp32 model) these are the parameters themselves.
        """
        all_params = [p for g in self.param_groups for p in g["params"]]
        if not self.has_master_copies:
            return [p.detach() for p in all_params]
        full = torch.empty(self.layout.total_size, dtype=self.master_dtype, device=self._master_flat.device)
        start, stop = self.layout.region(self.rank)
        full[start:stop].copy_(self._master_flat)
        collectives.all_gather_(full, self.process_group, lengths=self._region_lengths)
        offsets = {id(p): off for p, off in zip(self._params, self.layout.offsets, strict=True)}
        return [
            full[offsets[id(p)] : offsets[id(p)] + p.numel()].view_as(p)
            if id(p) in offsets
            else p.detach().to(self.master_dtype)
            for p in all_params
        ]

    # ---------------------------------------------------------- accounting
    def memory_bytes(self) -> dict[str, int]:
        """Bytes this rank holds, by category (params, grads, master_params, optimizer_states, comm_buffers)."""
        from zero_train.sharding.accounting import memory_bytes

        return memory_bytes(self)

    def comm_bytes_per_step(self) -> dict[str, int]:
        """Bytes this rank sends per step, by collective (reduce_scatter, all_gather, all_reduce, broadcast, total)."""
        from zero_train.sharding.accounting import comm_bytes_per_step

        return comm_bytes_per_step(self)

    def balance_report(self) -> dict:
        """How evenly the owned parameters are spread over the ranks (see partition.balance_report)."""
        return balance_report(self.layout, self._param_buffer.element_size())
