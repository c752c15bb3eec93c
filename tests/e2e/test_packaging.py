"""The package carries its default config, so `inflight serve` works outside the checkout: the
package list, a real build, a server started from an empty directory on the built tree, the
config resolution (packaged defaults, a custom directory, per-file fallback), the startup
banner (every fact, no secret)."""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from inflight.banner import startup_facts
from inflight.settings import Settings, config_file, packaged_config_dir, redact_url
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]
CONFIG_FILES = ("models.toml", "summary_prompt.md", "prices.toml")


def source_packages() -> set[str]:
    """Every package under `app/`, by its import name (`app/` is `inflight`)."""
    return {
        ".".join(("inflight", *init.parent.relative_to(ROOT / "app").parts))
        for init in (ROOT / "app").rglob("__init__.py")
    }


def test_every_package_is_listed_and_config_is_one_of_them() -> None:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(tool["packages"]) == source_packages() | {"inflight.config_defaults"}
    assert tool["package-dir"] == {"inflight": "app", "inflight.config_defaults": "config"}
    assert set(tool["package-data"]["inflight.config_defaults"]) >= {"*.toml", "*.md"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tree `pip install` would put in site-packages (setuptools' build_py, offline)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "app", src / "app", ignore=ignore)
    shutil.copytree(ROOT / "config", src / "config", ignore=ignore)
    out = tmp_path_factory.mktemp("site")
    script = "import setuptools, sys; sys.argv = ['setup.py', '-q', 'build_py', '-d', sys.argv[1]]"
    subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script + "; setuptools.setup()", str(out)],
        cwd=src,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


def test_the_build_ships_the_default_config_inside_the_package(built: Path) -> None:
    for name in CONFIG_FILES:
        shipped = built / "inflight" / "config_defaults" / name
        assert shipped.read_bytes() == (ROOT / "config" / name).read_bytes(), name
    for package in source_packages():
        assert (built / package.replace(".", "/") / "__init__.py").is_file(), package
    assert not (built / "app").exists()  # no top-level `app` package is installed


def test_the_library_imports_from_the_installed_tree_and_app_does_not(
    built: Path, tmp_path: Path
) -> None:
    """`import inflight` outside the checkout: the engine as a library; `import app` fails."""
    code = (
        "import importlib.util, inflight\n"
        "assert importlib.util.find_spec('app') is None, 'a top-level app package'\n"
        "messages = [{'role': 'user', 'content': 'word ' * 400}] * 2 + [\n"
        "    {'role': 'assistant', 'content': 'ok'}, {'role': 'user', 'content': 'next'}]\n"
        "done = inflight.compact(messages, model='gpt-4o', context_limit=1200)\n"
        "print(inflight.count_tokens(messages, model='gpt-4o'), done.applied)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=clean_env(PYTHONPATH=str(built)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "'trim'" in done.stdout


class Server:
    """`inflight serve` in a subprocess; its log lines read by a thread into a queue."""

    def __init__(self, args: list[str], *, cwd: Path, env: dict[str, str]) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from inflight.cli.commands import main; sys.exit(main())",
                *args,
            ],
            cwd=cwd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stderr is not None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.put(line)

    def wait_for(self, text: str, timeout: float = 30.0) -> None:
        while not any(text in line for line in self.seen):
            try:
                self.seen.append(self.lines.get(timeout=timeout).rstrip("\n"))
            except queue.Empty:
                raise AssertionError(f"no {text!r} in the log: {self.seen}") from None

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self._reader.join(timeout=10)  # the pipe is at its end once the process has gone
        while not self.lines.empty():
            self.seen.append(self.lines.get().rstrip("\n"))
        assert self.process.stderr is not None
        self.process.stderr.close()


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """An empty working directory outside the checkout (no `config/` next to it)."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    return cwd


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFLIGHT_")}
    return {**env, **extra}


def test_serve_outside_the_checkout_uses_the_packaged_config_and_says_so(
    built: Path, outside: Path
) -> None:
    port = free_port()
    env = clean_env(
        PYTHONPATH=str(built),  # the installed layout, not the checkout
        INFLIGHT_UPSTREAM_URL="http://user:upstream-secret@127.0.0.1:9/v1",
        INFLIGHT_UPSTREAM_API_KEY="sk-upstream-secret",
        INFLIGHT_DATABASE_URL=f"sqlite:///{outside / 'usage.db'}",
    )
    server = Server(["serve", "--port", str(port)], cwd=outside, env=env)
    try:
        server.wait_for("Application startup complete")
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).json() == {"status": "ok"}
    finally:
        server.stop()
    log = "\n".join(server.seen)
    packaged = built / "inflight" / "config_defaults"
    for fact in (
        "upstream: http://user:***@127.0.0.1:9/v1 (Authorization: INFLIGHT_UPSTREAM_API_KEY",
        f"config: the packaged defaults in {packaged}",
        f"config file models.toml: {packaged / 'models.toml'}",
        f"config file summary_prompt.md: {packaged / 'summary_prompt.md'}",
        f"database: sqlite:///{outside / 'usage.db'}",
        "summary cache: in-process",
        "token counting: ",
        "default strategy: auto (compact at 0.8 of the budget, down to 0.5; over budget: forward)",
        "client keys: none",
        f"listening on http://127.0.0.1:{port}",
    ):
        assert fact in log, fact
    assert "upstream-secret" not in log
    assert "Traceback" not in log


def test_a_missing_config_directory_is_one_line_naming_it(outside: Path) -> None:
    missing = outside / "no-such-config"
    result = subprocess.run(
        [sys.executable, "-m", "inflight.cli.commands", "serve", "--config", str(missing)],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert result.stderr == (
        f"inflight: INFLIGHT_CONFIG_DIR: config directory not found: {missing}\n"
    )


def test_config_resolution(tmp_path: Path) -> None:
    assert Settings(_env_file=None).config_dir is None  # type: ignore[call-arg]
    assert config_file(None, "models.toml") == packaged_config_dir() / "models.toml"
    assert (packaged_config_dir() / "summary_prompt.md").is_file()
    custom = tmp_path / "custom"
    custom.mkdir()
    (custom / "models.toml").write_text("")
    settings = Settings(_env_file=None, config_dir=custom)  # type: ignore[call-arg]
    assert settings.config_file("models.toml") == custom / "models.toml"
    # A file the custom directory lacks comes from the packaged defaults.
    assert settings.config_file("summary_prompt.md") == packaged_config_dir() / "summary_prompt.md"
    with pytest.raises(ValidationError, match="config directory not found"):
        Settings(_env_file=None, config_dir=tmp_path / "nope")  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:pw@db:5432/inflight", "postgresql://app:***@db:5432/inflight"),
        ("redis://:pw@cache:6379/0", "redis://:***@cache:6379/0"),
        ("postgresql://app@[::1]/x?password=pw", "postgresql://app@[::1]/x"),
        ("sqlite:///./inflight.db", "sqlite:///./inflight.db"),
        ("https://api.openai.com/v1", "https://api.openai.com/v1"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_banner_facts_never_hold_a_secret() -> None:
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        upstream_api_key="sk-up-secret",
        api_keys="k-one-secret,k-two-secret",
        database_url="postgresql://app:db-secret@db/x",
        cache_url="redis://:cache-secret@cache:6379/0",
        context_limit=8192,
    )
    facts = startup_facts(settings, ("o200k_base",))
    text = "\n".join(facts)
    assert "secret" not in text
    assert "client keys: 2 configured" in text
    assert "database: postgresql://app:***@db/x" in text
    assert "summary cache: redis://:***@cache:6379/0" in text
    assert "heuristic where o200k_base is needed" in text
    assert "context window: 8192 tokens for every model" in text
    assert len(facts) == len(set(facts))  # one fact per line
