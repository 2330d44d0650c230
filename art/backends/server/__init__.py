"""`art serve`: the model service behind an authenticated HTTP API (see `app`)."""

from .app import ArtServer, build_server_app

__all__ = ["ArtServer", "build_server_app"]
