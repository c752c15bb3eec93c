"""inflight served as `inflight serve` does, with the replay cache (app/compaction/replays.py)
off: the "before" of the hot path's before/after, measured in the same run as the "after".

Run: `python -m bench.variant PORT UPSTREAM_URL` (settings from the `INFLIGHT_*` environment).
"""

from __future__ import annotations

import sys

import uvicorn

from inflight.factory import create_app
from inflight.settings import Settings


def without_replays(app: object) -> None:
    """Plan every request from its first message, as before the replay cache."""
    app.state.inflight.compactor.forget_replays()  # type: ignore[attr-defined]


def main(port: int, upstream: str) -> None:
    app = create_app(Settings(upstream_url=upstream))  # type: ignore[call-arg]
    without_replays(app)
    uvicorn.run(app, host="127.0.0.1", port=port, timeout_keep_alive=75, log_level="warning")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
