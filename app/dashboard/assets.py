"""The dashboard's files, read once from the package at startup (never per request)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

FILES = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}


@dataclass(frozen=True, slots=True)
class Asset:
    """One file of the page and its media type."""

    content: bytes
    media_type: str


@dataclass(frozen=True, slots=True)
class DashboardAssets:
    """Every file of the page by name."""

    files: Mapping[str, Asset]

    @classmethod
    def load(cls) -> DashboardAssets:
        root = resources.files("inflight.dashboard")
        return cls(
            {name: Asset(root.joinpath(name).read_bytes(), kind) for name, kind in FILES.items()}
        )

    def get(self, name: str) -> Asset | None:
        return self.files.get(name)
