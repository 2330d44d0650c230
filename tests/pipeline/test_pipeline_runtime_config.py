"""ART 0.5.23's `pipeline=PipelineRuntimeConfig(...)` beside ART 0.5.18's direct sizes.

No model is loaded: the trainer is only built, never run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import art
from art.local import LocalBackend
from art.pipeline_trainer import PipelineAutotuneConfig, PipelineRuntimeConfig, PipelineTrainer

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEDICATED = art.dev.InternalModelConfig(trainer_gpu_ids=[], inference_gpu_ids=[])


async def rollout(model: art.TrainableModel, scenario: Any, config: None) -> art.TrajectoryGroup:
    raise AssertionError("never run")


def build(tmp_path: Path, **kwargs: Any) -> PipelineTrainer[Any, None]:
    model = art.TrainableModel(
        name="runtime", project="pipeline", base_model=BASE, _internal_config=DEDICATED
    )
    return PipelineTrainer(model, LocalBackend(path=tmp_path), rollout, [], None, **kwargs)


def sizes(trainer: PipelineTrainer[Any, None]) -> tuple[int, int, int, int]:
    return (
        trainer.num_rollout_workers,
        trainer.min_batch_size,
        trainer.max_batch_size,
        trainer.queue_maxsize,
    )


def test_the_config_is_exported_where_art_exports_it() -> None:
    import art.pipeline_tuner

    assert art.PipelineRuntimeConfig is PipelineRuntimeConfig
    assert art.pipeline_tuner.PipelineRuntimeConfig is PipelineRuntimeConfig


def test_the_config_and_the_direct_sizes_set_the_same_pipeline(tmp_path: Path) -> None:
    config = PipelineRuntimeConfig(
        num_rollout_workers=3, min_batch_size=2, max_batch_size=5, queue_maxsize=7
    )
    by_config = build(tmp_path, pipeline=config)
    direct = build(
        tmp_path, num_rollout_workers=3, min_batch_size=2, max_batch_size=5, queue_maxsize=7
    )
    assert sizes(by_config) == sizes(direct) == (3, 2, 5, 7)
    assert by_config.pipeline == config
    # ART's defaults: 16 workers, batches of 4 to 40 groups, the queue one window of those.
    assert sizes(build(tmp_path))[:3] == (16, 4, 40)
    assert sizes(build(tmp_path, pipeline=PipelineRuntimeConfig()))[:3] == (16, 4, 40)


def test_both_at_once_is_refused_naming_the_direct_size(tmp_path: Path) -> None:
    with pytest.raises(art.ConfigError) as raised:
        build(tmp_path, pipeline=PipelineRuntimeConfig(), min_batch_size=2)
    assert raised.value.field == "min_batch_size"
    assert "pipeline=PipelineRuntimeConfig(min_batch_size=...)" in raised.value.fix


def test_a_config_beside_an_autotuner_or_of_another_type_is_refused(tmp_path: Path) -> None:
    with pytest.raises(art.ConfigError) as raised:
        build(
            tmp_path,
            pipeline=PipelineRuntimeConfig(),
            autotune=PipelineAutotuneConfig(mode="online"),
        )
    assert raised.value.field == "pipeline"
    assert "autotune" in raised.value.fix
    with pytest.raises(art.ConfigError) as raised:
        build(tmp_path, pipeline={"num_rollout_workers": 2})
    assert raised.value.field == "pipeline"
    # An autotuner that is off leaves the config in charge, as in ART.
    off = build(
        tmp_path,
        pipeline=PipelineRuntimeConfig(num_rollout_workers=2),
        autotune=PipelineAutotuneConfig(mode="off"),
    )
    assert off.num_rollout_workers == 2


def test_bad_direct_sizes_are_refused_by_name_before_the_config_is_built(tmp_path: Path) -> None:
    for kwargs, field in [
        ({"max_batch_size": 2}, "max_batch_size"),  # below the default min_batch_size 4
        ({"num_rollout_workers": 0}, "num_rollout_workers"),
        ({"queue_maxsize": 0}, "queue_maxsize"),
    ]:
        with pytest.raises(art.ConfigError) as raised:
            build(tmp_path, **kwargs)
        assert raised.value.field == field
