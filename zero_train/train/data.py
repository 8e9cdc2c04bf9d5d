"""The run's data: packed up front (rank 0 first) or streamed, the batches each rank reads, the steps of an epoch
and the read position a checkpoint keeps.

    data = RunData.prepare(config.data, tokenizer, seed=0, dist_info=dist_info, micro_batch_size=2,
                           eval_blocks=32, process_group=waiting)
    data.epoch_steps(grad_accum=4)        # optimizer steps per epoch (None: a stream's size is unknown)
    batches = data.batches(micro_steps=0, position=None)   # {"input_ids": LongTensor [micro, block]} (+ "labels")
    data.position()                       # a stream's read position after the last batch (None: map-style)
    data.validation                       # the held-out blocks (map-style Dataset)

A packed dataset is read in a seeded shuffle per epoch (zero_train.hf.batches.rank_batches), so its position is
just the micro-steps consumed; a stream's is each rank's own (zero_train.hf.streaming.RankStream.state).
"""

from __future__ import annotations

import math

from zero_train.hf.batches import rank_batches, steps_per_epoch
from zero_train.hf.prepare import prepare_text
from zero_train.runtime.errors import UsageError
from zero_train.train.config import DataConfig


class RunData:
    """The training batches and held-out blocks of one run (build it with RunData.prepare)."""

    def __init__(self, *, train, validation, stream, dist_info, micro_batch_size: int, seed: int) -> None:
        self.train, self.validation, self.stream = train, validation, stream
        self.dist_info, self.micro_batch_size, self.seed = dist_info, micro_batch_size, seed

    @classmethod
    def prepare(
        cls,
        config: DataConfig,
        tokenizer,
        *,
        seed: int,
        dist_info,
        micro_batch_size: int,
        eval_blocks: int,
        process_group=None,
    ) -> RunData:
        """Load and pack (rank 0 first, the others read its cache), or open the streams (every rank).

        Args:
            config: the run config's data part.
            tokenizer: the run's tokenizer.
            seed: the data order's seed.
            dist_info: this rank's DistInfo.
            micro_batch_size: blocks per rank per micro-step.
            eval_blocks: held-out blocks a stream reads (a packed split keeps all of its own).
            process_group: the group that waits for rank 0 (a long timeout), or None.
        """
        options = dict(column=config.text_column, config_name=config.dataset_config, chat=config.sft)
        if config.streaming:
            # expensive: datasets; only streamed data needs it
            from zero_train.hf.streaming import prepare_streams

            streams = prepare_streams(
                config.dataset,
                tokenizer,
                block_size=config.block_size,
                seed=seed,
                rank=dist_info.rank,
                world_size=dist_info.world_size,
                eval_blocks=eval_blocks,
                process_group=process_group,
                **options,
            )
            return cls(
                train=None,
                validation=streams.validation,
                stream=streams.train,
                dist_info=dist_info,
                micro_batch_size=micro_batch_size,
                seed=seed,
            )

        packed = prepare_text(
            config.dataset,
            tokenizer,
            block_size=config.block_size,
            seed=seed,
            process_group=process_group,
            **options,
        )
        if (
            steps_per_epoch(
                packed["train"], world_size=dist_info.world_size, micro_batch_size=micro_batch_size
            )
            == 0
        ):
            raise UsageError(
                f"the training split has {len(packed['train'])} blocks of {config.block_size} tokens, fewer "
                f"than one global micro-batch ({micro_batch_size} x {dist_info.world_size} ranks); use more data, "
                "a smaller --block-size or --micro-batch-size"
            )
        return cls(
            train=packed["train"],
            validation=packed["validation"],
            stream=None,
            dist_info=dist_info,
            micro_batch_size=micro_batch_size,
            seed=seed,
        )

    def epoch_steps(self, *, grad_accum: int) -> int | None:
        """Optimizer steps in one pass, as the HF Trainer counts them (at least 1); None for a stream."""
        if self.stream is not None:
            return None

        micro = steps_per_epoch(
            self.train, world_size=self.dist_info.world_size, micro_batch_size=self.micro_batch_size
        )
        return max(1, micro // grad_accum)

    def steps_for_epochs(self, epochs: float, *, grad_accum: int) -> int:
        """--num-train-epochs in optimizer steps: ceil(epochs x steps per epoch), as the HF Trainer's max_steps."""
        return math.ceil(epochs * self.epoch_steps(grad_accum=grad_accum))

    def batches(self, *, micro_steps: int, position: dict | None):
        """This rank's micro-batches from a checkpoint's data position on (0 / None: the start)."""
        if self.stream is not None:
            if position is not None:
                if position["world_size"] != self.dist_info.world_size:
                    raise UsageError(
                        f"the checkpoint was written by a --streaming run of {position['world_size']} ranks, each "
                        f"reading its own share of the stream; resume it with {position['world_size']} ranks"
                    )
                self.stream = self.stream.resumed(position)
            return iter(lambda: self.stream.next_batch(self.micro_batch_size), None)

        return rank_batches(
            self.train,
            rank=self.dist_info.rank,
            world_size=self.dist_info.world_size,
            micro_batch_size=self.micro_batch_size,
            seed=self.seed,
            start_step=micro_steps,
        )

    def position(self) -> dict | None:
        """A stream's read position after the last batch (for the checkpoint); None for a packed dataset."""
        if self.stream is None:
            return None
        return dict(self.stream.state(), world_size=self.dist_info.world_size)
