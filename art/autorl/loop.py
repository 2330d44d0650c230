"""The AutoRL loop: a task description in, a model trained with RULER rewards out.

Everything a run needs to resume lives beside the model's checkpoints:

    autorl/inputs.json        the generated system prompt and train/val inputs
    autorl/base_answers.json  the base model's answer to each validation input
    autorl/evaluations.json   per evaluated step: win rate and scores against the base

The step comes from the checkpoints, so an interrupted run picks up where it stopped.
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.data.arguments import check_at_least
from ..core.data.errors import ConfigError, JudgeError
from ..core.data.trajectories import Trajectory, TrajectoryGroup
from ..core.data.types import Message, TrainConfig
from ..core.gather import gather_trajectory_groups
from ..core.metrics.batch_metrics import group_metrics
from ..core.model import ModelBackend, TrainableModel
from ..core.store.atomic import write_text_atomic
from ..core.store.model_store import ModelStore
from ..ruler.prompt import longest_answer_chars
from .inputs import GeneratedInputs, generate_inputs

logger = logging.getLogger(__name__)

JUDGE_RUBRIC = """\
- An answer that does the task well (correct, relevant, helpful, in the requested
  manner) scores clearly higher than one that does not.
- Among good answers, the clearer and more direct one scores higher.
- Answers that ramble, repeat themselves or drift off topic score lowest."""


@dataclass
class Evaluation:
    """The validation of one step: the current model against the base, input by input."""

    step: int
    win_rate: float  # wins count 1, ties 1/2
    score: float  # mean RULER score of the current model's answers
    base_score: float  # mean RULER score of the base model's answers
    judged: int  # validation inputs the judge scored; the others' samples hold an `error`
    samples: list[dict[str, Any]] = field(default_factory=list)  # input, base, answer, scores


@dataclass
class AutoRLResult:
    """What `train` did: where the run is, the steps, and every evaluation."""

    run_dir: Path
    inputs: GeneratedInputs
    start_step: int
    step: int
    evaluations: list[Evaluation]
    groups_judged: int = 0  # in this run
    groups_with_spread: int = 0  # of those, the ones whose scores differ: GRPO learns from these


@dataclass
class _Models:
    """Where the generator, judge, agent and base model are reached."""

    judge: str
    judge_params: dict[str, Any]
    generator: str
    generator_params: dict[str, Any]


async def train(
    task_description: str,
    base_model: str,
    judge_model: str | None,
    steps: int,
    *,
    backend: ModelBackend,
    path: str | Path,
    project: str = "autorl",
    name: str = "autorl",
    generator_model: str | None = None,
    judge_params: Mapping[str, Any] | None = None,
    generator_params: Mapping[str, Any] | None = None,
    system_prompt: str | None = None,
    num_inputs: int = 16,
    num_val: int = 4,
    groups_per_step: int = 2,
    group_size: int = 4,
    max_tokens: int = 64,
    eval_every: int = 1,
    learning_rate: float = 1e-4,
    rubric: str = JUDGE_RUBRIC,
    seed: int = 0,
) -> AutoRLResult:
    """Train `base_model` on a task described in words, with no data and no labels.

    The generator writes the inputs (once; reused on resume), each step samples
    `groups_per_step` inputs and `group_size` answers to each, RULER scores every
    group, and the model trains. Every `eval_every` steps (and at the last) each
    validation input's current answer is judged side by side with the base model's
    answer to it: `val/win_rate`, `val/reward` (the current model's score) and
    `val/base_score` go to the model's history.

    Args:
        task_description: what the agent should do, in a sentence.
        base_model: the model to train (a Hugging Face id or local directory).
        judge_model: a LiteLLM model name, or None for the base model itself, as the
            backend serves it under its own name.
        steps: train until the model's step reaches this; a run already there only
            evaluates what is missing.
        backend: where the model is served and trained (e.g. `LocalBackend(path)`).
        path: the directory models are stored under (the LocalBackend's `path`); the
            run's own files go to `<path>/<project>/models/<name>/autorl/`.
        generator_model: a LiteLLM model name for the inputs; None for the base model.
        judge_params, generator_params: more `litellm.acompletion` keyword arguments.
    """
    check_at_least(
        steps=(steps, 0),
        num_inputs=(num_inputs, 1),
        num_val=(num_val, 1),
        groups_per_step=(groups_per_step, 1),
        group_size=(group_size, 2),
        max_tokens=(max_tokens, 1),
        eval_every=(eval_every, 1),
    )
    if groups_per_step > num_inputs:
        raise ConfigError(
            "groups_per_step",
            f"{groups_per_step} is more than the {num_inputs} training inputs",
            "Raise num_inputs or lower groups_per_step",
        )

    run_dir = ModelStore(path, project, name).dir / "autorl"
    _check_same_task(run_dir, task_description)  # before the model loads: a mistake fails at once
    model = TrainableModel(name=name, project=project, base_model=base_model)
    await model.register(backend)
    models = _reach(model, judge_model, judge_params, generator_model, generator_params, group_size)

    # The generator's and the judge's costs go into the model's history rows, as ART's
    # `costs/train/...` (and `costs/eval/...` for the evaluations).
    with model.metrics_builder("train").activate_context():
        inputs = await _load_or_generate_inputs(
            run_dir, task_description, models, system_prompt, num_inputs, num_val, seed
        )
        base_answers = await _load_or_answer_base(run_dir, model, inputs, max_tokens)
        evaluations = _load_evaluations(run_dir)

        from tqdm.auto import tqdm

        start_step = step = await model.get_step()
        rng = random.Random(seed * 1_000_003 + step)
        failures = judged = with_spread = 0
        with tqdm(total=steps, initial=min(step, steps), desc="autorl", unit="step") as bar:
            while step < steps:
                chosen = rng.sample(inputs.train, groups_per_step)
                groups = await gather_trajectory_groups(
                    (
                        TrajectoryGroup(
                            _rollout(model, inputs.system_prompt, text, max_tokens)
                            for _ in range(group_size)
                        )
                        for text in chosen
                    ),
                    pbar_desc=f"step {step + 1} rollouts",
                    after_each=lambda group: _score(group, models, rubric),
                )
                if not groups:
                    failures += 1
                    if failures == 3:
                        raise JudgeError(
                            f"{models.judge} could score no group three steps in a row; "
                            "use a stronger judge_model or a larger max_tokens for it"
                        )
                    continue
                failures = 0
                judged += len(groups)
                with_spread += int(group_metrics(groups)["trainable_groups"])
                await model.train(groups, config=TrainConfig(learning_rate=learning_rate))
                step = await model.get_step()
                bar.update(1)
                if step % eval_every == 0 or step == steps:
                    evaluations.append(
                        await _evaluate(
                            model, step, inputs, base_answers, models, rubric, max_tokens
                        )
                    )
                    _save_evaluations(run_dir, evaluations)
        if steps > 0 and step >= steps and not any(e.step == step for e in evaluations):
            # Interrupted after the last step trained and before it was evaluated.
            evaluations.append(
                await _evaluate(model, step, inputs, base_answers, models, rubric, max_tokens)
            )
            _save_evaluations(run_dir, evaluations)
        return AutoRLResult(run_dir, inputs, start_step, step, evaluations, judged, with_spread)


def _reach(
    model: TrainableModel,
    judge_model: str | None,
    judge_params: Mapping[str, Any] | None,
    generator_model: str | None,
    generator_params: Mapping[str, Any] | None,
    group_size: int,
) -> _Models:
    # The backend serves the untrained base model under its own name beside ours.
    local = {"api_base": model.inference_base_url, "api_key": model.inference_api_key}
    base = f"openai/{model.base_model}"
    judge = dict(judge_params or {})
    # Room for RULER's longest answer to a group or to a validation pair: a smaller budget
    # let the default model, repeating itself inside a string, end its JSON unterminated.
    judge.setdefault("max_tokens", longest_answer_chars(max(group_size, 2)))
    if judge_model is None:
        judge = {**local, "temperature": 0.0} | judge
    generator = dict(generator_params or {})
    if generator_model is None:
        generator = local | generator
    return _Models(judge_model or base, judge, generator_model or base, generator)


def _check_same_task(run_dir: Path, task_description: str) -> None:
    """A run resumes only with the task it was started with (its inputs were written for it)."""
    file = run_dir / "inputs.json"
    if not file.exists():
        return
    inputs = GeneratedInputs.from_json(file.read_text(encoding="utf-8"))
    if inputs.task_description != task_description.strip():
        raise ConfigError(
            "task_description",
            f"differs from the one this run was started with ({inputs.task_description!r})",
            f"Resume with the same task, or start a new run (another name or path than {run_dir.parent})",
        )


async def _load_or_generate_inputs(
    run_dir: Path,
    task_description: str,
    models: _Models,
    system_prompt: str | None,
    num_inputs: int,
    num_val: int,
    seed: int,
) -> GeneratedInputs:
    file = run_dir / "inputs.json"
    if file.exists():  # written for this task: `train` checked it before the model loaded
        return GeneratedInputs.from_json(file.read_text(encoding="utf-8"))
    inputs = await generate_inputs(
        task_description,
        num_inputs,
        generator_model=models.generator,
        extra_litellm_params=models.generator_params,
        system_prompt=system_prompt,
        num_val=num_val,
        seed=seed,
        progress=True,
    )
    write_text_atomic(file, inputs.to_json())
    return inputs


async def _load_or_answer_base(
    run_dir: Path, model: TrainableModel, inputs: GeneratedInputs, max_tokens: int
) -> dict[str, str]:
    file = run_dir / "base_answers.json"
    answers: dict[str, str] = {}
    if file.exists():
        answers = json.loads(file.read_text(encoding="utf-8"))
    missing = [text for text in inputs.val if text not in answers]
    if missing:
        client = model.openai_client()
        for text in missing:
            completion = await client.chat.completions.create(
                model=model.base_model,  # the base, served under its own name
                messages=_messages(inputs.system_prompt, text),
                max_tokens=max_tokens,
                temperature=0.0,
            )
            answers[text] = completion.choices[0].message.content or ""
        write_text_atomic(file, json.dumps(answers, indent=2, ensure_ascii=False) + "\n")
    return answers


def _messages(system_prompt: str, text: str) -> list[Message]:
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": text}]


def _answered(prompt: list[Message], answer: str) -> list[Message]:
    return [*prompt, {"role": "assistant", "content": answer}]


async def _rollout(
    model: TrainableModel, system_prompt: str, text: str, max_tokens: int
) -> Trajectory:
    trajectory = Trajectory(
        messages_and_choices=list(_messages(system_prompt, text)),
        metadata={"input": text},
    )
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(),
        messages=trajectory.messages(),
        max_tokens=max_tokens,
        temperature=1.0,
    )
    trajectory.messages_and_choices.append(completion.choices[0])
    return trajectory


async def _score(group: TrajectoryGroup, models: _Models, rubric: str) -> TrajectoryGroup | None:
    from ..rewards import ruler_score_group

    return await ruler_score_group(
        group, models.judge, models.judge_params, rubric, swallow_exceptions=True
    )


async def _evaluate(
    model: TrainableModel,
    step: int,
    inputs: GeneratedInputs,
    base_answers: dict[str, str],
    models: _Models,
    rubric: str,
    max_tokens: int,
) -> Evaluation:
    """Judge the current model's answer to each validation input beside the base's."""
    from ..rewards import ruler

    client = model.openai_client()
    wins: list[float] = []
    scores: list[float] = []
    base_scores: list[float] = []
    samples: list[dict[str, Any]] = []
    groups: list[TrajectoryGroup] = []
    for index, text in enumerate(inputs.val):
        completion = await client.chat.completions.create(
            model=model.get_inference_name(step),
            messages=_messages(inputs.system_prompt, text),
            max_tokens=max_tokens,
            temperature=0.0,
        )
        answer = completion.choices[0].message.content or ""
        prompt = _messages(inputs.system_prompt, text)
        pair = [_answered(prompt, base_answers[text]), _answered(prompt, answer)]
        base_first = index % 2 == 0  # alternate the order so position bias cancels out
        try:
            with model.metrics_builder("eval").activate_context():
                judged = await ruler(
                    pair if base_first else pair[::-1],
                    models.judge,
                    models.judge_params,
                    rubric,
                )
        except ConfigError:
            raise
        except Exception as error:
            # An unreachable judge, or one that answered unusably twice (a JudgeError), leaves
            # this input unjudged, as a group RULER could not score leaves a training step: the
            # step's checkpoint is written, so one bad answer must not end the run. A judge
            # that can score nothing stops the run in training (three steps in a row).
            logger.warning("AutoRL step %d: input %d left unjudged: %s", step, index, error)
            samples.append(
                {"input": text, "base": base_answers[text], "answer": answer, "error": str(error)}
            )
            continue
        base, current = (
            (judged[0].score, judged[1].score) if base_first else (judged[1].score, judged[0].score)
        )
        wins.append(1.0 if current > base else 0.5 if current == base else 0.0)
        scores.append(current)
        base_scores.append(base)
        samples.append(
            {
                "input": text,
                "base": base_answers[text],
                "answer": answer,
                "score": current,
                "base_score": base,
            }
        )
        groups.append(
            TrajectoryGroup(
                [
                    Trajectory(
                        messages_and_choices=pair[1],
                        reward=current,
                        metrics={"win": wins[-1], "base_score": base},
                    )
                ]
            )
        )
    evaluation = Evaluation(
        step=step,
        win_rate=_mean(wins),
        score=_mean(scores),
        base_score=_mean(base_scores),
        judged=len(wins),
        samples=samples,
    )
    metrics = {
        "win_rate": evaluation.win_rate,
        "base_score": evaluation.base_score,
        "judged": float(len(wins)),
    }
    await model.log(groups or None, split="val", metrics=metrics, step=step)
    return evaluation


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _load_evaluations(run_dir: Path) -> list[Evaluation]:
    file = run_dir / "evaluations.json"
    if not file.exists():
        return []
    return [Evaluation(**row) for row in json.loads(file.read_text(encoding="utf-8"))]


def _save_evaluations(run_dir: Path, evaluations: list[Evaluation]) -> None:
    rows = [asdict(evaluation) for evaluation in evaluations]
    write_text_atomic(
        run_dir / "evaluations.json", json.dumps(rows, indent=2, ensure_ascii=False) + "\n"
    )
