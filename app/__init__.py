"""inflight: an OpenAI-compatible proxy that compacts chat context in flight."""

__version__ = "0.1.0"
