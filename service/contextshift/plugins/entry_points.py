"""Plugins from installed packages' entry points: every strategy of the group
`contextshift.strategies` is registered on first use of the registry; an interceptor of the group
`contextshift.interceptors` only once enabled by name (`CONTEXTSHIFT_INTERCEPTORS`, or
`enable_interceptors`), since it changes every prompt of the process."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from importlib.metadata import entry_points

from contextshift.plugins.interception import register_interceptor
from contextshift.plugins.strategies import register_strategy

log = logging.getLogger("contextshift.plugins")

STRATEGY_GROUP = "contextshift.strategies"
INTERCEPTOR_GROUP = "contextshift.interceptors"
INTERCEPTORS_ENV = "CONTEXTSHIFT_INTERCEPTORS"
_enabled: set[str] = set()


def load() -> None:
    """Registers every strategy of the installed packages' entry points, and the interceptors
    `CONTEXTSHIFT_INTERCEPTORS` enables (called once, on first use of the registry)."""
    for point in entry_points(group=STRATEGY_GROUP):
        try:
            loaded = point.load()
            register_strategy(
                point.name,
                loaded,
                description=getattr(loaded, "description", ""),
                options=getattr(loaded, "options", ()),
            )
        except Exception as error:  # a broken plugin must not take the service down
            _not_loaded(STRATEGY_GROUP, point.name, error)
    names = [n.strip() for n in os.environ.get(INTERCEPTORS_ENV, "").split(",") if n.strip()]
    try:
        enable_interceptors(names)
    except ValueError as error:
        _not_loaded(INTERCEPTOR_GROUP, ",".join(names), error)


def enable_interceptors(names: Iterable[str]) -> None:
    """Registers the interceptors of these entry-point names (each once). A name no installed
    package declares is a ValueError naming what is installed."""
    wanted = [n for n in names if n not in _enabled]
    if not wanted:
        return
    points = {p.name: p for p in entry_points(group=INTERCEPTOR_GROUP)}
    missing = [n for n in wanted if n not in points]
    if missing:
        raise ValueError(f"no interceptor entry points named {missing} (installed: {sorted(points)})")
    for name in wanted:
        try:
            register_interceptor(points[name].load(), name=name)
            _enabled.add(name)
        except Exception as error:
            _not_loaded(INTERCEPTOR_GROUP, name, error)


def _not_loaded(group: str, name: str, error: Exception) -> None:
    what = f"{type(error).__name__}: {error}"
    fields = {"group": group, "entry_point": name, "error": what}
    log.error("plugin not loaded: %s %r: %s", group, name, what, extra={"fields": fields})
