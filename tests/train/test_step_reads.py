"""The training loop reads the loss and the gradient norm from the device once per optimizer step, not once per
micro-batch: the host reads of a step (Tensor.item / .tolist / __bool__ / __float__ / __int__) outside
engine.step() and the data loader (which builds each micro-batch on the host) are as many at 4 micro-batches per step as at 1. engine.step() itself is left to
tests/sharding/test_zero_step.py (on CPU, torch's foreach AdamW reads its CPU step counters there).

One call on the 2-rank pool trains the zero1 engine on the tiny model for 2 steps at each accumulation.
"""

from __future__ import annotations

import pytest
from test_zero_step import HostWaits, counting_tolist

pytestmark = pytest.mark.tier("multiproc")

READS = ("scalar read", "tolist")  # what makes the host wait for the device


def _reads_per_step(rank: int, world_size: int, corpus: str) -> dict:
    from zero_train.train.args import parse_args
    from zero_train.train.loop import Trainer, run_training

    train_step = Trainer._train_step
    reads: dict[int, list] = {}

    def counted_train_step(self, step, batches):
        engine_step, mode = self.engine.step, HostWaits()

        def unwatched(call):
            mode.paused = True
            try:
                return call()
            finally:
                mode.paused = False

        self.engine.step = lambda *args, **kwargs: unwatched(lambda: engine_step(*args, **kwargs))
        host_batches = (
            unwatched(lambda: next(batches)) for _ in iter(int, 1)
        )  # built on the host, as they are
        try:
            with mode, counting_tolist(mode):
                record = train_step(self, step, host_batches)
        finally:
            self.engine.step = engine_step
        reads.setdefault(self.settings.grad_accum, []).append(
            [kind for kind, _ in mode.events if kind in READS]
        )
        return record

    Trainer._train_step = counted_train_step
    try:
        for grad_accum in (1, 4):
            argv = ["--engine", "zero1", "--model", "tiny", "--dataset", corpus, "--block-size", "32",
                    "--max-steps", "2", "--grad-accum", str(grad_accum), "--eval-batches", "1", "--no-progress"]  # fmt: skip
            run_training(parse_args(argv))
    finally:
        Trainer._train_step = train_step
    return reads


def test_the_loop_reads_loss_and_norm_once_per_optimizer_step(rank_pool, tmp_path):
    from zero_train.hf.offline import stdlib_files

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(path.read_text(errors="replace") for path in stdlib_files(40_000)))
    for reads in rank_pool(2).run(_reads_per_step, (str(corpus),)):
        assert len(reads[1]) == len(reads[4]) == 2  # two steps at each accumulation
        for one, four in zip(reads[1], reads[4], strict=True):
            assert one == four  # no read per micro-batch
            assert one.count("tolist") >= 1  # the step's one transfer of (losses..., norm) is seen
