"""ShardedOptimizer: what our ZeRO-1 and ZeRO-2 share (owners, the flat parameter buffer, the step).

Every rank keeps the whole model; the optimizer state (and, for a bf16/fp16 model, the fp32 master
weights) of each parameter lives on ONE rank, its owner (`partition.py`: whole tensors, sorted-greedy).
The model's parameters are views into one flat buffer laid out by owner, so one all-gather brings every
rank the updated weights. What the stages differ in is only where the gradients go before the step:

    Zero1Optimizer (zero1.py)   a flat buffer of ALL gradients, reduce-scattered at the boundary
    Zero2Optimizer (zero2.py)   buckets reduced to their owners during backward; a rank keeps only the
                                gradients it owns

A subclass builds its gradient storage in `_build_grads()` and, in `reduce_gradients()`, hands the
owned averaged gradients (this rank's region, `layout` order) to `_set_master_grads`. The rest is here:
global-norm clipping, the inner optimizer's step on the owned shard, the all-gather, param_groups,
add_param_group, and the accounting (accounting.py); state dicts are in state_dict.py.
"""

from __future__ import annotations

import torch

from zero_train.runtime.errors import UsageError
from zero_train.sharding import accounting, collectives
from zero_train.sharding.partition import FlatLayout, balance_report, flat_layout, greedy_owners
from zero_train.sharding.state_dict import ShardedStateDict


class ShardedOptimizer(ShardedStateDict, torch.optim.Optimizer):
    """Shards the state of any elementwise torch optimizer over the data-parallel ranks.

    Args:
        params: tensors or param-group dicts, as for any torch optimizer. A parameter with
            requires_grad=False gets no owner, state or communication until it is unfrozen (then the
            next reduce_gradients() gives it an owner); one frozen later keeps its owner and state but
            stops travelling.
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
        self.backend = collectives.backend_name(process_group)
        self.master_dtype = master_dtype
        self.loss_scaler = loss_scaler
        self.last_step_skipped = False
        super().__init__(params, defaults)
        self._params: list[torch.nn.Parameter] = []  # trainable, in param-group order
        self._owners: list[int] = []
        self._reduced = False
        self._grad_norm: torch.Tensor | None = None
        self._local_flags: torch.Tensor | None = None  # has this rank a gradient, per entry of _params
        self._agreed = False
        self._has_grad: list[bool] = []
        self._overflow_count = 0.0
        self._add_trainable([p for g in self.param_groups for p in g["params"]])
        self._ready = True

    # ---------------------------------------------------------------- layout
    def _add_trainable(self, params: list[torch.Tensor]) -> None:
        """Assign new trainable parameters to owners, then (re)build the buffers and the inner optimizer.

        Owners are never taken back: a parameter keeps its owner (and its state) once it has one.
        """
        known = {id(p) for p in self._params}
        new = list({id(p): p for p in params if p.requires_grad and id(p) not in known}.values())
        if not self._params and not new:
            raise UsageError(
                f"{type(self).__name__} got no trainable parameters (all have requires_grad=False)"
            )
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
                f"{type(self).__name__} needs all trainable parameters in one dtype on one device, got "
                f"{found}; cast the model with model.to(dtype) first"
            )

    def _build_buffers(self) -> None:
        """The flat parameter buffer by owner (parameters become views into it), the gradients, the masters."""
        self.layout: FlatLayout = flat_layout(
            [p.numel() for p in self._params],
            self._owners,
            self.world_size,
            active=[p.requires_grad for p in self._params],
        )
        # what travels in each region (gloo rings): its trainable tensors, never the frozen ones or padding
        self._region_lengths = self.layout.active_loads()
        dtype, device = self._params[0].dtype, self._params[0].device
        self._param_buffer = torch.zeros(self.layout.total_size, dtype=dtype, device=device)
        for param, offset in zip(self._params, self.layout.offsets, strict=True):
            param_slot = self._param_buffer[offset : offset + param.numel()].view_as(param)
            param_slot.copy_(param.detach())
            param.data = param_slot
        self._build_grads()
        start, stop = self.layout.region(self.rank)
        self.has_master_copies = dtype != self.master_dtype
        region = self._param_buffer[start:stop]
        self._master_flat = region.to(self.master_dtype, copy=True) if self.has_master_copies else region

    def _build_grads(self) -> None:
        """Build this stage's gradient storage and hooks for `self._params` in `self.layout`."""
        raise NotImplementedError

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

    def _refresh_trainable(self) -> bool:
        """Rebuild the layout if a parameter was unfrozen or frozen since the last step (True if so).

        Every rank must change requires_grad alike (as they run the same code). Cost: one pass over the
        parameters per step; a rebuild (all buffers copied once) only when something changed.
        """
        all_params = [p for g in self.param_groups for p in g["params"]]
        known = {id(p) for p in self._params}
        unfrozen = any(p.requires_grad and id(p) not in known for p in all_params)
        if not unfrozen and tuple(p.requires_grad for p in self._params) == self.layout.active:
            return False
        self._add_trainable(all_params)
        return True

    # ------------------------------------------------------------ the step
    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss` times the fp16 loss scale (identity without a loss scaler); call backward on the result."""
        return loss if self.loss_scaler is None else loss * self.loss_scaler.loss_scale

    def reduce_gradients(self) -> None:
        """Average the gradients over the ranks; each rank ends with the average of what it owns.

        A subclass sets `_local_flags` (1.0 per entry of `_params` with a gradient on this rank) and
        calls `_set_master_grads` with its owned averaged gradients.
        """
        raise NotImplementedError

    def _has_local_grad(self, param: torch.Tensor) -> bool:
        """Whether `param` brings a gradient from this rank to this step (a frozen one never does)."""
        return param.requires_grad and param.grad is not None

    def _set_master_grads(self, owned_grads: torch.Tensor) -> None:
        """Owned averaged gradients -> master gradients (fp32 copy for bf16/fp16), unscaled for fp16.

        Args:
            owned_grads: this rank's region of averaged gradients (offsets as in the master region).

        One conversion per tensor, not one of the whole region: a fresh buffer above glibc's mmap
        threshold (32 MB at most) is page-faulted in again every step (measured: 2.4x slower).
        """
        for master, offset in zip(self._masters, self._master_offsets, strict=True):
            grad = owned_grads[offset : offset + master.numel()].view_as(master)
            if self.has_master_copies:
                grad = grad.to(self.master_dtype)
            if self.loss_scaler is not None:
                grad.mul_(1.0 / self.loss_scaler.loss_scale)
            master.grad = grad

    def _agree(self, norms: torch.Tensor | None = None) -> None:
        """One all-reduce: [per-tensor norms] + [ranks that had a gradient, per tensor] + [overflows].

        A parameter no rank had a gradient for is skipped exactly as the inner optimizer skips one whose
        .grad is None (its master gradient is set to None: no state change, no update). Where only some
        ranks had one, it counted as zero on the others (DDP's rule). The flags ride in the collective of
        the norms when clip_grad_norm_ is called (4 bytes per tensor more), else in one all-reduce of
        P + 1 floats in step(). Idempotent until the step ends; fills `norms` in place. Collective.
        """
        if self._agreed:
            return
        overflow = torch.zeros(1, device=self._param_buffer.device)
        if self.loss_scaler is not None and norms is None:
            finite = all(bool(torch.isfinite(m.grad).all()) for m in self._masters)
            overflow[0] = 0.0 if finite else 1.0
        vector = torch.cat([*([norms] if norms is not None else []), self._local_flags, overflow])
        collectives.all_reduce_sum_(vector, self.process_group)
        count = len(self._params)
        if norms is not None:
            norms.copy_(vector[:count])
        self._has_grad = (vector[-1 - count : -1] > 0).tolist()
        self._overflow_count = float(vector[-1])
        index = {id(p): i for i, p in enumerate(self._params)}
        for param, master in zip(self._owned_params, self._masters, strict=True):
            if not self._has_grad[index[id(param)]]:
                master.grad = None
        self._agreed = True

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the averaged gradients by their global norm, as torch.nn.utils.clip_grad_norm_ would.

        The norm is bit-identical to torch's on the unsharded averaged (unscaled) gradients: each
        owner computes the norm of each of its whole tensors, one all-reduce assembles the vector of
        per-tensor norms in parameter order (with the has-gradient flags, `_agree`), and its norm is
        the total. Collective.

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
        self._agree(norms)  # one owner per entry: the sum is exact
        # torch's order: the parameters that have a gradient, as they come in param_groups
        global_index = self._global_indices()
        order = sorted(range(len(self._params)), key=lambda i: global_index[id(self._params[i])])
        with_grad = torch.tensor([i for i in order if self._has_grad[i]], dtype=torch.long)
        total = torch.linalg.vector_norm(norms[with_grad.to(norms.device)], norm_type)
        self._grad_norm = total
        clip_coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        if bool(torch.isfinite(total)) and float(clip_coef) < 1.0:
            for master in self._masters:
                if master.grad is not None:
                    master.grad.mul_(clip_coef)
        return total

    def _overflow(self) -> bool:
        """True if any rank's averaged gradients hold inf/nan (fp16 loss scaling)."""
        if self._grad_norm is not None:
            return not bool(torch.isfinite(self._grad_norm))
        return self._overflow_count > 0

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
        self._agree()
        self.last_step_skipped = False
        if self.loss_scaler is not None:
            overflow = self._overflow()
            self.loss_scaler.update_scale(overflow)
            self.last_step_skipped = overflow
        if not self.last_step_skipped:
            for group, inner_group in zip(self.param_groups, self._inner.param_groups, strict=True):
                inner_group.update(self._hyperparameters(group))  # lr set by schedulers reaches the shard
            self._inner.step(**kwargs)
            for group, inner_group in zip(self.param_groups, self._inner.param_groups, strict=True):
                group.update(self._hyperparameters(inner_group))  # what the inner optimizer changed or added
            if self.has_master_copies:
                start, stop = self.layout.region(self.rank)
                self._param_buffer[start:stop].copy_(self._master_flat)
            collectives.all_gather_(self._param_buffer, self.process_group, lengths=self._region_lengths)
        self._end_step()
        return loss

    def _end_step(self) -> None:
        for master in self._masters:
            master.grad = None
        self._reduced = False
        self._grad_norm = None
        self._local_flags = None
        self._agreed = False

    def add_param_group(self, param_group: dict) -> None:
        """Add a group (collective after construction): its tensors go to the least-loaded ranks."""
        super().add_param_group(param_group)
        if self._ready:
            self._add_trainable(list(self.param_groups[-1]["params"]))

    # ---------------------------------------------------------- accounting
    def _grad_bytes(self) -> int:
        """Bytes of model-dtype gradients this rank holds now (without padding or comm buffers)."""
        raise NotImplementedError

    def buffer_bytes(self) -> accounting.BufferBytes:
        """This optimizer's buffers (padding, receive buffer) as accounting.py computes them for its layout."""
        raise NotImplementedError

    def memory_bytes(self) -> dict[str, int]:
        """Bytes this rank holds, by category (params, grads, master_params, optimizer_states, comm_buffers).

        params: every model parameter (whole model, every rank). grads: the model-dtype gradients this
        stage keeps, plus fp32 master gradients while they exist. master_params: the owned fp32 masters
        (mixed precision only). optimizer_states: the inner optimizer's tensors (owned parameters only).
        comm_buffers: padding of the flat buffers and the receive buffers (`buffer_bytes()`).
        """
        all_params = list({id(p): p for g in self.param_groups for p in g["params"]}.values())
        master_grads = sum(_nbytes(m.grad) for m in self._masters) if self.has_master_copies else 0
        states = sum(
            _nbytes(v)
            for state in self._inner.state.values()
            for v in state.values()
            if isinstance(v, torch.Tensor)
        )
        return dict(
            params=sum(_nbytes(p) for p in all_params),
            grads=self._grad_bytes() + master_grads,
            master_params=_nbytes(self._master_flat) if self.has_master_copies else 0,
            optimizer_states=states,
            comm_buffers=self.buffer_bytes().comm_buffers,
        )

    def comm_bytes_per_step(self) -> dict[str, int]:
        """Bytes this rank sends per step with clipping, by collective (accounting.comm_bytes_per_step)."""
        return accounting.comm_bytes_per_step(
            self.layout,
            self.rank,
            self._param_buffer.element_size(),
            self.backend,
            lengths=self._region_lengths,
        )

    def owner(self, param: torch.Tensor) -> int | None:
        """The rank that owns `param`'s optimizer state (None: it has never been trainable)."""
        for known, owner in zip(self._params, self._owners, strict=True):
            if known is param:
                return owner
        return None

    def balance_report(self) -> dict:
        """How evenly the owned parameters are spread over the ranks (see partition.balance_report)."""
        return balance_report(self.layout, self._param_buffer.element_size())


def _nbytes(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.numel() * tensor.element_size()
