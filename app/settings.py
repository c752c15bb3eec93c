"""Settings: every `INFLIGHT_*` variable, validated once at startup and frozen."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class OnOverflow(StrEnum):
    FORWARD = "forward"
    REJECT = "reject"


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
    api_keys: Annotated[tuple[SecretStr, ...], NoDecode] = ()
    config_dir: Path = Path("config")
    strategy: str = "auto"
    threshold: float = Field(0.80, gt=0, le=1)
    target: float = Field(0.50, gt=0, le=1)
    context_limit: int | None = Field(None, gt=0)
    database_url: str = "sqlite:///./inflight.db"
    cache_url: str | None = None
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0)
    upstream_connect_timeout: float = Field(10.0, gt=0)
    upstream_read_timeout: float = Field(600.0, gt=0)
    on_overflow: OnOverflow = OnOverflow.FORWARD
    summary_model: str | None = None
    discovery_timeout: float = Field(2.0, gt=0)
    discovery_ttl: float = Field(600.0, ge=0)
    allow_unauthenticated: bool = False
    summary_timeout: float = Field(120.0, gt=0)

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(k.strip() for k in value.split(",") if k.strip())
        return value

    @field_validator("strategy")
    @classmethod
    def _check_strategy(cls, value: str) -> str:
        from app.compaction.policy import parse_strategy
        from app.errors import InvalidControl

        try:
            parse_strategy(value, "INFLIGHT_STRATEGY")
        except InvalidControl as exc:
            raise ValueError(exc.message) from exc
        return value

    @field_validator("upstream_url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value.rstrip("/")

    @field_validator("upstream_api_key", "cache_url", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @model_validator(mode="after")
    def _check_target(self) -> Settings:
        if self.target > self.threshold:
            raise ValueError("INFLIGHT_TARGET must be <= INFLIGHT_THRESHOLD")
        return self
