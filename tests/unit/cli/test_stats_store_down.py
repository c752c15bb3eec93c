"""`inflight stats --database-url` with the store unreachable: a one-line error, exit 1."""

from __future__ import annotations

import pytest

from inflight.cli.commands import main
from tests.support import free_port


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_stats_from_a_database_that_is_down_is_a_clear_error(
    scheme: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"{scheme}://inflight@127.0.0.1:{free_port()}/usage?connect_timeout=2"
    assert main(["stats", "--database-url", url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("inflight: the usage store is unavailable: ")
    assert "Traceback" not in err
