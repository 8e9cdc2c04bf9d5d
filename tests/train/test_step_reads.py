"""The training loop waits for the device once per logged step and never between, and our ZeRO-1/2/3 steps never
make the host wait (issue 37): measured by the run record's counters (zero_train.comm.step_counters) on 2 gloo
ranks, each tensor placed as a GPU run would place it (zero_train.runtime.host_syncs).

One call on the 2-rank pool trains the tiny model 2 steps per run, both counted, with --logging-steps 2: step 1 is
not logged, step 2 is. Runs: zero1; zero1 logging every step with a `.item()` planted in its step (the counter
must catch it; reading does not change the numbers, so its losses must equal the first run's); zero2 at 2
micro-batches per step; zero3.
"""

from __future__ import annotations

import json
import pathlib

import pytest

pytestmark = pytest.mark.tier("multiproc")

RUNS = {  # name: (engine, grad_accum, logging steps, plant an .item() in the engine's step)
    "zero1": ("zero1", 1, 2, False),
    "zero1-planted": ("zero1", 1, 1, True),
    "zero2": ("zero2", 2, 2, False),
    "zero3": ("zero3", 1, 2, False),
}


def _train_runs(rank: int, world_size: int, corpus: str, out: str) -> dict:
    from zero_train.engines.zero1 import Zero1Engine
    from zero_train.train.args import parse_args
    from zero_train.train.loop import run_training

    apply_step = Zero1Engine._apply_step

    def planted(self, lr):
        result = apply_step(self, lr)
        next(self.model.parameters()).sum().item()  # a host read that does not belong in a step
        return result

    for name, (engine, grad_accum, logging_steps, plant) in RUNS.items():
        argv = ["--engine", engine, "--model", "tiny", "--dataset", corpus, "--block-size", "32", "--max-steps", "2",
                "--grad-accum", str(grad_accum), "--logging-steps", str(logging_steps), "--eval-batches", "1",
                "--no-progress", "--counted-steps", "2", "--memory-report", f"{out}/{name}.json",
                "--metrics-file", f"{out}/{name}.jsonl"]  # fmt: skip
        Zero1Engine._apply_step = planted if plant else apply_step
        try:
            run_training(parse_args(argv))
        finally:
            Zero1Engine._apply_step = apply_step
    if rank != 0:
        return {}
    return {
        name: dict(
            record=json.loads(pathlib.Path(f"{out}/{name}.json").read_text()),
            metrics=[
                json.loads(line) for line in pathlib.Path(f"{out}/{name}.jsonl").read_text().splitlines()
            ],
        )
        for name in RUNS
    }


@pytest.fixture(scope="module")
def runs(rank_pool, tmp_path_factory):
    from zero_train.hf.offline import stdlib_files

    out = tmp_path_factory.mktemp("step_reads")
    corpus = out / "corpus.txt"
    corpus.write_text("\n\n".join(path.read_text(errors="replace") for path in stdlib_files(40_000)))
    return rank_pool(2).run(_train_runs, (str(corpus), str(out)))[0]


def _ranks(runs, name: str) -> list[dict]:
    return runs[name]["record"]["ranks"]


@pytest.mark.parametrize("name", ["zero1", "zero2", "zero3"])
def test_our_zero1_zero2_and_zero3_steps_make_no_host_sync(runs, name):
    for rank in _ranks(runs, name):
        syncs = rank["host_syncs_per_step"]
        assert syncs["steps_counted"] == [1, 2]
        assert syncs["engine"] == 0, syncs["sites"]


@pytest.mark.parametrize("name", ["zero1", "zero2", "zero3"])
def test_the_loop_syncs_once_per_logged_step_and_never_between(runs, name):
    for rank in _ranks(runs, name):
        syncs, collectives = rank["host_syncs_per_step"], rank["collectives_per_step"]
        assert syncs["loop_unlogged"] == 0, syncs  # step 1, not logged
        assert syncs["loop"] == 1, syncs["sites"]  # step 2: the one read of both steps' values
        values = 2 * 4 + 1  # per rank, float64: (loss, grad norm, allocated, peak) x 2 steps + the save flag
        assert collectives["by_collective"]["loop"] == {"all_gather": {"calls": 1, "bytes": 2 * 8 * values}}


def test_a_planted_item_in_the_engine_step_is_caught_where_it_was_planted(runs):
    for rank in _ranks(runs, "zero1-planted"):
        syncs = rank["host_syncs_per_step"]
        assert syncs["engine"] == 1
        assert [site for site in syncs["sites"]["engine"]] == [
            next(
                site
                for site in syncs["sites"]["engine"]
                if "test_step_reads.py" in site and "(planted)" in site
            )
        ]
        assert syncs["loop"] == 1 and syncs["loop_unlogged"] is None  # logging every step: both steps logged


def test_no_step_loses_its_numbers_when_logging_every_other_step(runs):
    """Every step still reaches the metrics file with its loss, norm, time and memory; the values equal those of
    a run that reads every step (fp32 on CPU: bit for bit)."""
    every_other, every = runs["zero1"]["metrics"], runs["zero1-planted"]["metrics"]
    steps = [line for line in every_other if "loss" in line and "eval_loss" not in line]
    assert [line["step"] for line in steps] == [1, 2]
    reference = [line for line in every if "loss" in line and "eval_loss" not in line]
    assert [s["loss"] for s in steps] == [s["loss"] for s in reference]
    assert [s["grad_norm"] for s in steps] == [s["grad_norm"] for s in reference]
    for line in steps:
        assert line["step_time_s"] > 0 and len(line["memory"]) == 2 and line["memory"][0]["peak_bytes"] > 0


def test_collectives_per_step_name_the_engine_s_calls_and_bytes(runs):
    """zero1 on 2 gloo ranks: gradients and parameters travel in rings of isend/irecv (sharding/comm/gloo.py);
    each rank sends and receives half of Psi fp32 elements per ring, and the payload counts both ends: 2 Psi x 4
    bytes per step, the ZeRO paper's 2 Psi, as the probe's ledger of the same step says."""
    record = runs["zero1"]["record"]
    for rank in record["ranks"]:
        engine = rank["collectives_per_step"]["by_collective"]["engine"]
        assert rank["collectives_per_step"]["engine"] == sum(c["calls"] for c in engine.values())
        assert (
            engine["send_recv"]["bytes"]
            == 2 * record["num_params"] * 4
            == rank["comm_bytes_per_step"]["send_recv"]
        )
        assert 0.0 <= rank["overlap"]["share"] <= 1.0
