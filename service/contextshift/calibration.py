"""Calibration of approximate profiles against what providers report.

When a generation finishes, the provider's reported prompt tokens (FinishGeneration's
`reported_prompt_tokens`) and the shift's own raw estimate for that prompt give a ratio. Per model,
the ratios feed an exponential moving average that starts at 1.0; later estimates for that model
are multiplied by it. Every observed ratio is clamped to [0.5, 2.0] before it is averaged (one
broken report moves the factor by at most `ALPHA` of the way to a bound), and the factor itself
stays in [0.5, 2.0]. Exact profiles are never calibrated: `shift_context` applies the factor only
when the profile is approximate.

`Calibrator` keeps the state in memory, per process, for at most `MAX_MODELS` models (least
recently updated out first), thread-safe: what the library uses by default. The server keeps it in
its store instead (per tenant and model, shared by every worker and replica) and passes its own
`CalibrationSource` to `shift_context`; both apply `update`.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

MIN_FACTOR = 0.5
MAX_FACTOR = 2.0
# Weight of a new observation: ten reports move the factor ~89% of the way to a steady ratio.
ALPHA = 0.2
MAX_MODELS = 4096


@dataclass(frozen=True)
class Calibration:
    """One model's calibration: the factor applied to raw estimates, and how many reports made it."""

    model: str
    factor: float
    samples: int


def _clamp(ratio: float) -> float:
    return min(MAX_FACTOR, max(MIN_FACTOR, ratio))


def update(
    previous: Calibration | None, model: str, estimated: int, reported: int, alpha: float = ALPHA
) -> Calibration | None:
    """The calibration after one report: `estimated` is the raw (uncalibrated) prompt-token count
    contextshift computed for the prompt, `reported` the provider's count for the same prompt. None
    when the report carries no information (an empty model name, or a count that is not
    positive)."""
    if not model or estimated <= 0 or reported <= 0:
        return None
    before = previous or Calibration(model, 1.0, 0)
    factor = _clamp(before.factor + alpha * (_clamp(reported / estimated) - before.factor))
    return Calibration(model, factor, before.samples + 1)


class CalibrationSource(Protocol):
    """Where a shift reads a model's factor: a `Calibrator`, or the server's store."""

    def factor(self, model: str | None) -> float:
        """The factor for `model`: 1.0 until a report arrives."""
        ...


class Calibrator:
    def __init__(self, *, alpha: float = ALPHA, max_models: int = MAX_MODELS) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if max_models < 1:
            raise ValueError(f"max_models must be >= 1, got {max_models}")
        self._alpha = alpha
        self._max_models = max_models
        self._lock = threading.Lock()
        self._state: OrderedDict[str, Calibration] = OrderedDict()

    def record(self, model: str, estimated: int, reported: int) -> Calibration | None:
        """Feeds one report (see `update`); returns the model's new calibration, or None when the
        report carries no information."""
        with self._lock:
            updated = update(self._state.get(model), model, estimated, reported, self._alpha)
            if updated is None:
                return None
            self._state.pop(model, None)  # most recently updated last
            self._state[model] = updated
            while len(self._state) > self._max_models:
                self._state.popitem(last=False)
            return updated

    def get(self, model: str | None) -> Calibration | None:
        if not model:
            return None
        with self._lock:
            return self._state.get(model)

    def factor(self, model: str | None) -> float:
        """The factor for `model`: 1.0 until a report arrives."""
        calibration = self.get(model)
        return calibration.factor if calibration else 1.0

    def snapshot(self) -> list[Calibration]:
        with self._lock:
            return list(self._state.values())

    def reset(self, model: str | None = None) -> None:
        """Forgets one model's calibration, or every model's."""
        with self._lock:
            if model is None:
                self._state.clear()
            else:
                self._state.pop(model, None)


def calibrated(tokens: int, factor: float) -> int:
    """A raw count with the factor applied, rounded up (never under-counts the calibrated value)."""
    return math.ceil(tokens * factor - 1e-9)


def raw_budget(budget: int, factor: float) -> int:
    """The largest raw count whose calibrated count fits `budget`."""
    raw = math.floor(budget / factor + 1e-9)
    while raw > 0 and calibrated(raw, factor) > budget:
        raw -= 1
    return raw


# The library's calibrator: shifts read it unless given another source (the server gives its store).
DEFAULT = Calibrator()


def record(model: str, estimated: int, reported: int) -> Calibration | None:
    """`DEFAULT.record`: feeds a provider's reported prompt tokens to the library's calibration."""
    return DEFAULT.record(model, estimated, reported)
