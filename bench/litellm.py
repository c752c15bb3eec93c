"""LiteLLM's proxy in pass-through mode, in its own virtual environment, for comparison.

The venv lives in `bench/out/litellm-venv` (git-ignored) and is created on first use with
`pip install 'litellm[proxy]'`; LiteLLM is pointed at the same fake upstream as inflight.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.procs import process
from tests.support import free_port

OUT = Path(__file__).resolve().parent / "out"
VENV = OUT / "litellm-venv"
BENCH_KEY = "sk-bench-key"  # sent by the benchmark client to every target


def ensure_installed() -> Path | None:
    """The `litellm` executable, installing it once; None when it cannot be installed."""
    exe = VENV / "bin" / "litellm"
    if exe.exists():
        return exe
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, timeout=120)
        subprocess.run(
            [str(VENV / "bin" / "pip"), "install", "-q", "litellm[proxy]"],
            check=True,
            timeout=900,
            stdout=subprocess.DEVNULL,  # keep the report clean; errors still reach stderr
        )
    except (subprocess.SubprocessError, OSError) as exc:
        print(f"(LiteLLM not available: {exc})", file=sys.stderr)
        return None
    return exe if exe.exists() else None


@contextmanager
def litellm_proxy(upstream_url: str, exe: Path) -> Iterator[str]:
    port = free_port()
    config = OUT / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: bench\n"
        "    litellm_params:\n"
        "      model: openai/bench\n"
        f"      api_base: {upstream_url}\n"
        "      api_key: sk-bench\n"
        "litellm_settings:\n"
        "  drop_params: true\n"
        "  telemetry: false\n"
    )
    argv = [str(exe), "--config", str(config), "--port", str(port), "--num_workers", "1"]
    env = {
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "NO_DOCS": "True",
        "LITELLM_MASTER_KEY": BENCH_KEY,
    }
    with process(argv, f"http://127.0.0.1:{port}/health/liveliness", env=env, timeout=180):
        yield f"http://127.0.0.1:{port}/v1"
