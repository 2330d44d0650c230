"""Who a request is: the admin key `art serve` started with, or a key scoped to models.

The admin key (`--api-key` / `ART_API_KEY`) may do everything, including creating
scoped keys (`POST /v1/keys`). A scoped key names projects (every model in them) and
single models (`project/name`); it may register, read, log to, train, delete and run
inference on those models only, and on any base model. Scoped keys are kept on disk as
SHA-256 digests (`<path>/.art-serve/keys.json`), so a restart keeps them and the file
never holds a usable key.

Every route but `GET /health` needs `Authorization: Bearer <key>`: `/openapi.json` and
`/docs` included. Tinker's API (`tinker/routes.py`) takes the key as the `tinker` SDK sends
it, `X-API-Key: tml-<key>`. The request's key is put in a context variable, which the route
handlers and the OpenAI router read (`current()`).
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import json
import logging
import secrets
import threading
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..core.store.atomic import write_text_atomic
from ..runtime.endpoint.server import ApiError

logger = logging.getLogger("art.serve")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_OPEN_PATHS = ("/health",)


@dataclass(frozen=True)
class Principal:
    """What one key may touch."""

    key_id: str
    admin: bool = False
    projects: frozenset[str] = field(default_factory=frozenset)
    models: frozenset[str] = field(default_factory=frozenset)  # "project/name"

    def allows(self, project: str, name: str) -> bool:
        return self.admin or project in self.projects or f"{project}/{name}" in self.models

    def check(self, project: str, name: str, param: str) -> None:
        """403 unless this key may touch model (project, name)."""
        if not self.allows(project, name):
            raise ApiError(
                403,
                f"{param}: this API key may not use model {project}/{name}; ask the server's "
                "admin for a key scoped to it",
                param=param,
                code="forbidden",
            )

    def check_admin(self) -> None:
        if not self.admin:
            raise ApiError(
                403,
                "Authorization: only the server's admin key may manage keys",
                param="Authorization",
                code="forbidden",
            )


ADMIN = Principal(key_id="admin", admin=True)
_current: contextvars.ContextVar[Principal] = contextvars.ContextVar("art_serve_principal")


def current() -> Principal:
    """The principal of the request being handled (admin outside a request)."""
    return _current.get(ADMIN)


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyStore:
    """The admin key and the scoped keys, persisted as digests under `<path>/.art-serve/`."""

    def __init__(self, path: str, admin_key: str | None) -> None:
        self._admin_key = admin_key
        self._file = Path(path) / ".art-serve" / "keys.json"
        self._lock = threading.Lock()
        self._keys: dict[str, dict[str, Any]] = {}  # id -> record (with "sha256")
        if self._file.exists():
            for record in json.loads(self._file.read_text(encoding="utf-8")):
                self._keys[record["id"]] = record

    @property
    def open(self) -> bool:
        """True when the server runs without a key (`--no-auth`, loopback only)."""
        return self._admin_key is None

    def principal(self, key: str) -> Principal | None:
        if self._admin_key is not None and hmac.compare_digest(
            key.encode(), self._admin_key.encode()
        ):
            return ADMIN
        digest = _digest(key)
        with self._lock:
            for record in self._keys.values():
                if hmac.compare_digest(digest, record["sha256"]):
                    return Principal(
                        key_id=record["id"],
                        projects=frozenset(record["projects"]),
                        models=frozenset(record["models"]),
                    )
        return None

    def create(self, name: str, projects: list[str], models: list[str]) -> dict[str, Any]:
        key = f"art-{secrets.token_urlsafe(32)}"
        record: dict[str, Any] = {
            "id": f"key-{uuid.uuid4().hex[:12]}",
            "name": name,
            "projects": sorted(set(projects)),
            "models": sorted(set(models)),
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "sha256": _digest(key),
        }
        with self._lock:
            self._keys[record["id"]] = record
            self._save()
        return {**_public(record), "key": key}

    def list(self) -> list[dict[str, Any]]:
        with self._lock:
            return [_public(record) for record in self._keys.values()]

    def delete(self, key_id: str) -> None:
        with self._lock:
            if key_id not in self._keys:
                raise ApiError(404, f"key_id: no key {key_id!r}", param="key_id")
            del self._keys[key_id]
            self._save()

    def _save(self) -> None:
        text = json.dumps(list(self._keys.values()), indent=2) + "\n"
        write_text_atomic(self._file, text)
        self._file.chmod(0o600)


def _public(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != "sha256"}


class RequireKey:
    """ASGI middleware: `Authorization: Bearer <key>` on every route but `/health`."""

    def __init__(self, app: ASGIApp, keys: KeyStore) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        principal = ADMIN if self.keys.open else self._authenticate(scope)
        if principal is None:
            error = ApiError(
                401,
                "Authorization: missing or wrong API key; send 'Authorization: Bearer <key>'",
                param="Authorization",
                code="invalid_api_key",
            )
            log_rejected(scope["method"], scope["path"], error)
            await error.response()(scope, receive, send)
            return
        token = _current.set(principal)
        try:
            await self.app(scope, receive, send)
        finally:
            _current.reset(token)

    def _authenticate(self, scope: Scope) -> Principal | None:
        headers = dict(scope.get("headers") or [])
        if b"authorization" not in headers and b"x-api-key" in headers:
            # The tinker SDK's way: `X-API-Key: tml-<key>` (it refuses keys without the prefix).
            tinker_key = headers[b"x-api-key"].decode("latin-1").strip()
            if not tinker_key.startswith("tml-") or len(tinker_key) == 4:
                return None
            return self.keys.principal(tinker_key.removeprefix("tml-"))
        scheme, _, key = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return None
        return self.keys.principal(key.strip())


def log_rejected(method: str, path: str, error: ApiError) -> None:
    """One line per rejected request: what was refused and why (never a traceback)."""
    logger.warning("rejected %s %s: %d %s", method, path, error.status, error.message)


__all__ = ["ADMIN", "KeyStore", "Principal", "RequireKey", "current", "log_rejected"]
