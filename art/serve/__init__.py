"""`art serve`: the model service behind an authenticated HTTP API (see `app`)."""

from .app import build_server_app
from .state import ArtServer

__all__ = ["ArtServer", "build_server_app"]
