"""(being built)"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi import FastAPI

if TYPE_CHECKING:
    from .server import Router


def add_responses_route(app: FastAPI, router: Router, max_body_bytes: Callable[[], int]) -> None:
    """(being built)"""
