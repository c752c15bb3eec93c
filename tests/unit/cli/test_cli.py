"""The command line: simulate (with --plot), count, stats, and serve's open-proxy guard."""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from inflight.cli.commands import build_parser, main
from inflight.usage.records import UsageRecord

CONFIG = str(Path(__file__).resolve().parents[3] / "config")


def small_trace(tmp_path: Path) -> Path:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "agent"},
        {"role": "user", "content": "go"},
    ]
    for i in range(30):
        call = {"id": "c", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": "c", "content": f"{i} " + "output " * 300})
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"model": "gpt-4o", "messages": messages}))
    return path


def test_simulate_prints_each_turn_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = small_trace(tmp_path)
    png = tmp_path / "out.png"
    code = main(
        ["simulate", str(trace), "--context-limit", "4096", "--config", CONFIG, "--plot", str(png)]
    )
    out = capsys.readouterr().out
    assert code == 0
    turn_lines = [line for line in out.splitlines() if re.match(r"\s+\d+\s+\d+\s+\d+", line)]
    assert len(turn_lines) == 31  # the first user message, then after each of 30 tool rounds
    assert "31 requests" in out
    assert "compaction events" in out
    assert any("trim" in line for line in turn_lines)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 5000


def test_simulate_compares_with_re_trimming_every_request(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--compare` on a shipped agent transcript: inflight never breaks a request and moves its
    cut at few events; LangChain's `trim_messages` (newest messages, from a user turn) loses the
    current turn of most requests (the agent's only user message is the first); keeping the
    newest units keeps pairs but moves the cut far more often."""
    trace = (
        Path(__file__).resolve().parents[2]
        / "data"
        / "traces"
        / "mini_deepseek-chat_django__django-13265.json"
    )
    assert main(["simulate", str(trace), "--context-limit", "8192", "--compare"]) == 0
    rows = {
        m.group(1): (int(m.group(3)), int(m.group(4)), int(m.group(5)))
        for m in re.finditer(
            r"^(inflight auto|trim_messages|keep-newest)\s+(\d+)%\s+(\d+)\s+(\d+) of (\d+)$",
            capsys.readouterr().out,
            re.MULTILINE,
        )
    }
    events, bad, requests = rows["inflight auto"]
    assert bad == 0
    assert rows["trim_messages"][1] > requests // 2
    assert rows["keep-newest"][1] == 0
    assert rows["keep-newest"][0] > 2 * events


def test_simulate_rejects_an_unknown_strategy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", str(small_trace(tmp_path)), "--strategy", "shred"]) == 2
    assert "unknown strategy" in capsys.readouterr().err


def test_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = tmp_path / "body.json"
    body.write_text(
        json.dumps(
            {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello world"}]}
        )
    )
    assert main(["count", str(body), "--config", CONFIG]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"] == "gpt-4o-mini"
    assert result["exact"] is True
    assert 8 <= result["prompt_tokens"] <= 12
    assert result["context_limit"] == 128000


def test_stats_from_the_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import anyio

    from inflight.usage.stores import open_store

    url = f"sqlite:///{tmp_path / 'u.db'}"

    async def write() -> None:
        store = open_store(url)
        await store.open()
        await store.write_many(
            [
                UsageRecord(
                    time.time(),
                    "r",
                    "chat",
                    "gpt-4o",
                    None,
                    False,
                    200,
                    "completed",
                    5.0,
                    1.0,
                    100,
                    10,
                    0,
                    300,
                    100,
                    ("trim",),
                    8192,
                )
            ]
        )
        await store.close()

    anyio.run(write)
    assert main(["stats", "--database-url", url]) == 0
    out = capsys.readouterr().out
    assert "requests                  1" in out
    assert "gpt-4o" in out
    assert "trim" in out


def test_stats_unreachable_proxy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", "--url", "http://127.0.0.1:9"]) == 1
    assert "cannot reach" in capsys.readouterr().err


def test_serve_refuses_an_open_proxy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "INFLIGHT_API_KEYS" in capsys.readouterr().err


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.mark.parametrize("command", ["serve", "stats", "count", "simulate"])
def test_help_explains_every_flag_with_its_default(command: str) -> None:
    parser = _subcommands()[command]
    formatter = parser._get_formatter()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        text = formatter._get_help_string(action) or ""
        assert text.strip(), f"{command} {action.dest}: no help"
        if action.option_strings:
            assert "default" in text, f"{command} {action.option_strings[0]}: no default"
    rendered = parser.format_help()
    assert "(default: None)" not in rendered
    if command == "serve":
        for shown in ("(default: 127.0.0.1)", "(default: 8787)", "(default: info)"):
            assert shown in rendered


def test_serve_help_exits_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    assert "--log-level" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["count", "simulate"])
def test_a_missing_config_directory_is_one_line(tmp_path: Path, command: str) -> None:
    body = tmp_path / "body.json"
    body.write_text(json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
    with pytest.raises(SystemExit) as exit_info:
        main([command, str(body), "--config", str(tmp_path / "nope")])
    assert str(exit_info.value) == f"inflight: config directory not found: {tmp_path / 'nope'}"


def test_invalid_settings_are_one_line_each(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFLIGHT_THRESHOLD", "2")
    monkeypatch.setenv("INFLIGHT_UPSTREAM_URL", "ftp://x")
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--port", "0"])
    lines = str(exit_info.value).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("inflight: INFLIGHT_UPSTREAM_URL: ")
    assert lines[1].startswith("inflight: INFLIGHT_THRESHOLD: ")


def test_count_without_config_uses_the_packaged_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = tmp_path / "body.json"
    body.write_text(
        json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
    )
    assert main(["count", str(body)]) == 0
    assert json.loads(capsys.readouterr().out)["limit_source"] == "table"
