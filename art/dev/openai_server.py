"""ART's `art.dev.openai_server` import path."""

from ..core.data.dev import OpenAIServerConfig, ServerArgs
from . import get_openai_server_config

__all__ = ["OpenAIServerConfig", "ServerArgs", "get_openai_server_config"]
