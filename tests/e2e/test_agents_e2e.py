"""The coding agents as clients (DESIGN.md §13): Claude Code, Codex and OpenCode, installed from
npm at pinned versions by `.ci/run` into `.agents/` (or `INFLIGHT_AGENTS_DIR`), each run headless
through a real proxy against the scripted strict model (tests/support/scripted_model.py) with a window
their shell outputs overflow. Each run must finish, be compacted at least three times, never
break the model's rules, keep every prompt a byte-identical extension of the one before it
between events, and leave a usage record per request. Skipped when the agents are absent."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from inflight.factory import create_app
from tests.conftest import make_settings
from tests.support.scripted_model import FINAL_TEXT, ScriptedModel, Seen
from tests.support.servers import WatchedStore, serve

ROOT = Path(__file__).resolve().parents[2]
AGENTS = Path(os.environ.get("INFLIGHT_AGENTS_DIR") or ROOT / ".agents")
RUN_TIMEOUT = 120  # seconds for one agent run
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(RUN_TIMEOUT + 60)]
EVENTS = 3  # compaction events each run must have at least
COMPACTING = ("/v1/messages", "/v1/responses", "/v1/chat/completions")
QUIET = {  # no telemetry, updates or other traffic (all of it is blocked here anyway)
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "NO_COLOR": "1",
}
ASGIApp = Callable[..., Awaitable[None]]


def binary(name: str) -> Path:
    path = AGENTS / "node_modules" / ".bin" / name
    if not path.exists():
        pytest.skip(f"{name} is not installed in {AGENTS} (.ci/run installs it with npm)")
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    return path


@dataclass(slots=True)
class Answered:
    """What the proxy answered one compacting request: its status and `X-Compaction-*`
    headers (the scripted model behind it never sees them)."""

    path: str
    status: int
    headers: dict[str, str]


@dataclass(slots=True)
class Recorder:
    """An ASGI wrapper around the proxy that records what it answered each request."""

    app: ASGIApp
    answered: list[Answered] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] not in COMPACTING:
            await self.app(scope, receive, send)
            return

        async def watch(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = {
                    k.decode().lower(): v.decode()
                    for k, v in message.get("headers", [])
                    if k.lower().startswith(b"x-compaction-")
                }
                with self.lock:
                    self.answered.append(Answered(scope["path"], message["status"], headers))
            await send(message)

        await self.app(scope, receive, watch)


@dataclass(slots=True)
class Rig:
    """The scripted model, the proxy in front of it and what both saw."""

    model: ScriptedModel
    recorder: Recorder
    store: WatchedStore
    url: str
    home: Path
    workspace: Path


@pytest.fixture
def rig_for(tmp_path: Path) -> Iterator[Callable[[int, int], Rig]]:
    """Starts a rig with the model's window and rounds; all servers stop at the end."""
    stack: list[Any] = []

    def start(window: int, rounds: int) -> Rig:
        model = ScriptedModel(window=window, rounds=rounds)
        upstream = serve(model.app)
        model_url = upstream.__enter__()
        stack.append(upstream)
        settings = make_settings(
            tmp_path,
            upstream_url=model_url + "/v1",
            anthropic_upstream_url=model_url + "/v1",
            context_limit=window,
            strategy="truncate,prune,trim",
        )
        store = WatchedStore()
        recorder = Recorder(create_app(settings, store=store))
        proxy = serve(recorder)
        url = proxy.__enter__()
        stack.append(proxy)
        home, workspace = tmp_path / "home", tmp_path / "work"
        home.mkdir()
        workspace.mkdir()
        return Rig(model, recorder, store, url, home, workspace)

    yield start
    for server in reversed(stack):
        server.__exit__(None, None, None)


def run_agent(rig: Rig, argv: list[str], env: Mapping[str, str]) -> str:
    """Runs the agent to its end (bounded); its stdout."""
    full = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(rig.home),
        "LANG": "C.UTF-8",
        "XDG_CACHE_HOME": str(AGENTS / "cache"),  # what an agent caches lasts between runs
        **QUIET,
        **env,
    }
    done = subprocess.run(
        argv, cwd=rig.workspace, env=full, capture_output=True, text=True, timeout=RUN_TIMEOUT,
        stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


def history(seen: Seen) -> list[bytes]:
    """The conversation a request carries, item by item, without Claude Code's breakpoint
    (it moves to the newest message every request; what a cache reuses is the content)."""
    items = seen.body.get("input") if seen.api == "responses" else seen.body.get("messages")
    out = []
    for item in items if isinstance(items, list) else []:
        content = item.get("content")
        if isinstance(content, list):
            blocks = [{k: v for k, v in b.items() if k != "cache_control"} for b in content]
            item = {**item, "content": blocks}
        out.append(json.dumps(item, sort_keys=True).encode())
    return out


@dataclass(frozen=True, slots=True)
class Outcome:
    requests: int
    events: int


def check_run(rig: Rig, stdout: str) -> Outcome:
    """The agent finished, the model found nothing wrong, the conversation was compacted at
    least EVENTS times and each prompt extended the one before it except at those events,
    every compacting request was answered and recorded."""
    assert FINAL_TEXT in stdout
    seen = list(rig.model.seen)
    assert [s.violations for s in seen if s.violations] == []
    assert [s.tokens for s in seen if s.overflow] == []
    answered = list(rig.recorder.answered)
    assert len(answered) == len(seen)  # every request the proxy took reached the model
    assert all(a.status == 200 for a in answered)
    assert all("x-compaction-skipped" not in a.headers for a in answered)
    main = [(s, a) for s, a in zip(seen, answered, strict=True) if s.shell is not None]
    assert len(main) > rig.model.rounds
    events = 0
    previous: list[bytes] | None = None
    for s, a in main:
        now = history(s)
        if previous is not None and now[: len(previous)] != previous:
            events += 1  # a compaction event: the proxy must say it compacted this one
            assert a.headers["x-compaction-applied"] != "none"
            assert int(a.headers["x-compaction-tokens-after"]) < int(
                a.headers["x-compaction-tokens-before"]
            )
        previous = now
    assert events >= EVENTS
    assert all(int(a.headers["x-compaction-context-limit"]) == rig.model.window for _, a in main)
    records = rig.store.wait_for(len(answered))
    assert sorted(r.route or "" for r in records if r.kind == "chat") == sorted(
        a.path for a in answered
    )
    return Outcome(requests=len(answered), events=events)


def claude_code(rig: Rig, model: str) -> Outcome:
    stdout = run_agent(
        rig,
        [
            str(binary("claude")),
            "-p",
            "Print the numbers with the shell, several times.",
            "--output-format",
            "json",
            "--allowedTools",
            "Bash",
            "--model",
            model,
        ],
        {
            "ANTHROPIC_BASE_URL": rig.url,
            "ANTHROPIC_API_KEY": "sk-ant-dummy",
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096",
        },
    )
    result = json.loads(stdout)
    assert result["is_error"] is False
    return check_run(rig, result["result"])


def test_claude_code_with_a_claude_model(rig_for: Callable[[int, int], Rig]) -> None:
    binary("claude")
    rig = rig_for(80_000, 20)
    outcome = claude_code(rig, "claude-sonnet-4-5")
    assert all(s.api == "messages" for s in rig.model.seen)
    print(f"claude-sonnet-4-5: {outcome}")


def test_claude_code_with_a_local_model(rig_for: Callable[[int, int], Rig]) -> None:
    """With a non-Claude model name Claude Code puts `role: "system"` messages inside
    `messages`: the requests are compacted around them, not forwarded as received."""
    binary("claude")
    rig = rig_for(80_000, 20)
    outcome = claude_code(rig, "qwen2.5-coder-32b-instruct")
    main = [s for s in rig.model.seen if s.shell is not None]
    assert all(any(m.get("role") == "system" for m in s.body["messages"]) for s in main)
    print(f"qwen2.5-coder-32b-instruct: {outcome}")


def test_codex(rig_for: Callable[[int, int], Rig]) -> None:
    codex = binary("codex")
    rig = rig_for(40_000, 18)
    home = rig.home / ".codex"
    home.mkdir()
    (home / "config.toml").write_text(
        'model = "gpt-5-codex"\n'
        'model_provider = "inflight"\n'
        "\n"
        "[model_providers.inflight]\n"
        'name = "inflight"\n'
        f'base_url = "{rig.url}/v1"\n'
        'env_key = "INFLIGHT_KEY"\n'
        'wire_api = "responses"\n'
    )
    stdout = run_agent(
        rig,
        [
            str(codex),
            "exec",
            "--skip-git-repo-check",
            "--sandbox",
            "danger-full-access",
            "Print the numbers with the shell, several times.",
        ],
        {"CODEX_HOME": str(home), "INFLIGHT_KEY": "dummy"},
    )
    outcome = check_run(rig, stdout)
    assert all(s.api == "responses" for s in rig.model.seen)
    print(f"codex: {outcome}")


def test_opencode(rig_for: Callable[[int, int], Rig]) -> None:
    opencode = binary("opencode")
    rig = rig_for(32_000, 16)
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "inflight": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "inflight",
                "options": {"baseURL": f"{rig.url}/v1", "apiKey": "dummy"},
                "models": {
                    "qwen2.5-coder-32b-instruct": {
                        "name": "Qwen2.5 Coder 32B",
                        "limit": {"context": 1_000_000, "output": 4096},
                    }
                },
            }
        },
        "model": "inflight/qwen2.5-coder-32b-instruct",
        "autoupdate": False,
        "share": "disabled",
        "permission": {"bash": "allow", "edit": "allow"},
    }
    (rig.workspace / "opencode.json").write_text(json.dumps(config))
    stdout = run_agent(
        rig,
        [str(opencode), "run", "Print the numbers with the shell, several times."],
        {"OPENCODE_DISABLE_AUTOCOMPACT": "1", "OPENCODE_DISABLE_PRUNE": "1"},
    )
    outcome = check_run(rig, stdout)
    assert all(s.api == "chat" for s in rig.model.seen)
    print(f"opencode: {outcome}")
