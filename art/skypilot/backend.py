"""ART's `art.skypilot.backend` import path."""

from ..backends.skypilot import SkyPilotBackend

__all__ = ["SkyPilotBackend"]
