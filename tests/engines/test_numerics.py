"""zero_train.train.numerics.NonFiniteGuard: stop / skip policies and fp16 loss-scale skipping.

Unit tests on real values, then scripts/train.py's main end to end with an absurd learning rate: fp32 under
"stop" (exit 1 at the first non-finite step), under "skip" (tolerated steps recorded, exit 1 after 8 in a
row), and fp16 with dynamic loss scaling (each overflow skips the step and halves the scale; exit 1 once 64
steps in a row overflowed).
"""

from __future__ import annotations

import math
import pathlib

import pytest
import torch

from zero_train.train.numerics import NonFiniteError, NonFiniteGuard

pytestmark = pytest.mark.tier("quick")


def real_step_values(lr: float) -> tuple[float, float]:
    """Loss and grad norm of a real step of a tiny regression after one update at `lr`."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    data, target = torch.randn(16, 8) * 1e3, torch.randn(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(6):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data), target)
        loss.backward()
        optimizer.step()
    grad_norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    return float(loss.detach()), float(grad_norm)


def test_stop_names_step_value_cause_and_flag():
    guard = NonFiniteGuard("stop")
    loss, grad_norm = real_step_values(lr=1e-9)
    assert math.isfinite(loss) and math.isfinite(grad_norm)
    guard.check(step=1, loss=loss, grad_norm=grad_norm, skipped=False)
    loss, grad_norm = real_step_values(lr=10.0)  # diverges to inf/nan
    assert not math.isfinite(loss)
    with pytest.raises(NonFiniteError) as info:
        guard.check(step=7, loss=loss, grad_norm=grad_norm, skipped=False)
    message = str(info.value)
    assert message.startswith("step 7: non-finite loss ")
    assert "learning rate too high" in message and "fp16 overflow" in message and "bad data" in message
    assert "--on-nonfinite skip" in message and "\n" not in message


def test_grad_norm_alone_and_precision_specific_cause():
    with pytest.raises(NonFiniteError, match="step 3: non-finite grad norm inf; likely cause: fp16 overflow"):
        NonFiniteGuard("stop", precision="fp16").check(step=3, loss=2.5, grad_norm=math.inf, skipped=False)
    with pytest.raises(
        NonFiniteError, match=r"grad norm nan; likely cause: learning rate too high \(lower --lr"
    ):
        NonFiniteGuard("stop", precision="bf16").check(step=3, loss=2.5, grad_norm=math.nan, skipped=False)


def test_skip_policy_warns_then_stops_after_too_many_in_a_row():
    guard = NonFiniteGuard("skip", max_consecutive=3)
    for step in (1, 2):
        with pytest.warns(
            UserWarning, match=f"step {step}: non-finite loss nan.*skipped under --on-nonfinite skip"
        ):
            guard.check(step=step, loss=math.nan, grad_norm=1.0, skipped=False)
    guard.check(step=3, loss=1.0, grad_norm=1.0, skipped=False)  # a finite step resets the count
    for step in (4, 5):
        with pytest.warns(UserWarning):
            guard.check(step=step, loss=math.inf, grad_norm=None, skipped=False)
    with pytest.raises(NonFiniteError, match="step 6: .*3 steps in a row under --on-nonfinite skip"):
        guard.check(step=6, loss=math.nan, grad_norm=math.nan, skipped=False)
    assert guard.nonfinite_steps == [1, 2, 4, 5, 6]


def test_fp16_overflow_skips_are_tolerated_under_stop_until_the_scale_cannot_help():
    from zero_train.engines.precision import DynamicLossScaler

    scaler = DynamicLossScaler(init_scale=16, scale_window=1000, hysteresis=1, min_scale=1.0)
    guard = NonFiniteGuard("stop", precision="fp16", max_consecutive_skipped=10)
    for step in range(9):  # real overflow steps: the scaler lowers the scale, the guard lets them pass
        scaler.update_scale(True)
        guard.check(step=step, loss=1.0, grad_norm=math.inf, skipped=True)
    assert scaler.loss_scale == 1.0
    guard.check(step=9, loss=1.0, grad_norm=0.5, skipped=False)  # a good step resets the count
    for step in range(10, 19):
        guard.check(step=step, loss=math.nan, grad_norm=math.inf, skipped=True)
    with pytest.raises(
        NonFiniteError, match="step 19: 10 optimizer steps in a row skipped for fp16 overflow"
    ):
        guard.check(step=19, loss=math.nan, grad_norm=math.inf, skipped=True)


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="--on-nonfinite must be one of stop, skip"):
        NonFiniteGuard("ignore")


# scripts/train.py's main, one rank each, an absurd learning rate: the weights blow up after the warmup's first steps
DIVERGING = ["--model", "tiny", "--block-size", "16", "--micro-batch-size", "1", "--no-progress", "--lr", "1e30",
             "--max-steps", "100"]  # fmt: skip
END_TO_END = {
    "fp32-stop": (
        ["--engine", "ddp"],
        r"step (\d+): non-finite loss nan and grad norm nan; likely cause: learning rate too high \(lower --lr "
        r"or add warmup\), or bad data \(a corrupt batch\); pass --on-nonfinite skip to go on regardless",
    ),
    "fp32-skip": (
        ["--engine", "ddp", "--on-nonfinite", "skip"],
        r"step (\d+): non-finite loss nan and grad norm nan; .* 8 steps in a row under --on-nonfinite skip",
    ),
    "fp16-loss-scaling": (
        ["--engine", "zero1", "--precision", "fp16"],
        r"step (\d+): 64 optimizer steps in a row skipped for fp16 overflow .* lower --lr or use bf16",
    ),
}


@pytest.fixture(scope="module")
def diverged(tmp_path_factory) -> dict[str, tuple[int, str, pathlib.Path]]:
    """Each case's exit code, stderr and metrics file: scripts/train.py's main in a spawned rank each
    (zero_train.testing.console.train_py: the policies are the loop's, an interpreter would only add imports; a
    real train.py process's exit code and one line: tests/package/test_hostile_input.py, tests/train/test_faults.py)."""
    from zero_train.hf.offline import stdlib_files
    from zero_train.testing import run_ranks
    from zero_train.testing.console import train_py

    root = tmp_path_factory.mktemp("diverging")
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join(p.read_text(errors="replace") for p in stdlib_files(20_000)))

    def argv(case: str) -> list[str]:
        flags, _ = END_TO_END[case]
        return [*DIVERGING, *flags, "--dataset", str(corpus), "--metrics-file", str(root / case)]

    results = {}
    for case in sorted(END_TO_END):
        code, _, stderr = run_ranks(train_py, 1, (argv(case),), timeout_s=300)[0]
        results[case] = (code, stderr, root / case)
    return results


@pytest.mark.tier("slow")
@pytest.mark.parametrize("case", sorted(END_TO_END))
def test_a_diverging_run_stops_with_one_line_naming_the_step(diverged, case):
    """Through scripts/train.py's main: exit 1, one `error:` line naming the step and the likely cause."""
    import json
    import re

    _, pattern = END_TO_END[case]
    returncode, stderr, metrics = diverged[case]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert returncode == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert len(errors) == 1 and (match := re.match(f"error: {pattern}", errors[0])), errors
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    stopped_at = int(match.group(1))
    assert [r["step"] for r in records] == list(range(1, stopped_at))  # the stopping step is not recorded
    if case == "fp32-skip":  # the tolerated steps are recorded as they were: non-finite
        assert sum(not math.isfinite(r["loss"]) for r in records) == 7
    if case == "fp16-loss-scaling":  # every overflow skipped the step and halved the scale (down to 1)
        skipped = [r for r in records if r["skipped"]]
        assert len(skipped) == 63 and all(not r["skipped"] for r in records[: -len(skipped)])
        scales = [r["loss_scale"] for r in skipped]
        assert all(later == max(1.0, earlier / 2) for earlier, later in zip(scales, scales[1:], strict=False))
