"""ART's `art.serverless` import path."""

from ..backends.serverless import ServerlessBackend

__all__ = ["ServerlessBackend"]
