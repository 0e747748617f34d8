"""The strategy registry: built-in strategies, strategies plugins register at run time
(`contextshift.register_strategy`), and those installed packages declare under the entry-point
group `contextshift.strategies` (loaded on first use). Thread-safe."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from contextshift.errors import InvalidOptions
from contextshift.options import OptionSpec
from contextshift.strategies.context import Outcome, StrategyContext

log = logging.getLogger("contextshift.strategies")


@dataclass(frozen=True)
class StrategyInfo:
    """A strategy as ListStrategies shows it, and how to run it."""

    name: str
    description: str
    # Its own options, beyond the common ones (contextshift.options.COMMON).
    options: tuple[OptionSpec, ...]
    fn: Callable[[StrategyContext], Outcome]
    # Shipped with contextshift (ListStrategies says so).
    builtin: bool = False
    # Fast, deterministic, without I/O: a server may run its small shifts on its event loop.
    local: bool = False

    def run(self, ctx: StrategyContext) -> Outcome:
        """The strategy's outcome, with a warning first when the request's preset sets options
        the strategy does not take (said here once, for every strategy, plugins' too)."""
        outcome = self.fn(ctx)
        preset = ctx.options.preset_warnings(self.name)
        if preset:
            outcome.warnings = [*preset, *outcome.warnings]
        return outcome


_lock = threading.Lock()
_strategies: dict[str, StrategyInfo] = {}
_entry_points_loaded = False
# Loads the entry points of one group into the registry; set by contextshift.plugins.
entry_point_loader: Callable[[], None] | None = None


def add(info: StrategyInfo) -> Callable[[], None]:
    """Registers `info`; returns the cleanup that unregisters it. A name already taken is a
    ValueError: a plugin must not silently replace a strategy callers rely on."""
    with _lock:
        if info.name in _strategies:
            raise ValueError(f"a strategy named {info.name!r} is already registered")
        _strategies[info.name] = info

    def cleanup() -> None:
        with _lock:
            if _strategies.get(info.name) is info:
                del _strategies[info.name]

    return cleanup


def ensure_loaded() -> None:
    """Loads the installed plugins' entry points, once."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True  # before loading: a failing plugin is reported once, not per call
    if entry_point_loader is not None:
        entry_point_loader()


def list_strategies() -> list[StrategyInfo]:
    """Every registered strategy, by name."""
    ensure_loaded()
    with _lock:
        return sorted(_strategies.values(), key=lambda s: s.name)


def strategy_named(name: str) -> StrategyInfo:
    """The strategy `name`; `InvalidOptions` on field `strategy` when there is none."""
    ensure_loaded()
    with _lock:
        info = _strategies.get(name)
        known = sorted(_strategies)
    if info is None:
        raise InvalidOptions([("strategy", f"unknown strategy {name!r} (known: {', '.join(known)})")])
    return info


def runs_inline(name: str) -> bool:
    """Whether the strategy `name` is local (fast, no I/O), so a server may run its small shifts on
    its event loop; an unknown name is False (its error is raised where the shift runs)."""
    with _lock:
        info = _strategies.get(name)
    return info is not None and info.local
