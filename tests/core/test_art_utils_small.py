"""ART's small `art.utils` modules: strip_logprobs, group_aggregate, output_dirs,
get_repo_root_path, cache_dirs and append_only."""

from __future__ import annotations

import copy
import logging
import threading
from pathlib import Path

import pytest
from helpers import sampled_choice, tool_trajectory

import art
from art.core.store.cache_dirs import NETWORK_FILESYSTEMS
from art.core.store.model_store import ModelStore
from art.utils import append_only, cache_dirs, output_dirs
from art.utils.get_repo_root_path import get_repo_root_path
from art.utils.strip_logprobs import strip_logprobs

# --- strip_logprobs ---------------------------------------------------------------------


def test_strip_logprobs_removes_them_everywhere_and_changes_nothing_given() -> None:
    data = {"logprobs": [1], "a": [{"logprobs": 2, "b": 3}, ({"logprobs": 4},)]}
    assert strip_logprobs(data) == {"a": [{"b": 3}, ({},)]}
    assert data["logprobs"] == [1]

    trajectory = tool_trajectory(1.0)
    stripped = strip_logprobs(trajectory)
    choices = [m for m in stripped.messages_and_choices if not isinstance(m, dict)]
    assert len(choices) == 2
    assert all(c.logprobs is None for c in choices)
    assert stripped.messages_and_choices[0] == trajectory.messages_and_choices[0]
    assert trajectory.messages_and_choices[4].logprobs is not None  # the original kept

    choice = sampled_choice("hi")
    assert strip_logprobs(choice).logprobs is None
    assert choice.logprobs is not None


def test_strip_logprobs_returns_what_cannot_be_copied(caplog: pytest.LogCaptureFixture) -> None:
    held = {"lock": threading.Lock(), "logprobs": 1}
    with caplog.at_level(logging.WARNING, logger="art"):
        assert strip_logprobs(held) is held
    assert "could not copy" in caplog.text


# --- group_aggregate --------------------------------------------------------------------


def test_group_aggregate_by_hand() -> None:
    import torch

    from art.utils.group_aggregate import group_aggregate

    values = torch.tensor([[1.0, 3.0, 10.0, 20.0], [2.0, 2.0, 2.0, 6.0]])
    by = torch.tensor([[0, 0, 1, 1], [5, 5, 5, 1]])  # labels 0, 1, 5 over the batch

    def agg(reduce: str, **kw: bool) -> list[list[float]]:
        out = group_aggregate(values, by=by, reduce=reduce, eps=0.0, **kw)  # type: ignore[arg-type]
        return [[round(x, 4) for x in row] for row in out.tolist()]

    assert agg("mean") == [[2.0, 2.0, 15.0, 15.0], [2.0, 2.0, 2.0, 6.0]]
    assert agg("sum") == [[4.0, 4.0, 30.0, 30.0], [6.0, 6.0, 6.0, 6.0]]
    assert agg("count") == [[2.0, 2.0, 2.0, 2.0], [3.0, 3.0, 3.0, 1.0]]
    assert agg("var") == [[1.0, 1.0, 25.0, 25.0], [0.0, 0.0, 0.0, 0.0]]
    assert agg("std") == [[1.0, 1.0, 5.0, 5.0], [0.0, 0.0, 0.0, 0.0]]
    assert agg("min") == [[1.0, 1.0, 10.0, 10.0], [2.0, 2.0, 2.0, 6.0]]
    assert agg("max") == [[3.0, 3.0, 20.0, 20.0], [2.0, 2.0, 2.0, 6.0]]
    # compact: [B, K] with the labels ascending (0, 1, 5); absent labels are empty
    assert agg("sum", broadcast=False) == [[4.0, 30.0, 0.0], [0.0, 6.0, 6.0]]
    assert agg("max", broadcast=False)[0] == [3.0, 20.0, float("-inf")]

    features = torch.arange(8.0).reshape(1, 4, 2).requires_grad_()
    out = group_aggregate(features, by=torch.tensor([[0, 0, 1, 1]]), eps=0.0)
    assert out.tolist() == [[[1.0, 2.0], [1.0, 2.0], [5.0, 6.0], [5.0, 6.0]]]
    out.sum().backward()
    assert features.grad is not None
    assert features.grad.tolist() == [[[1.0, 1.0]] * 4]
    empty = torch.zeros(2, 0)
    assert group_aggregate(empty, by=empty.long(), broadcast=False).shape == (2, 0)


def test_group_aggregate_names_bad_arguments() -> None:
    import torch

    from art.utils.group_aggregate import group_aggregate

    values = torch.ones(2, 3)
    with pytest.raises(art.ConfigError, match="reduce: unknown reduction 'median'"):
        group_aggregate(values, by=torch.zeros(2, 3), reduce="median")  # type: ignore[arg-type]
    with pytest.raises(art.ConfigError, match="by: shape"):
        group_aggregate(values, by=torch.zeros(3, 2))
    with pytest.raises(art.ConfigError, match="values: must have at least 2"):
        group_aggregate(torch.ones(3), by=torch.zeros(3))


# --- output_dirs and get_repo_root_path -------------------------------------------------


def test_output_dirs_name_the_store_s_directories(tmp_path: Path) -> None:
    model = art.Model(name="agent", project="proj")
    model_dir = output_dirs.get_model_dir(model, art_path=str(tmp_path))
    assert Path(model_dir) == ModelStore(tmp_path, "proj", "agent").dir
    assert model_dir == output_dirs.get_output_dir_from_model_properties(
        "proj", "agent", str(tmp_path)
    )
    assert output_dirs.get_models_dir("proj", "/runs") == "/runs/proj/models"
    assert output_dirs.get_step_checkpoint_dir("/m", 12) == "/m/checkpoints/0012"
    assert output_dirs.get_trajectories_dir("/m") == "/m/trajectories"
    assert output_dirs.get_trajectories_split_dir("/m", "val") == "/m/trajectories/val"
    # where LocalBackend() writes when given no path
    assert output_dirs.get_default_art_path() == "./.art"
    assert output_dirs.get_model_dir(model) == "./.art/proj/models/agent"


def test_get_repo_root_path_is_the_checkout_holding_art_or_dot() -> None:
    root = get_repo_root_path()
    package = Path(art.__file__).resolve().parent
    if root == ".":
        assert not any((p / ".git").exists() for p in package.parents)
    else:
        assert (Path(root) / ".git").exists()
        assert Path(root) in package.parents


# --- cache_dirs -------------------------------------------------------------------------


def test_cache_env_defaults_keep_what_a_user_set() -> None:
    environ = {"HF_HOME": "/data/hf", "TORCH_CUDA_ARCH_LIST": "8.0 9.0+PTX"}
    root = cache_dirs.configure_model_cache_env(environ)
    assert root == Path("/tmp/art-cache")
    assert environ["HF_HOME"] == "/data/hf"  # the user's
    assert environ["HF_HUB_CACHE"] == "/data/hf/hub"
    assert environ["TRANSFORMERS_CACHE"] == "/data/hf/hub"
    assert environ["TORCH_HOME"] == "/tmp/art-cache/torch"
    assert environ["TRITON_CACHE_DIR"] == "/tmp/art-cache/compiled/8.0_9.0_PTX/triton"
    assert "ART_MEGATRON_CACHE_ROOT" not in environ

    # A new root moves what was derived from the old one, not what the user set.
    root = cache_dirs.configure_model_cache_env(environ, cache_root="/scratch/c")
    assert root == Path("/scratch/c")
    assert environ["ART_MEGATRON_CACHE_ROOT"] == "/scratch/c"
    assert environ["TORCH_HOME"] == "/scratch/c/torch"
    assert environ["VLLM_CACHE_ROOT"] == "/scratch/c/compiled/8.0_9.0_PTX/vllm"
    assert environ["HF_HOME"] == "/data/hf"


def test_cache_filesystem_helpers(tmp_path: Path) -> None:
    assert cache_dirs.compiler_cache_root("/c", {}) == Path("/c/compiled/unknown")
    if Path("/proc/mounts").exists():
        assert isinstance(cache_dirs.cache_filesystem_type(tmp_path), str)
        kind = cache_dirs.cache_filesystem_type(tmp_path)
        warning = cache_dirs.network_cache_warning(tmp_path)
        assert (warning is None) == (kind not in NETWORK_FILESYSTEMS)


# --- append_only ------------------------------------------------------------------------


def test_merge_chat_delta_rebuilds_a_streamed_tool_call() -> None:
    message: dict[str, object] = {}
    for delta in (
        {"role": "assistant", "content": "Let me"},
        {"content": " check."},
        {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "get_", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"name": "weather", "arguments": '{"city"'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": ': "Oslo"}'}}]},
        {"role": "assistant"},
    ):
        append_only.merge_chat_delta(message, delta)
    assert message == {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {"id": "c1", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
        ],
    }


def test_the_chat_helpers() -> None:
    assert append_only.preserves_history(None)
    assert not append_only.preserves_history({"preserve_thinking": False})
    assert not append_only.preserves_history({"drop_thinking": True})
    call = {"function": {"name": "f", "arguments": '{"a": 1}'}}
    assert append_only.has_renderable_tool_arguments({"tool_calls": [call]})
    assert append_only.has_renderable_tool_arguments(
        {"tool_calls": [{"function": {"arguments": ""}}]}
    )
    assert not append_only.has_renderable_tool_arguments(
        {"tool_calls": [{"function": {"arguments": "[1]"}}]}
    )
    assert not append_only.has_renderable_tool_arguments({"function_call": {"arguments": "{"}})
    message = {
        "role": "assistant",
        "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}],
    }
    converted = append_only.openai_tool_arguments(copy.deepcopy(message))
    assert converted["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'


@pytest.mark.parametrize(
    "name",
    ["chat_prefix_observations", "output_prefix_observations", "patch_deepseek_renderer"],
)
def test_engine_internals_are_refused_by_name(name: str) -> None:
    with pytest.raises(art.NotBuiltError, match=f"append_only.{name} is not available"):
        getattr(append_only, name)()
    with pytest.raises(art.NotBuiltError, match="exact token ids"):
        append_only.PrefixObservation()
