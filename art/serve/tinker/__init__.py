"""Tinker's REST API on `art serve` (`routes.py`), over the same keys, storage and runtime."""
