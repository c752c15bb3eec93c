"""The pure core (compaction and tokens, every submodule) loads no web framework and no HTTP
client: it is checked in a fresh interpreter, where nothing else has imported them first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("starlette", "fastapi", "httpx", "anyio", "uvicorn")

PROBE = """
import importlib, json, pkgutil, sys
forbidden = set(sys.argv[1].split(","))
found = {}
for name in sys.argv[2:]:
    package = importlib.import_module(name)
    path = getattr(package, "__path__", [])
    modules = [name] + [info.name for info in pkgutil.walk_packages(path, name + ".")]
    for module in modules:
        before = set(sys.modules)
        importlib.import_module(module)
        loaded = {m.split(".")[0] for m in set(sys.modules) - before} & forbidden
        if loaded:
            found[module] = sorted(loaded)
print(json.dumps({"by_module": found, "loaded": sorted(
    {m.split(".")[0] for m in sys.modules} & forbidden
)}))
"""


def _probe(*packages: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(FORBIDDEN), *packages],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_probe_sees_a_forbidden_import() -> None:
    # The check itself can fail: the HTTP layer does load Starlette.
    result = _probe("inflight.http")
    assert "starlette" in result["loaded"]


@pytest.mark.parametrize("package", ["inflight.compaction", "inflight.tokens"])
def test_the_core_loads_no_web_framework_and_no_http_client(package: str) -> None:
    assert _probe(package) == {"by_module": {}, "loaded": []}


def test_the_window_table_and_registry_load_no_http_client() -> None:
    # the service resolves windows through them; the model table hands `Route`s to upstream
    assert _probe("inflight.windows.table", "inflight.windows.registry")["loaded"] == []
