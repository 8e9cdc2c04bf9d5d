"""Zero1Optimizer behaves like a torch optimizer (the checks of torch's ZeroRedundancyOptimizer tests).

Single-rank checks run in this process (no process group: world size 1); one spawned run at world
size 2 covers add_param_group balance, fp16 loss scaling with skipped steps, and the bytes sent.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn

from zero_train.comm.ledger import CommLedger
from zero_train.runtime.errors import UsageError
from zero_train.sharding import DynamicLossScaler, Zero1Optimizer, Zero2Optimizer
from zero_train.sharding.zero12 import report as zero12_report
from zero_train.testing.sharders import TiedNet, batch, clip_with_float64_norm, piece_average, two_groups

pytestmark = pytest.mark.tier("multiproc")


@pytest.mark.tier("quick")
def test_constructor_errors_like_torch():
    with pytest.raises(ValueError, match="empty"):
        Zero1Optimizer([], torch.optim.AdamW, lr=0.1)
    with pytest.raises(TypeError):
        Zero1Optimizer([1.0, 2.0], torch.optim.AdamW, lr=0.1)
    mixed = [nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2, dtype=torch.bfloat16))]
    with pytest.raises(UsageError, match="one dtype"):
        Zero1Optimizer(mixed, torch.optim.AdamW, lr=0.1)
    with pytest.raises(UsageError, match="no trainable"):
        Zero1Optimizer([nn.Parameter(torch.ones(2), requires_grad=False)], torch.optim.AdamW, lr=0.1)
    # a tensor may be split between ranks: only elementwise updates are exact
    for sharder in (Zero1Optimizer, partial(Zero2Optimizer, bucket_elements=100)):
        with pytest.raises(UsageError, match="elementwise optimizer .* not LBFGS") as refused:
            sharder([nn.Parameter(torch.ones(2))], torch.optim.LBFGS, lr=0.1)
        assert "\n" not in str(refused.value)


@pytest.mark.tier("quick")
def test_zero_grad_to_none_or_to_zeroed_views():
    model = TiedNet()
    optimizer = Zero1Optimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    model(batch(0, 0, 0)).backward()
    assert model.hidden.weight.grad.abs().sum() > 0
    optimizer.zero_grad(set_to_none=False)
    assert float(model.hidden.weight.grad.abs().sum()) == 0.0
    grads = {id(p): p.grad for p in model.parameters() if p.requires_grad}
    model(batch(0, 0, 0)).backward()  # accumulates in place into the flat buffer's views
    assert all(p.grad is grads[id(p)] for p in model.parameters() if p.requires_grad)
    optimizer.zero_grad()
    assert all(p.grad is None for p in model.parameters())


class _SGDWithStepArgument(torch.optim.SGD):
    seen: list = []

    def step(self, closure=None, *, note=None):
        _SGDWithStepArgument.seen.append(note)
        return super().step(closure)


@pytest.mark.tier("quick")
def test_step_closure_and_keyword_arguments_reach_the_inner_optimizer():
    model, reference = TiedNet(), TiedNet()
    optimizer = Zero1Optimizer(model.parameters(), _SGDWithStepArgument, lr=0.1)
    plain = torch.optim.SGD(reference.parameters(), lr=0.1)

    def closure():
        optimizer.zero_grad()
        loss = model(batch(0, 1, 0))
        loss.backward()
        return loss

    loss = optimizer.step(closure, note="hello")
    plain.zero_grad()
    ref_loss = reference(batch(0, 1, 0))
    ref_loss.backward()
    plain.step()
    assert float(loss.detach()) == float(ref_loss.detach())
    assert _SGDWithStepArgument.seen[-1] == "hello"
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters(), strict=True))


@pytest.mark.tier("quick")
def test_lr_scheduler_drives_the_sharded_optimizer_like_a_plain_one():
    model, reference = TiedNet(), TiedNet()
    optimizer = Zero1Optimizer(two_groups(model, 0.05), torch.optim.AdamW, lr=0.05, foreach=False)
    plain = torch.optim.AdamW(two_groups(reference, 0.05), lr=0.05, foreach=False)
    schedulers = [torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5) for o in (optimizer, plain)]
    for step in range(6):
        for net, opt, scheduler in zip((model, reference), (optimizer, plain), schedulers, strict=True):
            opt.zero_grad()
            net(batch(0, step, 0)).backward()
            opt.step()
            scheduler.step()
        assert [g["lr"] for g in optimizer.param_groups] == [g["lr"] for g in plain.param_groups]
    assert optimizer.param_groups[1]["lr"] == 0.025 * 0.5**3
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters(), strict=True))


@pytest.mark.tier("quick")
def test_clip_grad_norm_equals_torch_with_a_float64_norm_bit_for_bit():
    model, reference, fp32 = TiedNet(), TiedNet(), TiedNet()
    optimizer = Zero1Optimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    for net in (model, reference, fp32):
        net(batch(0, 0, 0)).backward()
    norm = optimizer.clip_grad_norm_(0.1)
    ref_norm = clip_with_float64_norm([p for p in reference.parameters() if p.requires_grad], 0.1)
    assert norm.item() == ref_norm.item() and ref_norm.item() > 0.1
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        assert (a.grad is None and b.grad is None) or torch.equal(a.grad, b.grad)
    # torch's own clip_grad_norm_ accumulates in float32: the same norm within its rounding
    fp32_norm = torch.nn.utils.clip_grad_norm_([p for p in fp32.parameters() if p.requires_grad], 0.1)
    assert norm.item() == pytest.approx(fp32_norm.item(), rel=1e-6)


@pytest.mark.tier("quick")
def test_memory_bytes_of_one_rank_hold_the_whole_state():
    model = TiedNet()
    optimizer = Zero1Optimizer(model.parameters(), torch.optim.AdamW, lr=0.1)
    model(batch(0, 0, 0)).backward()
    optimizer.step()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    memory = zero12_report.memory_bytes(optimizer)
    assert memory["params"] == 4 * sum(p.numel() for p in model.parameters())
    assert memory["grads"] == 4 * trainable
    assert memory["optimizer_states"] == 8 * trainable + 4 * len(
        [p for p in model.parameters() if p.requires_grad]
    )
    assert memory["master_params"] == 0 and memory["comm_buffers"] == 0
    assert zero12_report.comm_bytes_per_step(optimizer)["total"] == 0


def _wide_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(6 + i, 7 + i) for i in range(6)])


def _add_group_and_fp16(rank: int, world_size: int) -> dict:
    results = {}
    model = _wide_model()
    layers = list(model)
    optimizer = Zero1Optimizer(layers[0].parameters(), torch.optim.AdamW, lr=1e-2, foreach=False)
    optimizer.add_param_group(dict(params=[p for layer in layers[1:] for p in layer.parameters()], lr=5e-3))
    results["balance"] = zero12_report.balance_report(optimizer)
    results["largest"] = max(p.numel() * 4 for p in model.parameters())
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(rank))
    with CommLedger() as ledger:
        model(x).square().mean().backward()
        optimizer.reduce_gradients()
        optimizer.clip_grad_norm_(1.0)
        optimizer.step()
    results["ledger"], results["ledger_wire"] = ledger.totals(), ledger.wire_bytes()
    results["reported"] = zero12_report.comm_bytes_per_step(optimizer)
    results["ranks_per_group"] = [
        sorted({rank for p in group["params"] for rank, _, _ in zero12_report.pieces_of(optimizer, p)})
        for group in optimizer.param_groups
    ]
    results["segments"] = len(zero12_report.partitions(optimizer))
    results["fp16"] = _fp16_skips(rank, world_size, Zero1Optimizer)
    results["pieces_diff"] = _small_receive_buffer_diff(rank)
    results["zero2"] = _zero2_bytes(rank)
    results["zero2_fp16"] = _fp16_skips(rank, world_size, partial(Zero2Optimizer, bucket_elements=100))
    results["torch_collectives_diff"] = _torch_collectives_diff(rank)
    results["nan_on_rank0"] = _inf_norm_nan_on_rank0(rank)
    return results


def _inf_norm_nan_on_rank0(rank: int) -> dict:
    """fp16 overflow (a NaN) in a gradient only rank 0 owns, clipped by the inf-norm: the ranks' MAX must carry
    it (gloo's MAX keeps a finite value against a NaN on rank 0), so both ranks skip and nothing turns NaN."""
    model = _wide_model()
    scaler = DynamicLossScaler(init_scale=2.0**4, scale_window=1000, hysteresis=1, min_scale=1.0)
    optimizer = Zero1Optimizer(model.parameters(), torch.optim.AdamW, loss_scaler=scaler, lr=1e-2)
    owners = {id(p): {r for r, _, _ in zero12_report.pieces_of(optimizer, p)} for p in model.parameters()}
    rank0_only = next(p for p in model.parameters() if owners[id(p)] == {0})
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(rank))
    loss = model(x).square().mean() + rank0_only.sum() * (float("nan") if rank == 0 else 1.0)
    optimizer.scale_loss(loss).backward()
    norm = optimizer.clip_grad_norm_(1.0, float("inf"))
    optimizer.step()
    return dict(
        norm=float(norm),
        skipped=optimizer.last_step_skipped,
        finite=all(bool(torch.isfinite(p).all()) for p in model.parameters()),
    )


def _torch_collectives_diff(rank: int) -> dict[str, float]:
    """The NCCL code path (torch's reduce-scatter / reduce / all-gather instead of our rings), run on gloo:
    the same training up to the summation order."""
    from zero_train.sharding.comm import collectives

    finals = {}
    for rings in (True, False):
        collectives.uses_p2p_rings, default = (
            (lambda process_group=None, rings=rings: rings),
            collectives.uses_p2p_rings,
        )
        try:
            for name, sharder in (
                ("zero1", Zero1Optimizer),
                ("zero2", partial(Zero2Optimizer, bucket_elements=100)),
            ):
                model = TiedNet()
                optimizer = sharder(model.parameters(), torch.optim.AdamW, lr=1e-2, foreach=False)
                for step in range(3):
                    model(batch(rank, step, 0)).backward()
                    optimizer.clip_grad_norm_(1.0)
                    optimizer.step()
                    optimizer.zero_grad()
                finals[name, rings] = [p.detach().clone() for p in model.parameters()]
        finally:
            collectives.uses_p2p_rings = default
    return {
        name: max(
            float((a - b).abs().max()) for a, b in zip(finals[name, True], finals[name, False], strict=True)
        )
        for name in ("zero1", "zero2")
    }


def _zero2_bytes(rank: int) -> dict:
    """One clipped ZeRO-2 step under the ledger, with small buckets (several reductions per backward)."""
    model = _wide_model()
    optimizer = Zero2Optimizer(
        model.parameters(), torch.optim.AdamW, bucket_elements=60, lr=1e-2, foreach=False
    )
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(rank))
    with CommLedger() as ledger:
        model(x).square().mean().backward()
        optimizer.clip_grad_norm_(1.0)
        optimizer.step()
    return dict(
        ledger=ledger.totals(),
        wire=ledger.wire_bytes(),
        reported=zero12_report.comm_bytes_per_step(optimizer),
        balance=zero12_report.balance_report(optimizer),
        buckets=len(zero12_report.buckets(optimizer)),
    )


def _small_receive_buffer_diff(rank: int) -> float:
    """The gloo ring moves a region in pieces of its receive buffer: tiny pieces give the same result."""
    from zero_train.sharding.comm import gloo

    finals = []
    for piece in (gloo.RECV_BUFFER_ELEMENTS, 7):
        gloo.RECV_BUFFER_ELEMENTS, default = piece, gloo.RECV_BUFFER_ELEMENTS
        model = TiedNet()
        optimizer = Zero1Optimizer(model.parameters(), torch.optim.AdamW, lr=1e-2, foreach=False)
        gloo.RECV_BUFFER_ELEMENTS = default
        chunk = min(
            -(-zero12_report.partitions(optimizer)[0].num_elements // 2), piece
        )  # an N-th of the bucket, at most piece
        assert optimizer._queue.recv_buffer.numel() == chunk  # N - 1 = 1 chunk per ring step
        for step in range(3):
            model(batch(rank, step, 0)).backward()
            optimizer.step()
            optimizer.zero_grad()
        finals.append([p.detach().clone() for p in model.parameters()])
    return max(float((a - b).abs().max()) for a, b in zip(*finals, strict=True))


def _fp16_skips(rank: int, world_size: int, sharder) -> dict:
    """fp16 model from a loss scale of 2**16: overflowing steps skip, the scale halves, then training runs."""

    def scaler():
        return DynamicLossScaler(init_scale=2.0**16, scale_window=2, hysteresis=1, min_scale=1.0)

    model, reference = TiedNet().half(), TiedNet().half()
    optimizer = sharder(model.parameters(), torch.optim.AdamW, loss_scaler=scaler(), lr=1e-2, foreach=False)
    ref_scaler = scaler()
    trainable = [p for p in reference.parameters() if p.requires_grad]
    masters = [p.detach().float().clone() for p in trainable]
    plain = torch.optim.AdamW(masters, lr=1e-2, foreach=False)
    history, ref_history = [], []
    for step in range(10):
        before = [p.detach().clone() for p in model.parameters()]
        optimizer.scale_loss(model(batch(rank, step, 0))).backward()
        optimizer.step()
        optimizer.zero_grad()
        unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        history.append((optimizer.last_step_skipped, unchanged, optimizer.loss_scaler.loss_scale))
        grads_by_rank = []
        for r in range(world_size):
            reference.zero_grad()
            (reference(batch(r, step, 0)) * ref_scaler.loss_scale).backward()
            grads_by_rank.append([p.grad.clone() for p in trainable])
        pieces = [zero12_report.pieces_of(optimizer, p) for p in model.parameters() if p.requires_grad]
        for i, master in enumerate(masters):
            master.grad = piece_average([[g[i]] for g in grads_by_rank], pieces[i], stage=1).float()
            master.grad.mul_(1.0 / ref_scaler.loss_scale)
        overflow = not all(bool(torch.isfinite(m.grad).all()) for m in masters)
        ref_scaler.update_scale(overflow)
        if not overflow:
            plain.step()
            with torch.no_grad():
                for param, master in zip(trainable, masters, strict=True):
                    param.copy_(master)
        ref_history.append((overflow, ref_scaler.loss_scale))
    diff = max(
        float((a - b).abs().max()) for a, b in zip(model.parameters(), reference.parameters(), strict=True)
    )
    return dict(history=history, ref_history=ref_history, diff=diff)


@pytest.fixture(scope="module")
def two_ranks(rank_pool):
    return rank_pool(2).run(_add_group_and_fp16)


def test_add_param_group_keeps_ranks_balanced(two_ranks):
    for results in two_ranks:
        balance = results["balance"]
        assert results["segments"] == 2  # the group added later is a flat buffer of its own
        assert balance["max_bytes"] - balance["min_bytes"] <= 2 * 4  # each buffer: padding < N = 2 elements
        assert min(balance["pieces_per_rank"]) > 0
        assert results["ranks_per_group"][1] == [0, 1]  # the added group spreads over both ranks


def test_comm_bytes_per_step_match_what_the_ledger_counts(two_ranks):
    for results in two_ranks:
        reported, ledger = results["reported"], results["ledger"]
        # gloo: reduce-scatter and all-gather are isend/irecv rings; the ledger counts sends AND receives
        assert ledger["send_recv"] == 2 * (reported["reduce"] + reported["all_gather"])
        assert results["ledger_wire"]["all_reduce"] == reported["all_reduce"]  # the per-tensor norm vector
        # only data travels, never the padding: at N = 2 a rank sends exactly Psi e per step (the other's
        # slice, then its own), what DDP's ring all-reduce sends
        assert reported["reduce"] + reported["all_gather"] == sum(results["balance"]["bytes_per_rank"])
        assert results["ledger_wire"]["send_recv"] == reported["reduce"] + reported["all_gather"]
        assert results["balance"]["padding_bytes"] < 2 * 2 * 4  # fewer than N elements in each buffer
        assert ledger["reduce_scatter"] == ledger["all_gather"] == 0


def test_torch_collectives_path_trains_like_our_rings(two_ranks):
    for results in two_ranks:
        for diff in results["torch_collectives_diff"].values():
            assert diff < 1e-5  # only the order of the sums differs (3 AdamW steps at lr 1e-2)


def test_ring_in_small_pieces_gives_the_same_result(two_ranks):
    assert all(results["pieces_diff"] == 0.0 for results in two_ranks)


def test_zero2_sends_what_zero1_does_per_step_and_the_ledger_agrees(two_ranks):
    for results in two_ranks:
        zero2 = results["zero2"]
        reported, ledger = zero2["reported"], zero2["ledger"]
        assert zero2["buckets"] >= 3  # the gradients travelled in several buckets during backward
        assert ledger["send_recv"] == 2 * (reported["reduce"] + reported["all_gather"])
        assert zero2["wire"]["all_reduce"] == reported["all_reduce"]  # norms and has-gradient flags
        # at N = 2 a rank sends exactly Psi e per step, as DDP's ring all-reduce (the paper's 2 Psi in total)
        assert reported["reduce"] + reported["all_gather"] == sum(zero2["balance"]["bytes_per_rank"])


@pytest.mark.parametrize("sharder", ["fp16", "zero2_fp16"])
def test_fp16_overflow_skips_steps_and_matches_reference(two_ranks, sharder):
    for results in two_ranks:
        fp16 = results[sharder]
        skipped = [entry[0] for entry in fp16["history"]]
        assert (
            skipped[:2] == [True, False] and skipped.count(True) >= 2
        )  # overflow, halve, grow back, overflow
        assert all(unchanged for was_skipped, unchanged, _ in fp16["history"] if was_skipped)
        assert [(s, scale) for s, _, scale in fp16["history"]] == fp16["ref_history"]
        assert fp16["diff"] == 0.0


def test_an_overflow_on_one_rank_skips_every_rank_under_the_inf_norm(two_ranks):
    for results in two_ranks:
        assert results["nan_on_rank0"] == dict(norm=float("inf"), skipped=True, finite=True)
