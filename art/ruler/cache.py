"""An on-disk cache of judge answers, so scoring the same group twice costs one call.

One JSON file per request, named by the sha256 of the request's canonical JSON (model,
parameters, messages, response format; never the API key), written atomically. Only
answers that passed the check are stored.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..core.store.atomic import write_text_atomic

# Parameters that choose who pays or how long to wait, not what the judge answers.
_NOT_IN_KEY = frozenset({"api_key", "timeout", "num_retries", "max_retries", "metadata"})


def default_cache_dir() -> Path:
    """$ART_CACHE_DIR/ruler, else ~/.cache/art/ruler."""
    configured = os.environ.get("ART_CACHE_DIR")
    return (Path(configured) if configured else Path.home() / ".cache" / "art") / "ruler"


def cache_key(request: Mapping[str, Any]) -> str:
    """The sha256 of `request` as canonical JSON (sorted keys, no spaces), secrets left out."""
    kept = {key: value for key, value in request.items() if key not in _NOT_IN_KEY}
    canonical = json.dumps(
        kept, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


class JudgeCache:
    """Judge answers stored under `directory`, one `<key>.json` file each."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored answer for `key`, or None when there is none (or it is unreadable)."""
        try:
            text = self.path(key).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            entry = json.loads(text)
        except json.JSONDecodeError:
            return None  # a file someone else truncated: ask the judge again
        return entry if isinstance(entry, dict) else None

    def put(self, key: str, entry: Mapping[str, Any]) -> None:
        write_text_atomic(self.path(key), json.dumps(entry, ensure_ascii=False, indent=1))
