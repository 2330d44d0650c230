"""ART's `art.serverless.backend` import path."""

from ..backends.serverless import ServerlessBackend

__all__ = ["ServerlessBackend"]
