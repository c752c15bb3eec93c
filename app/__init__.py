"""inflight: an OpenAI-compatible proxy that compacts chat context in flight, and its engine as
a library: `count_tokens` and `compact` (DESIGN.md §15; the proxy itself is `inflight serve`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Compacted", "Engine", "__version__", "acompact", "compact", "count_tokens"]

if TYPE_CHECKING:
    from inflight.library import Compacted, Engine, acompact, compact, count_tokens


def __getattr__(name: str) -> Any:
    """The library's names, imported on first use: the proxy never loads what it does not use."""
    if name in __all__:
        from inflight import library

        return getattr(library, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
