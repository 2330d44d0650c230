"""Backends: where models are served and trained. Each implements `art.core.backend.Backend`."""
