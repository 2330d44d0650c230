"""`MetricsBuilder`: the step's costs, timings and data counts, with running totals.

ART's `art.metrics`. A builder collects metrics between two logs of a model and hands
them over when the model logs (`flush`); `model.metrics_builder()` is the model's.

    token = model.activate_metrics_context("train")  # RULER and track_api_cost record here
    ...
    await model.log(groups, split="train")           # the row holds the step's costs

Names (ART's):
    costs/<context>/<source>     US dollars spent in the step (`costs/train/judge/ruler`)
    costs/<context>, costs/all   the step's costs summed per context, and over all
    <section>/step_<name>        a step's time (`time/step_wall_s`) or data count
    <section>/cum/<name>         the running total of each `costs/`, `time/` and `data/`
                                 key over every flush (`costs/cum/all`)
    data/cum/num_unique_scenarios  distinct scenario ids seen so far
    throughput/avg_trainer_tok_per_s, throughput/avg_rollout_tok_per_s
                                 running token totals over running time totals

Builders made by `for_cost_context` share running totals and registries with the one
they came from; each buffer scope (`train`, `eval`, ...) holds its own pending step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any, Literal, Unpack

import pydantic

from ..data.errors import ArtValueError
from .api_costs import (
    CostExtractor,
    PriceOverrides,
    TokenPricing,
    check_price_overrides,
    extract_api_cost,
    normalize_model_name,
    normalize_provider,
)

_active_builder: ContextVar[MetricsBuilder] = ContextVar("art_active_metrics_builder")

# Sections whose keys get a running total under `<section>/cum/`.
_CUMULATIVE_SECTIONS = frozenset({"costs", "time", "data"})
# A ratio whose running value is recomputed from running totals, never summed.
_CAPACITY_RATIO = "data/step_unused_and_dummy_ratio"


class MetricDefinition(pydantic.BaseModel):
    """What a metric means: its key, title, description, kind, unit and direction."""

    model_config = pydantic.ConfigDict(extra="forbid")  # a misspelt field is an error

    key: str
    title: str
    description: str
    kind: Literal["counter", "duration", "gauge", "rate", "ratio", "score"]
    unit: str | None = None
    higher_is_better: bool | None = None
    dashboard_default: bool = False
    score_component: bool = False


def _define(
    key: str,
    title: str,
    description: str,
    kind: Literal["counter", "duration", "gauge", "rate", "ratio", "score"],
    unit: str | None = None,
    better: bool | None = None,
    *,
    dashboard: bool = False,
    score: bool = False,
) -> MetricDefinition:
    return MetricDefinition(
        key=key,
        title=title,
        description=description,
        kind=kind,
        unit=unit,
        higher_is_better=better,
        dashboard_default=dashboard,
        score_component=score,
    )


_TOK = "tokens"
_TPS = "tok/s"
_REQ = "requests"

# The metrics ART's PipelineTrainer dashboards define (ART 0.5.23's keys and flags; the
# descriptions are ours). `score` marks the parts of `objective/score`.
PIPELINE_RL_METRIC_DEFINITIONS: tuple[MetricDefinition, ...] = (
    _define(
        "objective/score",
        "Score",
        "accepted train tokens per second, discounted for staleness and batch shape",
        "score",
        None,
        True,
        dashboard=True,
        score=True,
    ),
    _define(
        "sample_efficiency/freshness_discount",
        "Freshness discount",
        "one over the token-weighted mean of exp(policy age in steps / 8)",
        "ratio",
        None,
        True,
        score=True,
    ),
    _define(
        "sample_efficiency/batch_factor",
        "Batch factor",
        "how the accepted groups and rollouts per group compare with the reference batch",
        "ratio",
        None,
        True,
        score=True,
    ),
    _define(
        "offpolicy/token_weighted_policy_age_steps",
        "Token-weighted policy age",
        "mean age in train steps of the policy that sampled the accepted tokens",
        "gauge",
        "steps",
        False,
        score=True,
    ),
    _define(
        "throughput/accepted_train_tok_per_s",
        "Accepted train tokens per second",
        "accepted trainable tokens over the step's wall time",
        "rate",
        _TPS,
        True,
        dashboard=True,
        score=True,
    ),
    _define(
        "data/step_trainable_assistant_tokens",
        "Accepted assistant tokens",
        "trainable assistant tokens in the step's accepted groups",
        "counter",
        _TOK,
        score=True,
    ),
    _define(
        "data/step_nonpadding_logical_tokens",
        "Non-padding logical train tokens",
        "tokens in the step's micro-batches, padding left out",
        "counter",
        _TOK,
    ),
    _define(
        "data/step_loss_bearing_tokens",
        "Loss-bearing train tokens",
        "token positions that contribute to the loss",
        "counter",
        _TOK,
    ),
    _define(
        "data/step_executed_token_equivalents",
        "Executed token-equivalents",
        "token extents executed over all ranks, padding and dummy batches included",
        "counter",
        _TOK,
    ),
    _define(
        "data/step_nominal_schedule_capacity_tokens",
        "Nominal schedule capacity",
        "packed-row capacity as configured",
        "counter",
        _TOK,
    ),
    _define(
        "data/step_dummy_executed_token_equivalents",
        "Executed dummy token-equivalents",
        "token-equivalents spent on pipeline dummy micro-batches",
        "counter",
        _TOK,
        False,
    ),
    _define(
        "data/step_dummy_schedule_capacity_tokens",
        "Dummy schedule capacity",
        "capacity given to pipeline dummy micro-batches",
        "counter",
        _TOK,
        False,
    ),
    _define(
        "data/step_unused_packed_capacity_tokens",
        "Unused packed capacity",
        "real micro-batch capacity left empty",
        "counter",
        _TOK,
        False,
    ),
    _define(
        "data/step_unused_and_dummy_ratio",
        "Unused and dummy capacity ratio",
        "empty plus dummy capacity over the nominal capacity",
        "ratio",
        None,
        False,
        dashboard=True,
    ),
    _define(
        "throughput/train_nonpadding_logical_tok_per_s",
        "Logical train tokens per second",
        "non-padding tokens over training time",
        "rate",
        _TPS,
        True,
        dashboard=True,
    ),
    _define(
        "throughput/train_loss_bearing_tok_per_s",
        "Loss-bearing train tokens per second",
        "loss-bearing tokens over training time",
        "rate",
        _TPS,
        True,
    ),
    _define(
        "throughput/train_executed_tok_equiv_per_s",
        "Executed token-equivalents per second",
        "executed token-equivalents over training time",
        "rate",
        _TPS,
        True,
        dashboard=True,
    ),
    _define(
        "throughput/train_nominal_capacity_tok_per_s",
        "Nominal schedule capacity per second",
        "nominal capacity over training time",
        "rate",
        _TPS,
        True,
    ),
    _define(
        "loss/importance_ratio_mean",
        "Importance ratio mean",
        "mean importance-sampling ratio on trainable tokens",
        "ratio",
    ),
    _define(
        "loss/importance_ratio_p95",
        "Importance ratio p95",
        "95th percentile of the importance ratio (from a histogram)",
        "ratio",
        None,
        False,
    ),
    _define(
        "loss/importance_ratio_p99",
        "Importance ratio p99",
        "99th percentile of the importance ratio (from a histogram)",
        "ratio",
        None,
        False,
    ),
    _define(
        "loss/clipped_token_fraction",
        "Clipped token fraction",
        "share of trainable tokens whose ratio falls outside the clip range",
        "ratio",
        None,
        False,
    ),
    _define(
        "vllm/prompt_tok_per_s",
        "vLLM prompt tokens per second",
        "prefill throughput",
        "rate",
        _TPS,
        True,
        dashboard=True,
    ),
    _define(
        "vllm/completion_tok_per_s",
        "vLLM completion tokens per second",
        "decode throughput",
        "rate",
        _TPS,
        True,
        dashboard=True,
    ),
    _define(
        "vllm/num_requests_running",
        "vLLM running requests",
        "requests being decoded",
        "gauge",
        _REQ,
        dashboard=True,
    ),
    _define(
        "vllm/num_requests_waiting",
        "vLLM waiting requests",
        "requests queued for admission",
        "gauge",
        _REQ,
        dashboard=True,
    ),
    _define(
        "vllm/num_requests_waiting_capacity",
        "vLLM capacity-waiting requests",
        "requests queued because capacity ran out",
        "gauge",
        _REQ,
        False,
        dashboard=True,
    ),
    _define(
        "vllm/max_num_seqs",
        "vLLM max running sequences",
        "configured sequences per scheduler iteration",
        "gauge",
        _REQ,
    ),
    _define(
        "vllm/world_size", "vLLM GPU world size", "GPU ranks serving the model", "gauge", "ranks"
    ),
    _define(
        "vllm/max_num_batched_tokens",
        "vLLM max batched tokens",
        "configured tokens per scheduler iteration",
        "gauge",
        _TOK,
    ),
    _define(
        "vllm/max_num_scheduled_tokens",
        "vLLM max scheduled tokens",
        "configured scheduled tokens per iteration",
        "gauge",
        _TOK,
    ),
    _define(
        "vllm/max_model_len", "vLLM max model length", "configured longest sequence", "gauge", _TOK
    ),
    _define(
        "vllm/prefix_cache_hit_rate",
        "vLLM prefix cache hit rate",
        "prefix-cache hits over queries since the last reading",
        "ratio",
        None,
        True,
        dashboard=True,
    ),
    _define(
        "vllm/kv_cache_usage_perc",
        "vLLM KV cache usage",
        "share of KV-cache blocks in use",
        "ratio",
    ),
    _define(
        "vllm/num_preemptions_total",
        "vLLM preemptions",
        "requests preempted so far",
        "counter",
        None,
        False,
    ),
    _define(
        "queue/freshness_pressure",
        "Queue freshness pressure",
        "predicted age of queued groups over the off-policy limit",
        "ratio",
        None,
        False,
    ),
    _define(
        "queue/predicted_stale_fraction",
        "Predicted stale queue fraction",
        "share of queued groups expected to be stale next step",
        "ratio",
        None,
        False,
    ),
    _define(
        "queue/actual_stale_fraction",
        "Actual stale dequeue fraction",
        "share of the step's dequeued groups that were stale",
        "ratio",
        None,
        False,
    ),
    _define(
        "queue/put_wait_frac",
        "Completed queue wait fraction",
        "time waiting to enqueue over that time plus rollout time",
        "ratio",
        None,
        False,
    ),
    _define(
        "queue/put_wait_s",
        "Completed queue wait",
        "worker seconds spent waiting to enqueue finished groups",
        "duration",
        "seconds",
        False,
    ),
)
"""ART's definitions of a pipelined RL run's metrics: key, title, meaning, kind, unit."""

PIPELINE_RL_DASHBOARD_DEFAULT_METRICS: tuple[str, ...] = tuple(
    d.key for d in PIPELINE_RL_METRIC_DEFINITIONS if d.dashboard_default
)
"""The keys of the definitions ART's dashboards show by default."""

PIPELINE_RL_SCORE_METRICS: tuple[str, ...] = tuple(
    d.key for d in PIPELINE_RL_METRIC_DEFINITIONS if d.score_component
)
"""The keys of the definitions that make up ART's `objective/score`."""


def is_cumulative_metric_key(key: str) -> bool:
    """Whether `key` is a running total (`<section>/cum/...`)."""
    parts = key.split("/", 2)
    return len(parts) >= 2 and parts[1] == "cum"


def is_builder_managed_metric(key: str) -> bool:
    """Whether a logged `key` belongs to the builder (costs, step times, step data)."""
    return key.startswith(("costs/", "time/step_", "data/step_"))


def to_cumulative_metric_key(key: str) -> str:
    """The running-total key of a step key: `time/step_wall_s` -> `time/cum/wall_s`."""
    if is_cumulative_metric_key(key):
        raise ArtValueError("key", f"{key!r} is already a running total", "Pass a step key")
    if "/" not in key:
        raise ArtValueError("key", f"{key!r} has no section", "Use '<section>/<name>'")
    section, rest = key.split("/", 1)
    return f"{section}/cum/{rest.removeprefix('step_')}"


@dataclass
class _Pending:
    values: dict[str, float] = field(default_factory=dict)
    scenario_ids: set[str] = field(default_factory=set)


@dataclass
class _Shared:
    # A thread lock, not an asyncio one: nothing awaits while it is held, and a model's
    # builder outlives event loops (one `asyncio.run` per step in scripts).
    lock: threading.Lock = field(default_factory=threading.Lock)
    pending: dict[str, _Pending] = field(default_factory=dict)
    cumulative: dict[str, float] = field(default_factory=dict)
    scenario_ids: set[str] = field(default_factory=set)
    cost_extractors: dict[str, CostExtractor] = field(default_factory=dict)
    model_pricing: dict[str, TokenPricing] = field(default_factory=dict)

    # A model is copied and pickled (to Ray actors, by `model_copy(deep=True)`) with its
    # builder; a lock cannot be, so each copy gets a fresh one.
    def __getstate__(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if key != "lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, lock=threading.Lock())


def _nonempty(value: str, name: str, example: str) -> str:
    stripped = value.strip()
    if not stripped:
        raise ArtValueError(name, "is empty", f"Name it, e.g. {example!r}")
    return stripped


def _alias(new: float | None, old: float | None, new_name: str, old_name: str) -> float | None:
    if new is not None and old is not None:
        raise ArtValueError(
            old_name,
            f"is given along with {new_name}, the same value under ART 0.5.23's name",
            f"Pass only {new_name}",
        )
    return new if new is not None else old


class MetricsBuilder:
    """Collects a step's metrics (costs first) and adds running totals when flushed."""

    def __init__(
        self,
        cost_context: str,
        *,
        _shared_state: _Shared | None = None,
        _buffer_scope: str | None = None,
    ) -> None:
        if not isinstance(cost_context, str) or not cost_context.strip():
            raise ArtValueError("cost_context", "is empty", "Name it, e.g. 'train' or 'eval'")
        self.cost_context = cost_context
        self._buffer_scope = cost_context if _buffer_scope is None else _buffer_scope
        self._shared = _Shared() if _shared_state is None else _shared_state

    # --- recording ------------------------------------------------------------------------

    def add_cost(self, path: str, usd: float) -> None:
        """Add `usd` dollars to `costs/<path>` (e.g. `train/judge/ruler`)."""
        if not path:
            raise ArtValueError("path", "is empty", "Name the cost, e.g. 'train/judge/ruler'")
        self.add_metric(f"costs/{path}", float(usd))

    def add_response_cost(
        self,
        source: str,
        response: Any,
        *,
        provider: str,
        model_name: str,
        **price_overrides: Unpack[PriceOverrides],
    ) -> float | None:
        """Price an API `response` (`art.api_costs.extract_api_cost`) and add it as
        `costs/<cost_context>/<source>`; returns the cost. An unpriceable call raises
        `CostUnavailableError`."""
        check_price_overrides("add_response_cost", price_overrides)
        normalized_source = source.strip("/")
        if not normalized_source:
            raise ArtValueError("source", "is empty", "Name the source, e.g. 'judge/ruler'")
        cost = extract_api_cost(
            response,
            provider=provider,
            model_name=model_name,
            cost_extractors=self._shared.cost_extractors,
            model_pricing=self._shared.model_pricing,
            **price_overrides,
        )
        if cost is None:
            return None
        self.add_cost(f"{self.cost_context}/{normalized_source}", cost)
        return cost

    def add_metric(self, key: str, value: float) -> None:
        """Add `value` to the step's `key` (`<section>/<name>`); repeated adds sum."""
        if "/" not in key:
            raise ArtValueError(
                "key", f"{key!r} has no section", "Prefix it, e.g. 'time/step_eval_s'"
            )
        if is_cumulative_metric_key(key):
            raise ArtValueError(
                "key",
                f"{key!r} is in the running-total namespace ('<section>/cum/')",
                "Log the step's value; the builder keeps the running total",
            )
        with self._shared.lock:
            values = self._pending().values
            for existing in values:
                if existing.startswith(f"{key}/") or key.startswith(f"{existing}/"):
                    raise ArtValueError(
                        "key",
                        f"{key!r} and {existing!r} would both be leaves, one inside the other",
                        "Log costs at the leaves only: their parents are summed for you",
                    )
            values[key] = values.get(key, 0.0) + float(value)

    def add_data(
        self,
        step_num_scenarios: int | None = None,
        step_rollout_tokens: int | None = None,
        scenario_ids: list[str] | None = None,
        *,
        step_actor_tokens: int | None = None,
    ) -> None:
        """Add the step's scenario count, rollout tokens and scenario ids (which feed
        `data/cum/num_unique_scenarios`). `step_actor_tokens` is ART 0.5.18's name of
        `step_rollout_tokens`."""
        tokens = _alias(
            step_rollout_tokens, step_actor_tokens, "step_rollout_tokens", "step_actor_tokens"
        )
        if step_num_scenarios is not None:
            self.add_metric("data/step_num_scenarios", float(step_num_scenarios))
        if tokens is not None:
            self.add_metric("data/step_rollout_tokens", float(tokens))
        if scenario_ids is not None:
            with self._shared.lock:
                self._pending().scenario_ids.update(str(i) for i in scenario_ids)

    def add_user_timing(
        self,
        step_wall_s: float | None = None,
        step_rollout_s: float | None = None,
        step_eval_s: float | None = None,
        *,
        step_actor_s: float | None = None,
    ) -> None:
        """Add the step's wall, rollout and eval seconds (`time/step_*`). `step_actor_s` is
        ART 0.5.18's name of `step_rollout_s`."""
        rollout = _alias(step_rollout_s, step_actor_s, "step_rollout_s", "step_actor_s")
        for key, value in (
            ("time/step_wall_s", step_wall_s),
            ("time/step_rollout_s", rollout),
            ("time/step_eval_s", step_eval_s),
        ):
            if value is not None:
                self.add_metric(key, float(value))

    def add_idle_times(
        self,
        step_trainer_idle_s: float | None = None,
        step_rollout_idle_s: float | None = None,
        *,
        step_actor_idle_s: float | None = None,
    ) -> None:
        """Add the seconds the trainer and the rollouts sat idle (`time/step_*_idle_s`).
        `step_actor_idle_s` is ART 0.5.18's name of `step_rollout_idle_s`."""
        rollout = _alias(
            step_rollout_idle_s, step_actor_idle_s, "step_rollout_idle_s", "step_actor_idle_s"
        )
        if step_trainer_idle_s is not None:
            self.add_metric("time/step_trainer_idle_s", float(step_trainer_idle_s))
        if rollout is not None:
            self.add_metric("time/step_rollout_idle_s", float(rollout))

    @contextmanager
    def measure(self, key: str) -> Iterator[None]:
        """Add the seconds the `with` block took to `key`."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.add_metric(key, time.monotonic() - started)

    # --- handing over ---------------------------------------------------------------------

    async def flush(self) -> dict[str, float]:
        """The step's metrics with cost roll-ups and running totals; the step starts over."""
        with self._shared.lock:
            pending = self._pending()
            result = dict(pending.values)
            result.update(
                _cost_rollups({k: v for k, v in result.items() if k.startswith("costs/")})
            )
            running = self._shared.cumulative
            for key, value in list(result.items()):
                if key.split("/", 1)[0] in _CUMULATIVE_SECTIONS and key != _CAPACITY_RATIO:
                    cum_key = to_cumulative_metric_key(key)
                    running[cum_key] = running.get(cum_key, 0.0) + value
                    result[cum_key] = running[cum_key]
            if _CAPACITY_RATIO in result:
                nominal = running.get("data/cum/nominal_schedule_capacity_tokens", 0.0)
                wasted = running.get("data/cum/unused_packed_capacity_tokens", 0.0) + running.get(
                    "data/cum/dummy_schedule_capacity_tokens", 0.0
                )
                cum_key = to_cumulative_metric_key(_CAPACITY_RATIO)
                running[cum_key] = result[cum_key] = wasted / nominal if nominal else 0.0
            if pending.scenario_ids:
                self._shared.scenario_ids.update(pending.scenario_ids)
                result["data/cum/num_unique_scenarios"] = float(len(self._shared.scenario_ids))
            self._add_throughput(result)
            pending.values.clear()
            pending.scenario_ids.clear()
            return result

    async def drain_pending(self) -> dict[str, float]:
        """The step's raw values, without roll-ups or running totals; the step starts over.
        (For handing a step across a process boundary to a builder that flushes it.)"""
        with self._shared.lock:
            pending = self._pending()
            result = dict(pending.values)
            pending.values.clear()
            pending.scenario_ids.clear()
            return result

    # --- the active builder ---------------------------------------------------------------

    def activate(self) -> Token[MetricsBuilder]:
        """Make this the builder costs are recorded into, in this context; reset with
        `token.var.reset(token)`."""
        return _active_builder.set(self)

    @contextmanager
    def activate_context(self) -> Iterator[MetricsBuilder]:
        """`activate` for the `with` block."""
        token = self.activate()
        try:
            yield self
        finally:
            token.var.reset(token)

    @staticmethod
    def get_active() -> MetricsBuilder:
        """The active builder; LookupError where none is."""
        return _active_builder.get()

    def for_cost_context(
        self, cost_context: str, *, buffer_scope: str | None = None
    ) -> MetricsBuilder:
        """A builder recording costs under `cost_context` (and pending values under
        `buffer_scope`, default the context) that shares this one's totals and registries."""
        context = _nonempty(cost_context, "cost_context", "train")
        scope = context if buffer_scope is None else _nonempty(buffer_scope, "buffer_scope", "eval")
        if context == self.cost_context and scope == self._buffer_scope:
            return self
        return MetricsBuilder(context, _shared_state=self._shared, _buffer_scope=scope)

    # --- pricing --------------------------------------------------------------------------

    def register_cost_extractor(self, provider: str, extractor: CostExtractor) -> None:
        """Price `provider`'s responses with `extractor(response) -> dollars | None`."""
        name = normalize_provider(provider)
        if name is None:
            raise ArtValueError("provider", "is empty", "Name the provider, e.g. 'openrouter'")
        self._shared.cost_extractors[name] = extractor

    def register_model_pricing(
        self,
        model_name: str,
        *,
        prompt_per_million: float,
        completion_per_million: float,
        cached_prompt_per_million: float | None = None,
        cache_creation_per_million: float | None = None,
        cache_read_per_million: float | None = None,
    ) -> None:
        """Price `model_name` (as the calls name it) in US dollars per million tokens,
        ahead of the shipped tables."""
        name = normalize_model_name(model_name)
        if name is None:
            raise ArtValueError("model_name", "is empty", "Name the model as calls name it")

        def optional(value: float | None) -> float | None:
            return None if value is None else float(value)

        self._shared.model_pricing[name] = TokenPricing(
            prompt_per_million=float(prompt_per_million),
            completion_per_million=float(completion_per_million),
            cached_prompt_per_million=optional(cached_prompt_per_million),
            cache_creation_per_million=optional(cache_creation_per_million),
            cache_read_per_million=optional(cache_read_per_million),
        )

    # --- persistence ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The running totals and scenario ids, as JSON-ready data."""
        with self._shared.lock:
            return {
                "cum_state": dict(self._shared.cumulative),
                "unique_scenario_ids": sorted(self._shared.scenario_ids),
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`'s running totals and scenario ids; pending steps are dropped."""
        cumulative = {str(k): float(v) for k, v in state.get("cum_state", {}).items()}
        scenario_ids = {str(v) for v in state.get("unique_scenario_ids", [])}
        with self._shared.lock:
            self._shared.cumulative.clear()
            self._shared.cumulative.update(cumulative)
            self._shared.scenario_ids.clear()
            self._shared.scenario_ids.update(scenario_ids)
            self._shared.pending.clear()

    def continue_totals(self, state: dict[str, Any]) -> bool:
        """Take `state_dict()`'s running totals and scenario ids where this builder has
        none yet (a new process continuing a run); what is pending is kept. Returns
        whether it took them."""
        cumulative = {str(k): float(v) for k, v in state.get("cum_state", {}).items()}
        scenario_ids = {str(v) for v in state.get("unique_scenario_ids", [])}
        with self._shared.lock:
            if self._shared.cumulative or self._shared.scenario_ids:
                return False
            self._shared.cumulative.update(cumulative)
            self._shared.scenario_ids.update(scenario_ids)
            return True

    # --- internals ------------------------------------------------------------------------

    def _pending(self) -> _Pending:
        return self._shared.pending.setdefault(self._buffer_scope, _Pending())

    def _add_throughput(self, result: dict[str, float]) -> None:
        running = self._shared.cumulative
        for step_keys, tokens_key, seconds_key, out in (
            (
                ("data/step_trainable_assistant_tokens", "time/step_backend_train_s"),
                "data/cum/trainable_assistant_tokens",
                "time/cum/backend_train_s",
                "throughput/avg_trainer_tok_per_s",
            ),
            (
                ("data/step_rollout_tokens", "time/step_rollout_s"),
                "data/cum/rollout_tokens",
                "time/cum/rollout_s",
                "throughput/avg_rollout_tok_per_s",
            ),
        ):
            if not any(key in result for key in step_keys):
                continue
            tokens, seconds = running.get(tokens_key), running.get(seconds_key)
            if tokens is not None and seconds is not None and seconds > 0:
                result[out] = tokens / seconds


def _cost_rollups(costs: dict[str, float]) -> dict[str, float]:
    """Each parent of a cost leaf as the sum of its leaves, and `costs/all`."""
    if not costs:
        return {}
    parents = {
        "/".join(parts[:depth])
        for parts in (key.split("/") for key in costs)
        for depth in range(2, len(parts))
    }
    rollups = {
        parent: sum(value for key, value in costs.items() if key.startswith(f"{parent}/"))
        for parent in parents
    }
    top_level = {"costs/" + key.split("/")[1] for key in costs}
    rollups["costs/all"] = sum(rollups.get(key, costs.get(key, 0.0)) for key in top_level)
    return rollups


__all__ = [
    "PIPELINE_RL_DASHBOARD_DEFAULT_METRICS",
    "PIPELINE_RL_METRIC_DEFINITIONS",
    "PIPELINE_RL_SCORE_METRICS",
    "MetricDefinition",
    "MetricsBuilder",
    "is_builder_managed_metric",
    "is_cumulative_metric_key",
    "to_cumulative_metric_key",
]
