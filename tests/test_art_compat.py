"""ART's own code runs unchanged: its import paths, its `art.utils` modules, its copy semantics.

Written from ART's documented usage (the seeds) and its published package's module tree
(`art.local.backend`, `art.skypilot.backend`, `art.utils.<module>`).
"""

from __future__ import annotations

import copy
import importlib
import json
import sys
from pathlib import Path

import pytest
from helpers import sampled_choice

import art


def test_arts_backend_module_paths_are_the_same_classes() -> None:
    from art.local import LocalBackend as FromPackage
    from art.local.backend import LocalBackend
    from art.serverless.backend import ServerlessBackend
    from art.skypilot import SkyPilotBackend as SkyFromPackage
    from art.skypilot.backend import SkyPilotBackend

    assert LocalBackend is FromPackage is art.LocalBackend
    assert SkyPilotBackend is SkyFromPackage
    assert ServerlessBackend.__name__ == "ServerlessBackend"


def test_art_utils_modules_and_functions_both_resolve() -> None:
    for module, name in [
        ("iterate_dataset", "iterate_dataset"),
        ("limit_concurrency", "limit_concurrency"),
        ("retry", "retry"),
        ("format_message", "format_message"),
        ("get_model_step", "get_model_step"),
        ("log_http_errors", "log_http_errors"),
        ("litellm", "convert_litellm_choice_to_openai"),
    ]:
        function = getattr(importlib.import_module(f"art.utils.{module}"), name)
        assert callable(function), module
    import art.utils

    # Importing a submodule named like a function leaves the package's function in place.
    assert art.utils.iterate_dataset is art.iterate_dataset
    assert art.utils.limit_concurrency is art.limit_concurrency
    assert art.utils.retry is art.retry
    batch = next(iter(art.utils.iterate_dataset([1, 2, 3], groups_per_step=2, use_tqdm=False)))
    assert (len(batch.items), batch.step) == (2, 0)


def test_format_message_writes_role_content_and_tool_calls() -> None:
    from art.utils import format_message

    assert format_message({"role": "user", "content": "hi"}) == "User:\nhi"
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    text = format_message({"role": "assistant", "content": "", "tool_calls": [call]})
    assert text == 'Assistant:\nf({"a": 1})'


def test_get_model_step_reads_the_highest_checkpoint(tmp_path: Path) -> None:
    from art.utils.get_model_step import get_model_step, get_step_from_dir

    model = art.TrainableModel(name="m", project="p", base_model="x")
    model_dir = tmp_path / "p" / "models" / "m"
    assert get_model_step(model, tmp_path) == 0
    assert get_step_from_dir(model_dir) == 0
    for step in ("0000", "0003", ".0004.tmp"):
        (model_dir / "checkpoints" / step).mkdir(parents=True)
    assert get_model_step(model, tmp_path) == 3
    assert get_step_from_dir(str(model_dir)) == 3


async def test_log_http_errors_names_status_url_and_detail(chat_server_url: str) -> None:
    import httpx

    from art.utils import log_http_errors

    @log_http_errors
    async def missing() -> None:
        async with httpx.AsyncClient() as client:
            # The stand-in server answers GET with 501 (no handler): a status error.
            (await client.get(f"{chat_server_url}/nothing")).raise_for_status()

    with pytest.raises(art.BackendError, match=r"\[HTTP 501\] .*/nothing"):
        await missing()


async def test_a_litellm_choice_converts_to_the_openai_choice_a_trajectory_trains_on(
    chat_server_url: str,
) -> None:
    import litellm
    from openai.types.chat.chat_completion import Choice

    from art.utils.litellm import convert_litellm_choice_to_openai

    response = await litellm.acompletion(
        model="openai/m",
        api_base=chat_server_url,
        api_key="k",
        messages=[{"role": "user", "content": "hello there"}],
        logprobs=True,
    )
    choice = convert_litellm_choice_to_openai(response.choices[0])  # type: ignore[union-attr]
    assert isinstance(choice, Choice)
    assert choice.message.content == "echo: hello there"
    assert choice.logprobs is not None
    assert choice.logprobs.content is not None
    assert [t.token for t in choice.logprobs.content] == ["echo:", "hello", "there"]
    trajectory = art.Trajectory(
        messages_and_choices=[{"role": "user", "content": "hello there"}, choice], reward=1.0
    )
    assert trajectory.messages()[-1]["content"] == "echo: hello there"

    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    response = await litellm.acompletion(
        model="openai/m",
        api_base=chat_server_url,
        api_key="k",
        messages=[{"role": "user", "content": "call it"}],
        tools=tools,
    )
    called = convert_litellm_choice_to_openai(response.choices[0])  # type: ignore[union-attr]
    assert called.finish_reason == "tool_calls"
    assert [(c.id, c.function.name) for c in called.message.tool_calls or []] == [  # type: ignore[union-attr]
        ("call_1", "lookup")
    ]


def test_copies_of_trajectories_and_groups_behave_as_arts() -> None:
    """As ART 0.5.5-0.5.18: a trajectory is a plain pydantic model (a shallow copy shares its
    lists); a group's shallow copy has its own lists holding the same trajectories."""
    trajectory = art.Trajectory(
        messages_and_choices=[{"role": "user", "content": "q"}, sampled_choice("a b")],
        reward=1.0,
        metrics={"m": 1.0},
        logs=["x"],
    )
    group = art.TrajectoryGroup([trajectory, ValueError("boom")], metadata={"k": "v"})

    shallow, shallow_group = copy.copy(trajectory), copy.copy(group)
    assert shallow is not trajectory
    assert shallow == trajectory
    assert shallow.messages_and_choices is trajectory.messages_and_choices
    assert shallow_group is not group
    assert shallow_group == group
    assert shallow_group.trajectories[0] is trajectory  # the same trajectory objects
    shallow_group.trajectories.append(shallow)
    shallow_group.exceptions.clear()
    shallow_group.metadata["k2"] = "v2"
    assert group.trajectories == [trajectory]
    assert len(group.exceptions) == 1
    assert group.metadata == {"k": "v"}

    deep, deep_group = copy.deepcopy(trajectory), copy.deepcopy(group)
    assert deep == trajectory
    assert deep_group == group
    assert deep_group.trajectories[0] is not trajectory
    deep.messages_and_choices.append({"role": "user", "content": "more"})
    deep.logs.append("y")
    deep_group.trajectories.append(deep)
    deep_group.trajectories[0].metrics["m"] = 2.0
    assert len(trajectory.messages_and_choices) == 2
    assert trajectory.logs == ["x"]
    assert len(group.trajectories) == 1
    assert trajectory.metrics == {"m": 1.0}


async def test_arts_vllm_server_settings_are_its_dicts_and_our_backends_refuse_them(
    tmp_path: Path,
) -> None:
    # ART's TypedDicts: what a client of ART's protocol builds and sends `art run`.
    config = art.dev.OpenAIServerConfig(server_args=art.dev.ServerArgs(port=8001))
    assert config == {"server_args": {"port": 8001}}
    with pytest.raises(art.NotBuiltError, match="EngineArgs"):
        art.dev.get_openai_server_config()
    model = art.TrainableModel(name="m", project="p", base_model="x")
    with pytest.raises(art.ConfigError) as raised:
        await model.register(art.LocalBackend(path=tmp_path), _openai_client_config=config)
    assert raised.value.field == "_openai_client_config"
    assert not (tmp_path / "p").exists()


# The public names of ART 0.5.18, read from its wheel (art/__init__.py, art/dev/__init__.py,
# art/pipeline_trainer/__init__.py, art/utils/__init__.py).
ART_NAMES = {
    "art": "dev auto_trajectory capture_auto_trajectory gather_trajectories "
    "gather_trajectory_groups trajectory_group_batches Backend LocalBackend LocalTrainResult "
    "ServerlessBackend ServerlessTrainResult Messages MessagesAndChoices Tools Model "
    "TrainableModel retry TrainSFTConfig TrainConfig TrainResult Trajectory TrajectoryGroup "
    "capture_yielded_trajectory yield_trajectory",
    "art.dev": "EngineArgs InternalModelConfig InitArgs PeftArgs TinkerArgs TinkerNativeArgs "
    "TinkerTrainingClientArgs TrainerArgs get_openai_server_config is_dedicated_mode "
    "OpenAIServerConfig ServerArgs TrainSFTConfig TrainConfig validate_dedicated_config",
    "art.pipeline_trainer": "CHECKPOINT_CREATED_AT_METRIC CHECKPOINT_EVAL_COMPLETED_METRIC "
    "CHECKPOINT_SAVED_METRIC CheckpointInfo CheckpointRetentionContext "
    "CheckpointRetentionStrategy PipelineTrainer make_group_rollout_fn keep_recent_and_top "
    "StatusReporter RolloutFn SingleRolloutFn EvalFn ScenarioT",
    "art.utils": "format_message record_provenance retry iterate_dataset limit_concurrency "
    "log_http_errors get_model_step",
}


@pytest.mark.parametrize("module", sorted(ART_NAMES))
def test_every_public_name_of_art_0_5_18_exists(module: str) -> None:
    """Each is built, or raises NotBuiltError saying what is missing when used."""
    imported = importlib.import_module(module)
    missing = [name for name in ART_NAMES[module].split() if not hasattr(imported, name)]
    assert missing == []


def test_coming_from_art_says_of_each_name_whether_it_works_or_why_it_is_refused() -> None:
    page = (Path(__file__).resolve().parent.parent / "docs" / "coming-from-art.md").read_text()
    wrong = []
    for module, names in ART_NAMES.items():
        imported = importlib.import_module(module)
        for name in names.split():
            doc = getattr(imported, name).__doc__ or ""
            missing = doc.removeprefix("Not available yet: ")
            said = f"refused: {missing}" if missing != doc else "works"
            if f"| `{module}.{name}` | {said} |" not in page:
                wrong.append(f"{module}.{name}: {said}")
    assert not wrong, f"rows missing or wrong in docs/coming-from-art.md: {wrong}"


def test_names_not_built_say_so_when_used() -> None:
    with pytest.raises(art.NotBuiltError, match="gather_trajectory_groups"):
        art.trajectory_group_batches([], batch_size=2)
    with pytest.raises(art.NotBuiltError, match="Tinker"):
        art.dev.TinkerArgs()
    with pytest.raises(art.NotBuiltError, match="W&B"):
        art.utils.record_provenance(None, "local-rl")
    assert art.dev.is_dedicated_mode({"trainer_gpu_ids": [], "inference_gpu_ids": []})
    assert not art.dev.is_dedicated_mode(art.dev.InternalModelConfig())
    with pytest.raises(art.ConfigError, match="set both"):
        art.dev.validate_dedicated_config({"trainer_gpu_ids": [0]})


async def test_a_backend_of_arts_protocol_is_checked_once_naming_what_it_lacks() -> None:
    from art.backend import AnyModel, AnyTrainableModel

    assert (AnyModel, AnyTrainableModel) == (art.Model, art.TrainableModel)

    class HalfBackend:  # an integration that has not written training yet
        async def register(self, model: object) -> None: ...
        async def _get_step(self, model: object) -> int:
            return 0

        async def _delete_checkpoint_files(self, model: object, steps: list[int]) -> None: ...
        async def close(self) -> None: ...

    model = art.TrainableModel(name="m", project="p", base_model="x")
    with pytest.raises(art.ConfigError) as raised:
        await model.register(HalfBackend())
    assert raised.value.field == "backend"
    assert "_prepare_backend_for_training, _train_model" in str(raised.value)
    plain = art.Model(name="m", project="p")  # a model that is not trained needs no more
    await plain.register(HalfBackend())
    assert await plain.get_step() == 0


def test_arts_none_sections_and_dump_of_the_internal_config_round_trip() -> None:
    # ART's clients send None for every section the user left unset.
    config = art.dev.InternalModelConfig(init_args=None, engine_args=None, trainer_args=None)
    assert config == art.dev.InternalModelConfig()
    model = art.TrainableModel(
        name="m",
        project="p",
        base_model="x",
        _internal_config=art.dev.InternalModelConfig(
            engine_args=art.dev.EngineArgs(max_num_seqs=4)
        ),
    )
    dumped = model.model_dump()
    assert dumped["_internal_config"] == {"engine_args": {"max_num_seqs": 4}}
    again = art.TrainableModel.model_validate(dumped)
    assert again.internal_config.engine_args.max_num_seqs == 4


def test_arts_mcp_submodules_hold_the_same_objects(capsys: pytest.CaptureFixture[str]) -> None:
    import art.mcp.generate_scenarios
    from art.integrations import mcp
    from art.mcp.default_tools import complete_task_tool
    from art.mcp.generate_scenarios import preview_scenarios
    from art.mcp.types import GeneratedScenario, MCPTool

    assert art.mcp.generate_scenarios is mcp.generate_scenarios  # the function, not the module
    assert (GeneratedScenario, MCPTool) == (mcp.GeneratedScenario, mcp.MCPTool)
    assert art.mcp.complete_task_tool is complete_task_tool
    assert complete_task_tool.name == "complete_task"
    assert complete_task_tool.parameters["required"] == ["summary"]
    text = preview_scenarios([{"task": "t" * 130, "difficulty": 2}, {"task": "short"}], n=1)
    assert text == "1. " + "t" * 120 + "...  (difficulty 2/5)"
    assert capsys.readouterr().out == text + "\n"


def test_arts_module_paths_hold_the_same_objects_or_refuse_by_name() -> None:
    import art.auto_trajectory
    import art.batches
    import art.langgraph.llm_wrapper
    import art.local.backend
    import art.model
    import art.pipeline_trainer.checkpoint_retention
    import art.pipeline_trainer.state
    import art.pipeline_trainer.status
    import art.pipeline_trainer.trainer
    import art.pipeline_trainer.types
    import art.yield_trajectory
    from art.integrations import capture, langgraph
    from art.pipeline import retention, status
    from art.utils.format_message import format_message
    from art.utils.log_http_errors import log_http_errors

    assert art.pipeline_trainer.trainer.PipelineTrainer is art.PipelineTrainer
    assert art.pipeline_trainer.types.SingleRolloutFn is art.pipeline_trainer.SingleRolloutFn
    assert art.pipeline_trainer.status.StatusReporter is status.StatusReporter
    assert art.pipeline_trainer.checkpoint_retention.keep_recent_and_top is (
        retention.keep_recent_and_top
    )
    assert art.pipeline_trainer.state.PipelineState.__name__ == "PipelineState"
    assert art.model.TrainableModel is art.TrainableModel
    assert art.local.backend.logger.name == "art.local.backend"
    assert format_message is art.utils.format_message
    assert log_http_errors is art.utils.log_http_errors
    assert art.langgraph.llm_wrapper.wrap_rollout is langgraph.wrap_rollout
    # As in ART, `art.auto_trajectory` and `art.yield_trajectory` are the functions; the
    # modules of those names are reached by their import path.
    auto_module, yield_module = (
        sys.modules["art.auto_trajectory"],
        sys.modules["art.yield_trajectory"],
    )
    assert art.auto_trajectory is capture.auto_trajectory
    assert art.yield_trajectory is capture.yield_trajectory
    assert auto_module.capture_auto_trajectory is capture.capture_auto_trajectory
    assert yield_module.yield_trajectory is capture.yield_trajectory
    # ART's internals behind those paths are refused by name, with what to use instead.
    for refused, says in [
        (art.batches.trajectory_group_batches, "gather_trajectory_groups"),
        (auto_module.patch_httpx, "patches no third-party code"),
        (art.langgraph.llm_wrapper.LoggingLLM, "wrap_rollout records each call"),
        (art.pipeline_trainer.trainer.PIPELINE_STATE_KEY, "pipeline_state.json"),
    ]:
        with pytest.raises(art.NotBuiltError, match=says):
            refused()
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        art.pipeline_trainer.trainer.not_a_name  # noqa: B018


def test_arts_dev_submodules_hold_the_same_config_types(tmp_path: Path) -> None:
    import art.dev.engine
    import art.dev.model
    import art.dev.openai_server
    import art.dev.train
    import art.dev.validate
    from art.dev.get_model_config import get_model_config
    from art.dev.sequence_lengths import max_seq_length_from_model_config

    assert art.dev.model.InternalModelConfig is art.dev.InternalModelConfig
    assert art.dev.model.RolloutWeightsMode is art.dev.RolloutWeightUpdateMode
    assert art.dev.model.SchedulerType.COSINE.value == "cosine"  # transformers' own enum
    assert art.dev.engine.EngineArgs is art.dev.EngineArgs
    assert art.dev.train.TrainSFTConfig is art.dev.TrainSFTConfig
    assert art.dev.openai_server.ServerArgs is art.dev.ServerArgs
    assert art.dev.validate.is_dedicated_mode is art.dev.is_dedicated_mode
    assert get_model_config is art.dev.get_model_config  # the function, not its module
    external = art.dev.VllmRuntimeArgs(mode="external", server_url="http://127.0.0.1:8000/v1")
    assert art.dev.validate.is_external_vllm_mode({"vllm_runtime": external})
    assert art.dev.model.VllmRuntimeArgs is art.dev.VllmRuntimeArgs
    # ART 0.5.23's context length of a model, read from its config (the language model's
    # section of a multimodal one first); the model directory is resolved as training does.
    for name, config, length in [
        ("plain", {"max_position_embeddings": 2048}, 2048),
        ("gpt2", {"n_positions": 1024}, 1024),
        ("vision", {"max_position_embeddings": 77, "text_config": {"seq_length": 4096}}, 4096),
    ]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        assert max_seq_length_from_model_config(str(tmp_path / name)) == length
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "config.json").write_text(json.dumps({"max_position_embeddings": 0}))
    with pytest.raises(art.ConfigError, match="names no context length") as refused:
        max_seq_length_from_model_config(str(tmp_path / "none"))
    assert refused.value.field == "base_model"
