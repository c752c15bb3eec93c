"""ASGI entry point for `uvicorn app.main:app` (settings from the environment)."""

from app.factory import create_app
from app.settings import Settings

app = create_app(Settings())
