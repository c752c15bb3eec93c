"""Helpers the tests and the benchmarks share: free loopback ports, the real agent transcripts
that ship in `tests/data/traces`, and the request points of a conversation."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from inflight.cli.simulate import request_points

DATA = Path(__file__).resolve().parents[1] / "data"
TRACES = DATA / "traces"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def free_port() -> int:
    """A loopback TCP port nothing listens on right now (the socket is closed again)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def trace_paths() -> list[Path]:
    """The transcript files, sorted; an empty or missing folder is an error, not a skip."""
    paths = sorted(TRACES.glob("*.json"))
    if not paths:
        raise FileNotFoundError(f"no transcripts in {TRACES}: the repository is incomplete")
    return paths


def load_traces() -> list[tuple[str, list[dict[str, Any]]]]:
    """(file stem, messages) for every transcript in `tests/data/traces`."""
    return [(p.stem, json.loads(p.read_text("utf-8"))["messages"]) for p in trace_paths()]


__all__ = [
    "DATA",
    "EXAMPLES",
    "TRACES",
    "free_port",
    "load_traces",
    "request_points",
    "trace_paths",
]
