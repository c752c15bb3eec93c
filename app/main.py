"""ASGI entry point for `uvicorn inflight.main:app` (settings from the environment)."""

from inflight.factory import create_app
from inflight.settings import Settings

app = create_app(Settings())
