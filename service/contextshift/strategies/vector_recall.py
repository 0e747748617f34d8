"""`vector-recall`: before any history, drop non-mandatory lorebook and memory entries, least
relevant first (ties: older first), while the prompt is over; then history, oldest first.

A block's relevance is its `relevance` when given (0 to 1); else the cosine of its `meta.embedding`
with the `query_embedding` option, when both are there (-1 to 1); else BM25 of its text against the
current user input, computed by the core and divided by the most that input can score (0 to below
1). One scale, 0 unrelated to 1, so the sources rank together. The outcome lists each scored
block's relevance and its source.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from contextshift.errors import InvalidBlocks
from contextshift.options import OptionSpec
from contextshift.reasons import Reason
from contextshift.strategies.context import Outcome, Relevance, StrategyContext
from contextshift.strategies.registry import StrategyInfo

if TYPE_CHECKING:
    import numpy as np

RECALLED_KINDS = frozenset({"lorebook", "memory"})


def _embedding(message: Mapping[str, Any], index: int, dimensions: int) -> np.ndarray | None:
    meta = message.get("meta")
    if not isinstance(meta, Mapping) or meta.get("embedding") is None:
        return None
    value = meta["embedding"]
    field = f"blocks[{index}].meta.embedding"
    numbers = isinstance(value, list) and all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in value
    )
    if not numbers:
        raise InvalidBlocks([(field, "must be a list of numbers")])
    import numpy as np  # loaded already by `scores`, which has the query

    vector = np.asarray(value, dtype=np.float64)
    if vector.shape != (dimensions,) or not np.isfinite(vector).all():
        raise InvalidBlocks(
            [
                (
                    field,
                    f"must have {dimensions} finite numbers, like options.query_embedding; got {len(value)}",
                )
            ]
        )
    return vector


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    norms = float((a @ a) ** 0.5 * (b @ b) ** 0.5)
    return float(a @ b) / norms if norms else 0.0


def scores(ctx: StrategyContext, candidates: Sequence[int]) -> dict[int, tuple[float, str]]:
    """Relevance and its source for each candidate block."""
    layout = ctx.layout
    query: list[float] = ctx.options.get("query_embedding")
    query_vector = None
    if query:
        # Imported only for embeddings: numpy starts OpenBLAS's threads, which then take CPU from
        # every shift of the process.
        import numpy as np

        query_vector = np.asarray(query, dtype=np.float64)
    scored: dict[int, tuple[float, str]] = {}
    lexical = []
    for i in candidates:
        given = layout.relevance[i]
        if given is not None:
            scored[i] = (given, "given")
            continue
        vector = None if query_vector is None else _embedding(ctx.message(i), i, len(query_vector))
        if vector is not None and query_vector is not None:
            scored[i] = (_cosine(vector, query_vector), "embedding")
        else:
            lexical.append(i)
    if lexical:
        for i, score in zip(lexical, ctx.conversation.bm25(ctx.current_text, lexical), strict=True):
            scored[i] = (score, "bm25")
    return scored


def vector_recall(ctx: StrategyContext) -> Outcome:
    layout = ctx.layout
    candidates = [
        i
        for i, kind in enumerate(layout.kinds)
        if kind in RECALLED_KINDS and not layout.group_protected[i] and not layout.orphan[i]
    ]
    scored = scores(ctx, candidates)
    ranked = sorted(candidates, key=lambda i: (scored[i][0], i))
    plan = ctx.plan(ranked=[(i, Reason.LOW_RELEVANCE) for i in ranked])
    relevance = [Relevance(layout.ids[i], *scored[i]) for i in candidates]
    return Outcome(plan, ctx.counts, relevance=relevance)


INFO = StrategyInfo(
    "vector-recall",
    "drop the least relevant lorebook and memory entries first (given relevance, embedding "
    "cosine, or BM25 against the current input), then the oldest history",
    (
        OptionSpec(
            "query_embedding",
            "list[float]",
            [],
            "embedding of the current input; blocks with meta.embedding are scored by cosine with it",
        ),
    ),
    vector_recall,
    builtin=True,
    local=True,
)
