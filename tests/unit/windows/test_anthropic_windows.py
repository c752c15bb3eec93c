"""Claude windows in the model table: 200k, and 1M for a request that sends the
`anthropic-beta: context-1m-2025-08-07` flag (DESIGN.md §8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inflight.windows.registry import WindowRegistry
from inflight.windows.table import ModelTable, anthropic_betas

TABLE = ModelTable.load(Path(__file__).resolve().parents[3] / "config" / "models.toml")
ONE_M = "context-1m-2025-08-07"


@pytest.mark.parametrize(
    ("model", "betas", "window"),
    [
        ("claude-sonnet-4-5", (), 200_000),
        ("claude-sonnet-4-5-20250929", (ONE_M,), 1_000_000),
        ("anthropic.claude-opus-4-6", ("interleaved-thinking-2025-05-14", ONE_M), 1_000_000),
        ("claude-haiku-4-5", (ONE_M,), 200_000),  # no 1M window for Haiku
        ("claude-sonnet-4-5", ("context-1m-2099-01-01",), 200_000),  # an unknown flag
    ],
)
def test_claude_windows(model: str, betas: tuple[str, ...], window: int) -> None:
    entry = TABLE.lookup(model)
    assert entry is not None
    assert entry.window(betas) == window


def test_the_beta_header_is_read_as_comma_separated_flags() -> None:
    headers = {"Anthropic-Beta": f"fine-grained-tool-streaming-2025-05-14, {ONE_M}"}
    assert anthropic_betas(headers) == {"fine-grained-tool-streaming-2025-05-14", ONE_M}
    assert anthropic_betas({}) == frozenset()


@pytest.mark.anyio
async def test_the_registry_gives_the_unlocked_window_and_overrides_still_win() -> None:
    registry = WindowRegistry(TABLE, None)
    url = "https://api.anthropic.com/v1"
    one_m = frozenset({ONE_M})
    assert (await registry.window_for("claude-sonnet-4-5", url, betas=one_m)).tokens == 1_000_000
    assert (await registry.window_for("claude-sonnet-4-5", url)).tokens == 200_000
    forced = await registry.window_for("claude-sonnet-4-5", url, header_limit=50_000, betas=one_m)
    assert forced.tokens == 50_000


def test_a_bad_beta_window_is_a_startup_error(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_text(
        '[[model]]\npattern = "x"\ncontext_window = 10\nmax_output = 1\n'
        'beta_context_windows = { "f" = 0 }\n'
    )
    with pytest.raises(ValueError, match="beta_context_windows"):
        ModelTable.load(path)
