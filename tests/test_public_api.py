"""The import paths ART users write work, fast, and unbuilt capabilities say so."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_import_art_defines_lazy_names_and_imports_no_heavy_library() -> None:
    code = (
        "import sys; before = set(sys.modules); import art; "
        "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] != 'art')); "
        "print(sorted(m for m in sys.modules if m.startswith('art.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    foreign, submodules = out.stdout.splitlines()
    heavy = ("torch", "transformers", "openai", "pyarrow", "httpx", "pydantic", "litellm")
    heavy += ("wandb", "weave", "langfuse", "opentelemetry")
    assert not [m for m in eval(foreign) if m.split(".")[0] in heavy]
    # Every public name is loaded on first use; only the import hook that refuses ART's
    # unbuilt modules by name is there from the start (it imports nothing of its own), and
    # the two modules named as functions are, lazily (see art/__init__.py).
    assert eval(submodules) == ["art._refusals", "art.auto_trajectory", "art.yield_trajectory"]


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
    assert art.types.TrainResult is art.TrainResult
    assert issubclass(art.LocalTrainResult, art.TrainResult)
    assert issubclass(art.ServerlessTrainResult, art.TrainResult)
    assert art.ServerlessTrainResult(step=1).artifact_name is None
    assert art.types.Messages is art.Messages
    assert art.gather.gather_trajectory_groups is art.gather_trajectory_groups
    assert art.utils.retry is art.retry
    assert art.dev.TrainConfig is not art.TrainConfig  # the dev config is the GRPO one


def test_art_0_5_23_module_paths_resolve_to_the_same_objects() -> None:
    import art
    import art.errors
    import art.tokenizer
    import art.utils.sft

    assert art.tokenizer.get_tokenizer is art.get_tokenizer
    assert art.dev.LoRAConfig is art.LoRAConfig
    assert art.errors.LocalServingUnavailableError is art.LocalServingUnavailableError
    assert issubclass(art.LocalServingUnavailableError, art.BackendError)
    assert callable(art.utils.sft.create_sft_dataset_iterator)


def test_unknown_attribute_is_an_attribute_error() -> None:
    import art

    with pytest.raises(AttributeError, match="no attribute 'Trajectroy'"):
        _ = art.Trajectroy  # type: ignore[attr-defined]


def test_names_that_are_both_a_module_and_a_function_stay_the_function() -> None:
    # A submodule's first import sets its package's attribute to the module; in a fresh
    # process, the function fetched first and the module imported after must not replace it.
    code = (
        "import art\n"
        "before = (art.auto_trajectory, art.yield_trajectory)\n"
        "import art.auto_trajectory, art.yield_trajectory\n"
        "assert (art.auto_trajectory, art.yield_trajectory) == before\n"
        "assert callable(art.auto_trajectory) and callable(art.yield_trajectory)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
