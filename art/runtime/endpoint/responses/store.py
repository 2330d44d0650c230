"""Stored responses: the last `STORED_RESPONSES` used, in memory, for
`previous_response_id` and `GET /v1/responses/{id}`; the server forgets them when it stops."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

STORED_RESPONSES = 1000  # responses kept for `previous_response_id` and GET, least recent out


@dataclass(frozen=True)
class StoredResponse:
    """A response as answered, and the conversation it ends (input and output items,
    without `instructions`), which a request naming it as `previous_response_id` extends."""

    response: dict[str, Any]
    items: list[dict[str, Any]]


class ResponseStore:
    """The last `capacity` stored responses by id, least recently used out first."""

    def __init__(self, capacity: int = STORED_RESPONSES) -> None:
        self.capacity = capacity
        self._responses: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            stored = self._responses.get(response_id)
            if stored is not None:
                self._responses.move_to_end(response_id)
            return stored

    def put(self, response_id: str, stored: StoredResponse) -> None:
        with self._lock:
            self._responses[response_id] = stored
            self._responses.move_to_end(response_id)
            while len(self._responses) > self.capacity:
                self._responses.popitem(last=False)


__all__ = ["STORED_RESPONSES", "ResponseStore", "StoredResponse"]
