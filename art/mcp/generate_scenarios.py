"""ART's `art.mcp.generate_scenarios` import path."""

from ..integrations.mcp.generate import generate_scenarios, preview_scenarios

__all__ = ["generate_scenarios", "preview_scenarios"]
