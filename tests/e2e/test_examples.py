"""The conversations in `examples/` and the README's first "try it" step: `inflight simulate`
run through the installed console script, with no upstream and no key, from the checkout and
from a directory outside it, prints turns that were compacted to fit the window."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from inflight.windows.table import output_reserve
from tests.support import EXAMPLES

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "inflight"
COMMAND = re.compile(r"^(?:\.venv/bin/)?inflight simulate (?:examples/\S+ )+--context-limit \d+$")
HEADER = re.compile(r"^(\S+): model (\S+), window (\d+), strategy (\S+)$")
ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)%\s+(\S+)( \*)?(  OVER BUDGET)?$")
TOTAL = re.compile(r"^(\d+) requests, (\d+) compaction events \(\*\), mean prefix reuse \d+%$")


@dataclass(frozen=True, slots=True)
class Row:
    before: int
    after: int
    applied: str
    event: bool
    over: bool


@dataclass(frozen=True, slots=True)
class Report:
    window: int
    rows: tuple[Row, ...]
    requests: int
    events: int


def parse(stdout: str) -> dict[str, Report]:
    """The printed table, per file: header, one row per request, a totals line."""
    reports: dict[str, Report] = {}
    rows: list[Row] = []
    name, window = "", 0
    for line in stdout.splitlines():
        if header := HEADER.match(line):
            name, window, rows = header[1], int(header[3]), []
        elif row := ROW.match(line):
            rows.append(Row(int(row[3]), int(row[4]), row[6], bool(row[7]), bool(row[8])))
        elif total := TOTAL.match(line):
            reports[name] = Report(window, tuple(rows), int(total[1]), int(total[2]))
    return reports


def run(argv: list[str], cwd: Path) -> str:
    """The console script, offline: no upstream URL, no key, nothing from the shell."""
    assert SCRIPT.is_file(), f"{SCRIPT} missing: `pip install -e .` installs the command"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFLIGHT_", "OPENAI_"))}
    done = subprocess.run(
        [str(SCRIPT), *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def assert_compacted(report: Report) -> None:
    """Some request was compacted at an event, and every forwarded prompt fits the budget."""
    budget = report.window - output_reserve({}, report.window)
    assert report.requests == len(report.rows) > 1
    assert report.events >= 1
    assert report.events == sum(r.event for r in report.rows)
    events = [r for r in report.rows if r.event]
    assert all(r.after < r.before and r.applied != "-" for r in events)
    assert all(r.after <= budget and not r.over for r in report.rows)


def readme_command() -> list[str]:
    """The README's first `inflight simulate examples/...` command line."""
    for line in (ROOT / "README.md").read_text("utf-8").splitlines():
        for part in line.split("&&"):
            if COMMAND.match(part.strip()):
                return shlex.split(part.strip())[1:]
    raise AssertionError("README.md has no `inflight simulate examples/…` step")


def test_readme_try_it_step_compacts_every_example_from_the_checkout() -> None:
    argv = readme_command()
    files = sorted(a for a in argv if a.startswith("examples/"))
    assert files == sorted(f"examples/{p.name}" for p in EXAMPLES.glob("*.json"))
    reports = parse(run(argv, ROOT))
    assert sorted(reports) == files
    for report in reports.values():
        assert_compacted(report)


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.json")))
def test_simulate_an_example_from_outside_the_checkout(tmp_path: Path, example: str) -> None:
    path = EXAMPLES / example
    reports = parse(run(["simulate", str(path), "--context-limit", "3000"], tmp_path))
    assert list(reports) == [str(path)]
    assert_compacted(reports[str(path)])
