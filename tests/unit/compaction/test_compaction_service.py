"""The compaction service through the `WireFormat` seam: any adapter's view is planned, the
result rendered back by the adapter (untouched items the same objects), a skipped request
forwarded as received; controls parsed without changing the body they come from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from inflight.compaction.policy import parse_controls
from inflight.compaction.service import CompactionService
from inflight.compaction.wire import ApiName, Conversation
from inflight.errors import BadRequest
from inflight.tokens.counter import ChatTokenCounter
from inflight.tokens.encodings import load_encodings
from inflight.windows.registry import WindowRegistry
from inflight.windows.table import ModelTable
from tests.conftest import make_settings

pytestmark = pytest.mark.anyio
CONFIG = Path(__file__).resolve().parents[3] / "config"


class Wrapped:
    """A wire format unlike chat's: the history is `items`, each `{"m": message}`."""

    api: ApiName = "responses"

    def __init__(self, skip: str | None = None) -> None:
        self.skip = skip
        self.rendered: list[Sequence[int | None]] = []

    def conversation(self, body: Mapping[str, Any]) -> Conversation:
        fixed = {k: v for k, v in body.items() if k != "items"}
        return Conversation([item["m"] for item in body["items"]], fixed, self.skip)

    def render(
        self,
        body: Mapping[str, Any],
        conversation: Conversation,
        messages: Sequence[Mapping[str, Any]],
        sources: Sequence[int | None],
    ) -> dict[str, Any]:
        self.rendered.append(sources)
        items = [
            body["items"][s]
            if s is not None and message is conversation.messages[s]
            else {"m": message}
            for message, s in zip(messages, sources, strict=True)
        ]
        return {**body, "items": items}


def history(pairs: int) -> list[dict[str, Any]]:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "go"}]
    for i in range(pairs):
        messages.append({"role": "assistant", "content": f"answer {i} " * 40})
        messages.append({"role": "user", "content": f"question {i} " * 40})
    return messages


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> CompactionService:
    table = ModelTable.load(CONFIG / "models.toml")
    counter = ChatTokenCounter(load_encodings(), table)
    settings = make_settings(tmp_path_factory.mktemp("svc"))
    return CompactionService(settings, counter, WindowRegistry(table, None))


TRIM = {"x-compaction-strategy": "trim", "x-compaction-context-limit": "2000"}


async def test_any_adapter_is_planned_and_rendered_back(service: CompactionService) -> None:
    wire = Wrapped()
    items = [{"m": m} for m in history(40)]
    body = {"model": "gpt-4o", "items": items, "compaction": {"target": 0.5}}
    compacted = await service.prepare(wire, TRIM, body, "http://u/v1")
    sent = compacted.body
    assert "compaction" not in sent
    assert "messages" not in sent
    assert compacted.headers["X-Compaction-Applied"] == "trim"
    assert len(sent["items"]) < len(items)
    assert wire.rendered, "the adapter renders what the plan changed"
    kept = [item for item in sent["items"] if any(item is i for i in items)]
    assert kept == sent["items"]  # trim only drops: every item sent is the client's own object
    assert compacted.forward == orjson.dumps(sent)
    assert compacted.view["messages"] == [item["m"] for item in sent["items"]]
    assert body["compaction"] == {"target": 0.5}  # the client's body is not changed


async def test_a_skipped_request_is_forwarded_as_received(service: CompactionService) -> None:
    wire = Wrapped(skip="previous_response_id: the history lives upstream")
    body = {"model": "gpt-4o", "items": [{"m": m} for m in history(40)]}
    compacted = await service.prepare(wire, TRIM, body, "http://u/v1")
    assert compacted.forward is None  # the client's bytes go up
    assert compacted.body is body
    assert compacted.headers["X-Compaction-Applied"] == "none"
    assert wire.rendered == []


async def test_a_fitting_request_keeps_its_bytes(service: CompactionService) -> None:
    body = {"model": "gpt-4o", "items": [{"m": m} for m in history(1)]}
    compacted = await service.prepare(Wrapped(), TRIM, body, "http://u/v1")
    assert compacted.forward is None
    assert compacted.strategies == ()


def test_parse_controls_leaves_the_body_alone() -> None:
    body = {"model": "m", "messages": [], "transforms": ["middle-out"], "compaction": {}}
    before = orjson.dumps(body)
    controls, cleaned = parse_controls({}, body)
    assert orjson.dumps(body) == before
    assert cleaned == {"model": "m", "messages": []}
    assert controls.strategies == ("middle-out",)
    plain = {"model": "m", "messages": []}
    assert parse_controls({"x-compaction-threshold": "0.5"}, plain)[1] is plain


class Failing(Wrapped):
    """An adapter with a bug (it fails on what it should read), or one that refuses the body."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def conversation(self, body: Mapping[str, Any]) -> Conversation:
        raise self.error


async def test_an_adapter_failure_forwards_the_request_as_received(
    service: CompactionService,
) -> None:
    body = {"model": "gpt-4o", "items": [{"m": m} for m in history(40)]}
    compacted = await service.prepare(Failing(KeyError("items")), TRIM, body, "http://u/v1")
    assert compacted.forward is None
    assert compacted.body is body
    assert compacted.headers["X-Compaction-Applied"] == "none"


async def test_an_adapter_refusal_is_the_clients_error(service: CompactionService) -> None:
    body = {"model": "gpt-4o", "items": "not a list"}
    refusal = BadRequest("'items' must be an array", param="items")
    with pytest.raises(BadRequest, match="must be an array"):
        await service.prepare(Failing(refusal), TRIM, body, "http://u/v1")
