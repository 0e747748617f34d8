"""Plugins: third-party strategies and prompt interceptors, and the host that keeps them honest.

A plugin strategy is `fn(view: ShiftView)` returning the ids of blocks to leave out, or a
`StrategyPlan` (ids to leave out, replacement text for blocks, one summary text), or None (no
change). It sees a read-only view and never touches the engine's state. The host guards it:
- a plan that leaves out or rewrites a protected block is rejected: the block is restored and the
  shift falls back to truncate (`PLAN_REJECTED`); ids the conversation does not have, or a return
  value of another type, are rejected the same way (`PLAN_INVALID`);
- a plan that splits a tool-call group is extended to the whole group (`GROUP_EXTENDED`);
- a plugin that raises (`PLUGIN_ERROR`) or runs past `plugin_timeout_ms` (`PLUGIN_TIMEOUT`) falls
  back to truncate; a timed-out call cannot be stopped, so it finishes on its plugin thread and
  its answer is dropped, while later calls get other threads (`PluginThreads`); while
  MAX_HUNG_CALLS such calls still run, new ones are not made (`PLUGINS_SATURATED`, truncate);
- the plan is counted by the core, which goes on oldest-first when it is still over the budget
  (`FINAL_SHIFT`); shift_context then recounts the prompt independently.

An interceptor is `fn(messages, context: InterceptorContext)` run after the shift on (copies of)
the final provider messages, returning the messages to send instead, or None (no change). The
host recounts what it returns and shifts again when it is over the budget (the pins the pinned
cap removed stay removed), so an interceptor cannot push the prompt past the limit; one that
raises, runs past the time limit, returns something else than a list of messages or messages that
cannot be read, drops a protected message or part of a group (a tool call without its result, a
reasoning item without its output items), or grows the protected ones past the budget, is skipped
(the messages before it stay).

Layout: `calls` (plugin threads, time limits), `strategies`, `interception` (with the host's
recount and shift after them), `entry_points` (installed packages' plugins).

Register at run time with `register_strategy(name, fn)` / `register_interceptor(fn)` (each
returns a cleanup that unregisters), or from an installed package's entry points in the groups
`contextshift.strategies` and `contextshift.interceptors` (loaded on first use; an entry point's
name is the strategy's or interceptor's name; a strategy may carry `description` and `options`
attributes). A plugin strategy runs only when a request names it, but an interceptor changes
every prompt of the process: one from an entry point runs only once enabled by name, in
`CONTEXTSHIFT_INTERCEPTORS` (comma-separated) or with `enable_interceptors`. Every event is a
`Diagnostic` in the result.
"""

from __future__ import annotations

from contextshift.plugins import entry_points
from contextshift.plugins.calls import MAX_HUNG_CALLS, PluginsSaturated, PluginThreads, call_with_timeout
from contextshift.plugins.entry_points import (
    INTERCEPTOR_GROUP,
    INTERCEPTORS_ENV,
    STRATEGY_GROUP,
    enable_interceptors,
)
from contextshift.plugins.interception import (
    Intercepted,
    InterceptorContext,
    interceptors,
    register_interceptor,
    run_interceptors,
)
from contextshift.plugins.strategies import BlockView, ShiftView, StrategyPlan, register_strategy
from contextshift.strategies import registry

registry.entry_point_loader = entry_points.load

__all__ = [
    "INTERCEPTORS_ENV",
    "INTERCEPTOR_GROUP",
    "MAX_HUNG_CALLS",
    "STRATEGY_GROUP",
    "BlockView",
    "Intercepted",
    "InterceptorContext",
    "PluginThreads",
    "PluginsSaturated",
    "ShiftView",
    "StrategyPlan",
    "call_with_timeout",
    "enable_interceptors",
    "interceptors",
    "register_interceptor",
    "register_strategy",
    "run_interceptors",
]
