"""The spill file: usage records and ledger rows the store could not take in time, one JSON line
each (`INFLIGHT_USAGE_SPILL_PATH`), written again when the store is back (and at startup).
Replaying is safe to repeat: both tables skip a row whose id is already there."""

from __future__ import annotations

import logging
import os
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from inflight.usage.ledger import LATE_FIELDS, LedgerRow, LedgerUpdate
from inflight.usage.records import Item, UsageRecord
from inflight.usage.stores.sql import COLUMNS

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SpilledLedgerRow(LedgerRow):
    """A ledger row read back from the spill file: its JSON document as it was rendered."""

    document: bytes = b"{}"

    def json(self) -> bytes:
        return self.document


def encode(item: Item) -> bytes:
    """One JSON line for a record, a ledger row (its document rendered now) or an update."""
    if isinstance(item, LedgerUpdate):
        return orjson.dumps({"ledger_update": {"id": item.id, **item.known()}}) + b"\n"
    if isinstance(item, LedgerRow):
        row = {"id": item.id, "owner": item.owner, "created": item.created,
               "expires": item.expires, "document": item.json().decode()}  # fmt: skip
        return orjson.dumps({"ledger": row}) + b"\n"
    # what the store keeps of a record (its columns are its field names), nothing else
    return orjson.dumps({"usage": {name: getattr(item, name) for name in COLUMNS}}) + b"\n"


def decode(line: bytes) -> Item:
    """The record or ledger row of a line `encode` wrote (ValueError/KeyError/TypeError if not)."""
    value = orjson.loads(line)
    if "ledger_update" in value:
        update = value["ledger_update"]
        return LedgerUpdate(str(update["id"]), **{k: update[k] for k in LATE_FIELDS if k in update})
    if "ledger" in value:
        row = value["ledger"]
        return SpilledLedgerRow(
            row["id"], row["owner"], float(row["created"]), float(row["expires"]), {},
            document=str(row["document"]).encode(),
        )  # fmt: skip
    fields: dict[str, Any] = {k: v for k, v in value["usage"].items() if k in COLUMNS}
    fields["strategies"] = tuple(fields.get("strategies", ()))
    return UsageRecord(**fields)


class SpillFile:
    """Appends to `path`; a replay first renames it to `path.replay`, so what is spilled during
    a replay starts a new file, and a replay cut short (the store failed again, the process was
    killed) is found and finished by the next one. Blocking: call it from a worker thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.replaying = path.with_name(path.name + ".replay")

    def append(self, items: Sequence[Item]) -> None:
        """Write `items` and fsync: once this returns they survive the process."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("ab") as f:
            f.write(b"".join(encode(item) for item in items))
            f.flush()
            os.fsync(f.fileno())

    def pending(self) -> bool:
        return self.replaying.exists() or self.path.exists()

    def take(self) -> Path | None:
        """The file to replay: one left by a replay cut short, else the spill file (renamed)."""
        if self.replaying.exists():
            return self.replaying
        try:
            self.path.rename(self.replaying)
        except FileNotFoundError:
            return None
        return self.replaying

    def batches(self, path: Path, size: int) -> Generator[list[Item], None, None]:
        """The items of `path` in batches of `size`; a line that does not decode (the last one,
        cut short by a kill) is logged and skipped."""
        batch: list[Item] = []
        with path.open("rb") as f:
            for number, line in enumerate(f, 1):
                try:
                    batch.append(decode(line))
                except (ValueError, KeyError, TypeError) as exc:
                    logger.warning("spill file %s line %d skipped: %s", path, number, exc)
                    continue
                if len(batch) >= size:
                    yield batch
                    batch = []
        if batch:
            yield batch

    def done(self, path: Path) -> None:
        path.unlink(missing_ok=True)
