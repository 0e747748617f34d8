"""Pure-Python reference implementation of docs/semantics.md, used by the property tests.

It shares no code with the ``contextshift`` package: it is written from the document alone,
favouring readability over speed, so that disagreements point at a bug in one of the two.
"""

from .shift import (
    Analysis,
    RefBudgetExceeded,
    RefInvalid,
    RefResult,
    analyze,
    reference_count_tokens,
    reference_shift,
    text_tokens,
)

__all__ = [
    "Analysis",
    "RefBudgetExceeded",
    "RefInvalid",
    "RefResult",
    "analyze",
    "reference_count_tokens",
    "reference_shift",
    "text_tokens",
]
