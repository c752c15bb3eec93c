"""Settings: every `INFLIGHT_*` variable, validated once at startup and frozen."""

from __future__ import annotations

from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from inflight.errors import InvalidControl
from inflight.strategies import parse_strategy


def packaged_config_dir() -> Path:
    """The default config files shipped with the package: `inflight/config_defaults` in an installed
    wheel (pyproject.toml maps the repository's `config/` there); in a source checkout, where
    that directory does not exist, the checkout's `config/` itself."""
    shipped = Path(str(resources.files("inflight"))) / "config_defaults"
    return shipped if shipped.is_dir() else Path(__file__).resolve().parents[1] / "config"


def config_file(config_dir: Path | None, name: str) -> Path:
    """`name` from `config_dir` when that directory has it, else the packaged default: a custom
    directory need only hold the files it changes."""
    if config_dir is not None and (config_dir / name).is_file():
        return config_dir / name
    return packaged_config_dir() / name


def redact_url(url: str) -> str:
    """A URL fit for logs: the password and the query string (which may carry one) removed."""
    parts = urlsplit(url)
    if parts.password is None and not parts.query:
        return url
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{host}"
    else:
        netloc = f"{parts.username}@{host}" if parts.username else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class OnOverflow(StrEnum):
    FORWARD = "forward"
    REJECT = "reject"


class LedgerMode(StrEnum):
    """What the ledger of cuts keeps (DESIGN.md §11): metadata only, the originals too, or
    nothing."""

    META = "meta"
    FULL = "full"
    OFF = "off"


class ContextEditsMode(StrEnum):
    """Who applies Anthropic context editing (DESIGN.md §13): `auto` — the upstream when it is
    Anthropic's API (host api.anthropic.com), else inflight; `proxy` — always inflight;
    `upstream` — always forwarded untouched."""

    AUTO = "auto"
    PROXY = "proxy"
    UPSTREAM = "upstream"


class Settings(BaseSettings):
    """Deployment configuration (DESIGN.md §2). A bad value is a startup error, not a 500."""

    model_config = SettingsConfigDict(
        env_prefix="INFLIGHT_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        frozen=True,
    )

    upstream_url: str = "https://api.openai.com/v1"
    upstream_api_key: SecretStr | None = None
    anthropic_upstream_url: str = "https://api.anthropic.com/v1"  # `POST /v1/messages`
    anthropic_api_key: SecretStr | None = None  # replaces the client's `x-api-key` when set
    context_edits: ContextEditsMode = ContextEditsMode.AUTO  # `context_management.edits` (§13)
    api_keys: Annotated[tuple[SecretStr, ...], NoDecode] = ()
    config_dir: Path | None = None  # unset: the packaged defaults (`packaged_config_dir`)
    strategy: str = "auto"
    threshold: float = Field(0.80, gt=0, le=1)
    target: float = Field(0.50, gt=0, le=1)
    context_limit: int | None = Field(None, gt=0)
    database_url: str = "sqlite:///./inflight.db"
    cache_url: str | None = None
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0)
    upstream_connect_timeout: float = Field(10.0, gt=0)
    upstream_read_timeout: float = Field(600.0, gt=0)
    # Slow clients: a request's headers must arrive within `header_read_timeout` s of its first
    # byte (or of the connection, `inflight serve` only) and its body within `body_read_timeout`
    # s (else 408); a stream the client reads nothing of for `client_stall_timeout` s is cut off.
    header_read_timeout: float = Field(10.0, gt=0)
    body_read_timeout: float = Field(60.0, gt=0)
    client_stall_timeout: float = Field(60.0, gt=0)
    on_overflow: OnOverflow = OnOverflow.FORWARD
    summary_model: str | None = None
    discovery_timeout: float = Field(2.0, gt=0)
    discovery_ttl: float = Field(600.0, ge=0)
    allow_unauthenticated: bool = False
    summary_timeout: float = Field(120.0, gt=0)
    # Summaries in the background (DESIGN.md §12).
    summary_ahead: float = Field(0.55, gt=0, le=1)  # start summarising at this share of budget
    summary_ahead_cuts: int = Field(2, ge=1, le=8)  # spans the next event may cut, summarised
    summary_wait: bool = False  # true: a compaction event waits for its summary (the old way)
    summary_concurrency: int = Field(1, ge=1)  # background summaries in flight, per process
    summary_upstream_url: str | None = None  # summaries go here instead of the request's upstream
    # On an upstream that serves one request at a time, a background summary prefers a moment
    # with no client request in flight, waiting for one at most this many seconds.
    summary_when_idle: bool = True
    summary_idle_wait: float = Field(2.0, ge=0)
    # How many requests the upstream serves at once (unset: llama.cpp's `/props` says; a server
    # that does not say is not gated). Only a one-slot upstream makes summaries wait.
    upstream_slots: int | None = Field(None, ge=1)
    # a prefix's summary covering this share of an event's span stands in for it (1: never)
    summary_partial: float = Field(0.5, ge=0, le=1)
    # Facts survive (DESIGN.md §14): a summary ends with the identifiers of its span its text lost
    summary_facts_guard: bool = True
    # Nothing lost (DESIGN.md §11).
    ledger: LedgerMode = LedgerMode.META
    # Usage records (and ledger rows) waiting in memory for the store, at most; a batch the store
    # keeps refusing this many seconds goes, with what waits behind it, to the spill file (JSON
    # lines; unset: next to the SQLite file, or `./inflight-usage-spill.jsonl`), written to the
    # store when it is back and at startup.
    usage_queue_max: int = Field(20_000, ge=1)
    usage_spill_after: float = Field(10.0, gt=0)
    usage_spill_path: Path | None = None
    ledger_ttl: float = Field(24 * 3600.0, gt=0)  # seconds a ledger row is kept
    restore: bool = False  # offer the model `inflight_restore` (X-Compaction-Restore)
    protect_tools: Annotated[tuple[str, ...], NoDecode] = ()  # outputs never pruned/truncated
    # Readiness (`/readyz`): one background probe of the upstream, store and cache this often,
    # each check given this long; `/readyz` answers from its last result.
    ready_interval: float = Field(10.0, gt=0)
    ready_timeout: float = Field(2.0, gt=0)
    # Compaction that pays (DESIGN.md §16): compact under the threshold when the prompt cache's
    # bill says so (X-Compaction-For-Cost), never a prompt of `cost_min_prompt` tokens or fewer;
    # an unpriced (local) model is judged on prefill time at `prefill_rate` tokens a second.
    compact_for_cost: bool = False
    cost_min_prompt: int = Field(32768, ge=0)
    prefill_rate: float | None = Field(None, gt=0)
    # `/metrics` and `/stats` name models configured or priced, and this many others (the first
    # seen in `/metrics`, the busiest in `/stats`); the rest are `other`.
    metrics_top_models: int = Field(20, ge=0)

    @field_validator("api_keys", "protect_tools", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(k.strip() for k in value.split(",") if k.strip())
        return value

    @field_validator("config_dir")
    @classmethod
    def _check_config_dir(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_dir():
            raise ValueError(f"config directory not found: {value.absolute()}")
        return value

    def config_file(self, name: str) -> Path:
        """The config file `name` this deployment uses (see `config_file`)."""
        return config_file(self.config_dir, name)

    @field_validator("strategy")
    @classmethod
    def _check_strategy(cls, value: str) -> str:
        try:
            parse_strategy(value, "INFLIGHT_STRATEGY")
        except InvalidControl as exc:
            raise ValueError(exc.message) from exc
        return value

    @field_validator("upstream_url", "anthropic_upstream_url", "summary_upstream_url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value.rstrip("/")

    @field_validator(
        "upstream_api_key",
        "anthropic_api_key",
        "cache_url",
        "summary_upstream_url",
        "prefill_rate",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @model_validator(mode="after")
    def _check_target(self) -> Settings:
        if self.target > self.threshold:
            raise ValueError("INFLIGHT_TARGET must be <= INFLIGHT_THRESHOLD")
        return self
