"""The pipeline tests' own backend."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from art.local import LocalBackend


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def dedicated_backend(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[LocalBackend]:
    """One in-process LocalBackend for PipelineTrainer's dedicated-mode models: they cannot
    share a base model with the shared backend's models, which run in shared mode."""
    backend = LocalBackend(path=tmp_path_factory.mktemp("dedicated") / ".art", in_process=True)
    yield backend
    await backend.close()
