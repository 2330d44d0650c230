"""`SkyPilotBackend`: provisions a GPU cluster with SkyPilot and runs `art serve` there."""

from __future__ import annotations

from typing import Any, NoReturn

from ..core.errors import NotBuiltError

_MISSING = (
    "provisioning a cluster with SkyPilot needs the `art serve` server and its client, "
    "which are not built yet; use `art.local.LocalBackend` meanwhile"
)


class SkyPilotBackend:
    """Not available yet; every entry point raises `NotBuiltError`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotBuiltError("SkyPilotBackend", _MISSING)

    @classmethod
    async def initialize_cluster(cls, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotBuiltError("SkyPilotBackend.initialize_cluster", _MISSING)


__all__ = ["SkyPilotBackend"]
