"""Schemathesis against the proxy's own OpenAPI schema: every generated request (valid and
invalid) gets an OpenAI-shaped 4xx or a correct relay, never a 5xx, and every response matches
what the schema documents (status code, content type, body)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import Case, CheckContext, Response
from schemathesis.checks import (
    content_type_conformance,
    missing_required_header,
    not_a_server_error,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

from inflight.factory import create_app
from tests.conftest import make_settings
from tests.support.fakes import FakeUpstream
from tests.support.servers import serve

pytestmark = pytest.mark.e2e

REQUEST_TIMEOUT = 10.0
CHAT = "/v1/chat/completions"
RELAYED = (CHAT, "/v1/responses")  # their other methods are the upstream's own API


def _document() -> dict[str, Any]:
    """The schema the proxy builds (it does not depend on settings: none of the shell's
    INFLIGHT_* variables are read, as the autouse `_clean_env` does not run at import)."""
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as env:
        for name in list(os.environ):
            if name.startswith("INFLIGHT_"):
                env.delenv(name)
        document: dict[str, Any] = create_app(make_settings(Path(tmp))).openapi()
    return document


DOCUMENT = _document()
# Schemathesis' `from_fixture` (lazy schemas) does not run on pytest 9.2 (it sets the removed
# `Node._nodeid`), so the schema is loaded at import and `proxy` checks that the running server
# serves exactly this document.
schema = schemathesis.openapi.from_dict(DOCUMENT)


@pytest.fixture
def proxy(tmp_path: Path, fake: FakeUpstream) -> Iterator[str]:
    """The proxy on a real uvicorn (lifespan on), its upstream the in-process fake: no network
    beyond 127.0.0.1. One server per operation, shared by its examples."""
    app = create_app(make_settings(tmp_path), transport=httpx.ASGITransport(app=fake.app))
    with serve(app) as base_url:
        served = httpx.get(f"{base_url}/openapi.json", timeout=REQUEST_TIMEOUT)
        assert served.json() == DOCUMENT
        yield base_url


def _relayed(response: Response, case: Case) -> bool:
    """Other methods on chat completions and responses go to the upstream's own API (see below)
    and come back verbatim (the fake answers PATCH with Starlette's plain-text 405)."""
    return case.operation.path in RELAYED and response.request.method != "POST"


def openai_error_envelope(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """Every 4xx of the proxy's own is OpenAI's `{"error": {"message", "type", ...}}` (the fake
    answers the chat requests relayed to it with 200, so every 4xx there is the proxy's too)."""
    if 400 <= response.status_code < 500 and not _relayed(response, case):
        seen = f"{response.request.method} {response.status_code} {response.content!r}"
        try:
            body = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise AssertionError(f"4xx that is not JSON: {seen}") from None
        error = body.get("error") if isinstance(body, dict) else None
        assert isinstance(error, dict), seen
        assert isinstance(error.get("message"), str), seen
        assert isinstance(error.get("type"), str), seen
    return None


def _control(case: Case, name: str) -> float | None:
    """The effective value of one compaction control: the header wins over `compaction`."""
    headers = {k.lower(): v for k, v in (case.headers or {}).items()}
    value: Any = headers.get(f"x-compaction-{name}")
    if (
        value is None
        and isinstance(case.body, dict)
        and isinstance(case.body.get("compaction"), dict)
    ):
        value = case.body["compaction"].get(name)
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def valid_data_accepted(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """Schemathesis' `positive_data_acceptance`, except where JSON Schema cannot say it: a
    target above the threshold (both given) is a documented 400 naming the target."""
    threshold, target = _control(case, "threshold"), _control(case, "target")
    if (
        threshold is not None
        and target is not None
        and target > threshold
        and response.status_code == 400
        and "target" in str(orjson.loads(response.content)["error"]["param"]).lower()
    ):
        return None
    return positive_data_acceptance(ctx, response, case)


def undeclared_method_refused(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """Schemathesis' `unsupported_method` (405 with `Allow`), except on chat completions and
    responses: there the proxy handles POST itself and relays every other method to the
    upstream's own API (OpenAI has GET and DELETE on /v1/chat/completions[/{id}] and
    /v1/responses/{id} for stored completions and responses)."""
    if _relayed(response, case):
        return None
    return unsupported_method(ctx, response, case)


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    missing_required_header,
    undeclared_method_refused,
    valid_data_accepted,
    openai_error_envelope,
]
# Left out on purpose:
# - negative_data_rejection: the proxy validates only what it needs (the chat shape, the
#   compaction controls) and forwards every other field (unknown roles, max_tokens, tools, ...)
#   for the upstream to judge, relaying its 4xx verbatim; the fake upstream accepts everything,
#   so "invalid data accepted" would be a verdict on the fake, not on the proxy.
# - max_response_time, ignored_auth, use_after_free, ensure_resource_availability,
#   object_level_authorization: no latency budget, no auth configured, no resources to create.


@schema.parametrize()
@settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
)
def test_schema(case: Case, proxy: str) -> None:
    case.call_and_validate(base_url=proxy, checks=CHECKS, timeout=REQUEST_TIMEOUT)
