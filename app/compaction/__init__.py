"""The compaction engine: pure policy, planning and strategies (no FastAPI, no httpx)."""
