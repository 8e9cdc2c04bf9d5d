"""What happens when the loss or the gradient norm stops being a finite number.

The train loop calls `NonFiniteGuard.check` after every optimizer step with the loss averaged over ranks
and the global gradient norm, so every rank takes the same decision.

- policy "stop" (default): a non-finite loss or grad norm on an APPLIED step raises NonFiniteError (the run
  exits 1 with one line naming the step, the value, the likely cause and `--on-nonfinite`).
- policy "skip": such steps are reported (a warning) and training goes on; after `max_consecutive`
  of them in a row it stops anyway (the weights are NaN by then, more steps cannot help).
- fp16 with dynamic loss scaling: an overflowing step is SKIPPED by the engine (`skipped=True`) and the
  scale is lowered; that is normal and tolerated under both policies, unless `max_consecutive_skipped`
  steps in a row overflow (the scale can no longer help: the model itself diverged).
"""

from __future__ import annotations

import math
import warnings

from zero_train.runtime.errors import NonFiniteError

NONFINITE_POLICIES = ("stop", "skip")
__all__ = [
    "NONFINITE_POLICIES",
    "NonFiniteError",
    "NonFiniteGuard",
]  # NonFiniteError: zero_train.runtime.errors


class NonFiniteGuard:
    """Watches every step's loss and gradient norm and applies the --on-nonfinite policy.

    Args:
        policy: "stop" or "skip" (see the module docstring).
        precision: "fp32" | "bf16" | "fp16" if known; sharpens the likely cause in the message.
        max_consecutive: under "skip", stop after this many non-finite applied steps in a row.
        max_consecutive_skipped: stop after this many fp16-overflow-skipped steps in a row.
    """

    def __init__(
        self,
        policy: str = "stop",
        *,
        precision: str | None = None,
        max_consecutive: int = 8,
        max_consecutive_skipped: int = 64,
    ) -> None:
        if policy not in NONFINITE_POLICIES:
            raise ValueError(f"--on-nonfinite must be one of {', '.join(NONFINITE_POLICIES)}, got {policy!r}")
        self.policy = policy
        self.precision = precision
        self.max_consecutive = max_consecutive
        self.max_consecutive_skipped = max_consecutive_skipped
        self.nonfinite_in_a_row = 0
        self.skipped_in_a_row = 0
        self.nonfinite_steps: list[int] = []
        """Steps whose loss or grad norm was non-finite (tolerated under "skip" or fp16 skipping)."""

    def check(self, *, step: int, loss: float, grad_norm: float | None, skipped: bool) -> None:
        """Apply the policy to one finished optimizer step.

        Args:
            step: the step number (as the loop logs it).
            loss: the loss of this step, averaged over ranks (identical on every rank).
            grad_norm: the global gradient norm before clipping (None if the engine does not know it).
            skipped: the engine skipped the update (fp16 loss-scale overflow).

        Raises:
            NonFiniteError: under "stop" on a non-finite applied step, or when the tolerance runs out.
        """
        bad = _nonfinite_values(loss=loss, grad_norm=grad_norm)
        if skipped:
            self._on_skipped(step, bad)
            return
        self.skipped_in_a_row = 0
        if not bad:
            self.nonfinite_in_a_row = 0
            return
        self.nonfinite_in_a_row += 1
        self.nonfinite_steps.append(step)
        if self.policy == "stop":
            raise NonFiniteError(
                self._message(step, bad, tail="pass --on-nonfinite skip to go on regardless")
            )
        if self.nonfinite_in_a_row >= self.max_consecutive:
            raise NonFiniteError(
                self._message(
                    step,
                    bad,
                    tail=f"{self.nonfinite_in_a_row} steps in a row under --on-nonfinite skip, stopping",
                )
            )
        warnings.warn(self._message(step, bad, tail="skipped under --on-nonfinite skip"), stacklevel=2)

    def _on_skipped(self, step: int, bad: list[str]) -> None:
        self.skipped_in_a_row += 1
        if bad:
            self.nonfinite_steps.append(step)
        if self.skipped_in_a_row >= self.max_consecutive_skipped:
            raise NonFiniteError(
                f"step {step}: {self.skipped_in_a_row} optimizer steps in a row skipped for fp16 overflow "
                "(the loss scale cannot go lower usefully): the model diverged; likely cause: learning rate "
                "too high or bad data; lower --lr or use bf16 (--on-nonfinite does not change this)"
            )

    def _message(self, step: int, bad: list[str], *, tail: str) -> str:
        return f"step {step}: non-finite {' and '.join(bad)}; likely cause: {self._likely_cause()}; {tail}"

    def _likely_cause(self) -> str:
        if self.precision == "fp16":
            return "fp16 overflow without dynamic loss scaling, a learning rate too high, or bad data"
        if self.precision in ("fp32", "bf16"):
            return "learning rate too high (lower --lr or add warmup), or bad data (a corrupt batch)"
        return "learning rate too high, fp16 overflow without loss scaling, or bad data"


def _nonfinite_values(*, loss: float, grad_norm: float | None) -> list[str]:
    """['loss nan', 'grad norm inf'] for the values that are not finite."""
    values = [("loss", loss), ("grad norm", grad_norm)]
    return [f"{name} {value}" for name, value in values if value is not None and not math.isfinite(value)]
