"""Thin adapters onto other libraries' own extension points (LangGraph, MCP, OpenAI clients)."""
