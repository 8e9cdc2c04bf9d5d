"""Our ZeRO-3 in one process: the units it picks, the meta-device build against the unsharded one, the re-cut of
optimizer state at another world size, and a step on one rank against plain torch (no collectives here; the
multi-rank checks are in tests/sharding/test_zero3_parity.py)."""

from __future__ import annotations

import copy

import pytest
import torch

from zero_train.hf.models import build_model, model_config
from zero_train.runtime.errors import UsageError
from zero_train.sharding.state_dict import cut
from zero_train.sharding.zero3 import state as zero3_state
from zero_train.sharding.zero3.meta_build import MetaBuild
from zero_train.sharding.zero3.model import Zero3Model
from zero_train.sharding.zero3.optim import Zero3Optimizer

pytestmark = pytest.mark.tier("quick")


def _tiny(name: str = "tiny"):
    torch.manual_seed(0)
    return build_model(model_config(name, vocab_size=256))


def test_units_of_gpt2_are_blocks_embedding_head_and_root_with_the_tied_weight_in_the_embedding():
    model = _tiny()
    sharded = Zero3Model(model)
    assert [u.name for u in sharded.units] == ["", "transformer.wte", "transformer.h.0", "transformer.h.1"]
    assert [p.name for p in sharded.points] == [
        "",
        "transformer.wte",
        "transformer.h.0",
        "transformer.h.1",
        "lm_head",
    ]
    embedding = sharded.units[1]
    assert sharded.points[-1].units == [embedding] and embedding.shared  # the head owns nothing: it needs wte
    assert model.lm_head.weight is model.transformer.wte.weight
    root = {id(p) for p in sharded.units[0].params}
    assert root == {
        id(model.transformer.wpe.weight),
        id(model.transformer.ln_f.weight),
        id(model.transformer.ln_f.bias),
    }
    assert sum(u.partition.num_elements for u in sharded.units) == sum(p.numel() for p in model.parameters())
    assert sharded.gathered_bytes() == 0  # nothing whole between passes; the shapes stay
    assert (
        model.transformer.wte.weight.shape == (256, 64)
        and model.transformer.wte.weight.untyped_storage().nbytes() == 0
    )


def test_a_model_naming_no_blocks_is_refused_in_one_line():
    with pytest.raises(UsageError, match="no transformer block class"):
        Zero3Model(torch.nn.Sequential(torch.nn.Linear(2, 2)))


@pytest.mark.parametrize("name", ["tiny", "llama-tiny", "qwen2-tiny"])
def test_meta_build_replays_every_parameter_bit_for_bit_and_leaves_the_generator_where_the_real_build_does(
    name,
):
    torch.manual_seed(3)
    reference = build_model(model_config(name))
    after_reference = torch.get_rng_state()
    torch.manual_seed(3)
    with MetaBuild() as build:
        model = build_model(model_config(name))
    assert all(p.device.type == "meta" for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), after_reference)
    for (key, param), (_, expected) in zip(
        model.named_parameters(), reference.named_parameters(), strict=True
    ):
        assert torch.equal(build.values(param), expected), key
    assert torch.equal(torch.get_rng_state(), after_reference)  # replays put the generator back


def test_meta_build_refuses_a_parameter_written_from_another():
    class Copies(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(2, 2)
            self.b = torch.nn.Linear(2, 2)
            with torch.no_grad():
                self.b.weight.copy_(self.a.weight)

    with pytest.raises(UsageError, match="one parameter from another"), MetaBuild():
        Copies()


def test_one_rank_trains_exactly_like_plain_torch_and_frees_every_unit_between_passes():
    reference = _tiny()
    model = copy.deepcopy(reference)
    sharded = Zero3Model(model)
    optimizer = Zero3Optimizer(sharded, torch.optim.AdamW, lr=1e-2, weight_decay=0.1, foreach=False)
    plain = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        batch = torch.randint(0, 256, (2, 16), generator=generator)
        losses = [m(input_ids=batch, labels=batch).loss for m in (model, reference)]
        for loss in losses:
            loss.backward()
        assert losses[0].item() == losses[1].item()
        assert sharded.gathered_bytes() == 0
        optimizer.step()
        optimizer.zero_grad()
        plain.step()
        plain.zero_grad()
    for param, expected in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(zero3_state.gathered_param(optimizer, param), expected.detach())


def test_state_of_a_piece_is_cut_from_saved_pieces_of_any_cutting():
    exp_avg = torch.arange(10.0)
    saved = [
        [0, 3, {"exp_avg": exp_avg[:3], "step": torch.tensor(4.0)}],
        [3, 7, {"exp_avg": exp_avg[3:], "step": 4.0}],
    ]
    state = cut(saved, 2, 5, (5,))
    assert torch.equal(state["exp_avg"], exp_avg[2:7]) and float(state["step"]) == 4.0
    with pytest.raises(UsageError, match="a rank's shard is missing"):
        cut(saved[:1], 2, 5, (5,))


def test_each_block_is_gathered_only_around_its_own_forward_and_backward_with_the_next_one_prefetched():
    """What is gathered while block 0 and block 1 run, forward and backward (one rank: the lifecycle alone)."""
    model = _tiny()
    sharded = Zero3Model(model)
    root, wte, h0, h1 = sharded.units
    seen: list[tuple[str, tuple[bool, ...]]] = []

    def watch(name):
        def hook(*_):
            seen.append((name, tuple(u.gathered for u in (root, wte, h0, h1))))

        return hook

    for block, name in ((model.transformer.h[0], "h0"), (model.transformer.h[1], "h1")):
        block.register_forward_pre_hook(watch(f"{name} forward"))  # after ours: the block is gathered
        block.mlp.c_fc.register_full_backward_pre_hook(
            watch(f"{name} backward")
        )  # inside the block's backward
    batch = torch.randint(0, 256, (2, 16))
    for _ in range(2):  # the second step runs with the first one's traces
        seen.clear()
        model(input_ids=batch, labels=batch).loss.backward()
        sharded.reducer.zero_grad()
        assert sharded.gathered_bytes() == 0
    # step 2 (the traces known): root and the tied embedding held through each pass, the current block and
    # the next one in that pass's order, nothing else; (root, wte, h0, h1)
    assert seen == [
        ("h0 forward", (True, True, True, True)),  # h1 prefetched while h0 computes
        ("h1 forward", (True, True, False, True)),  # h0 freed after its forward
        ("h1 backward", (True, True, True, True)),  # h0 prefetched while h1's backward runs
        ("h0 backward", (True, True, True, False)),  # h1 freed after its backward
    ]
