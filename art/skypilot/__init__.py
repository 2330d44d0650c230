"""ART's `art.skypilot` import path."""

from ..backends.skypilot import SkyPilotBackend

__all__ = ["SkyPilotBackend"]
