"""The import paths ART users write work, fast, and unbuilt capabilities say so."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest


def test_import_art_is_fast_and_pulls_no_heavy_library() -> None:
    code = (
        "import time, sys; t = time.perf_counter(); import art; "
        "print(time.perf_counter() - t); "
        "print(any(m in sys.modules for m in ('torch', 'transformers', 'openai', 'pyarrow')))"
    )
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    seconds, heavy = out.stdout.split()
    assert float(seconds) < 0.2, "import art should only define lazy names"
    assert wall < 1.0, f"a whole `python -c 'import art'` took {wall:.2f}s"
    assert heavy == "False"


def test_every_documented_import_line_works() -> None:
    import art
    import art.langgraph
    import art.mcp
    from art.dev import InternalModelConfig
    from art.local import LocalBackend
    from art.rewards import ruler, ruler_score_group
    from art.serverless.backend import ServerlessBackend
    from art.skypilot import SkyPilotBackend
    from art.utils import iterate_dataset, limit_concurrency

    assert callable(ruler)
    assert callable(ruler_score_group)
    assert callable(iterate_dataset)
    assert callable(limit_concurrency)
    assert InternalModelConfig().engine is None
    assert LocalBackend
    assert ServerlessBackend
    assert SkyPilotBackend
    assert art.langgraph.init_chat_model
    assert art.mcp.MCPTool
    for name in art.__all__:
        assert getattr(art, name) is not None, name


def test_art_0_5_module_paths_resolve_to_the_same_objects() -> None:
    import art
    import art.gather
    import art.trajectories
    import art.types
    import art.utils

    assert art.trajectories.Trajectory is art.Trajectory
    assert art.trajectories.TrajectoryGroup is art.TrajectoryGroup
    assert art.types.TrainConfig is art.TrainConfig
    assert art.types.Messages is art.Messages
    assert art.gather.gather_trajectory_groups is art.gather_trajectory_groups
    assert art.utils.retry is art.retry
    assert art.dev.TrainConfig is not art.TrainConfig  # the dev config is the GRPO one


def test_unknown_attribute_is_an_attribute_error() -> None:
    import art

    with pytest.raises(AttributeError, match="no attribute 'Trajectroy'"):
        _ = art.Trajectroy  # type: ignore[attr-defined]


async def test_unbuilt_capabilities_raise_not_implemented_naming_what_is_missing() -> None:
    import art

    with pytest.raises(NotImplementedError, match="LangGraph"):
        art.langgraph.init_chat_model()
    with pytest.raises(NotImplementedError, match="MCP"):
        art.mcp.MCPTool()
    with pytest.raises(art.NotBuiltError):
        art.capture_auto_trajectory(None)
