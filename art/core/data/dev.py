"""Advanced configuration: GRPO knobs and how a model is loaded, served and trained.

Every class is frozen and rejects unknown fields, so a typo is an error at the line
that made it rather than a setting silently ignored; a bad value or key raises
`ConfigError` naming it (and, for a key of ART's own config dicts, what to use here).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Required, Self

from pydantic import ConfigDict, Field, field_validator, model_validator
from typing_extensions import TypedDict

from .config_errors import ConfigModel

RolloutWeightUpdateMode = Literal["step_lora", "in_flight_lora"]
"""ART 0.5.23's `InternalModelConfig.rollout_weight_update_mode` values ('step_lora' here)."""


class _Config(ConfigModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _OptimizerStep(_Config):
    """How one optimizer step runs, for RL and SFT alike."""

    max_grad_norm: float = Field(
        default=1.0, gt=0, description="Clip the global gradient norm to this value."
    )
    gradient_accumulation_sequences: int | None = Field(
        default=None,
        ge=1,
        description="Most sequences packed into one forward/backward pass; None: as many "
        "as the token budget of a micro-batch holds (set by the memory budget). Each call "
        "(or SFT batch) is still one optimizer step.",
    )


class TrainConfig(_OptimizerStep):
    """The GRPO objective of a training step (`model.train(..., _config=...)`)."""

    scale_rewards: bool = Field(
        default=True,
        description="Divide each group's advantages by the group's reward standard deviation.",
    )
    ppo: bool = Field(
        default=False,
        description="Use PPO's clipped objective; the default is CISPO's clipped importance "
        "weight times the log-probability (arXiv:2506.13585).",
    )
    epsilon: float = Field(
        default=0.2, gt=0, description="Lower clip range of the importance ratio (1 - epsilon)."
    )
    epsilon_high: float | None = Field(
        default=None,
        gt=0,
        description="Upper clip range (1 + epsilon_high); None uses `epsilon` (DAPO's "
        "clip-higher when larger, arXiv:2503.14476).",
    )
    importance_sampling_level: Literal["token", "sequence", "average", "geometric_average"] = Field(
        default="token",
        description="Importance ratio per token, one per sequence as in GSPO "
        "(arXiv:2507.18071), or the arithmetic or geometric mean of the two (ART's).",
    )
    max_negative_advantage_importance_sampling_weight: float | None = Field(
        default=None,
        gt=0,
        description="Cap the importance ratio at this value (ART's name; as in ART it caps "
        "every token's ratio). None: no cap.",
    )
    mask_prob_ratio: bool = Field(
        default=False,
        description="Zero the importance ratio of tokens outside the clip range, so they "
        "take no gradient (ART's).",
    )
    kimi_k2_tau: float | None = Field(
        default=None,
        description="Subtract tau times each token's policy/sampler log-ratio from its "
        "advantage (Kimi K2, arXiv:2507.20534; ART's). None: off.",
    )
    allow_training_without_logprobs: bool = Field(
        default=False,
        description="Also train assistant turns given as plain dicts (re-encoded, with no "
        "sampler logprobs, so the ratio is taken against the current policy).",
    )
    advantage_balance: float = Field(
        default=0.0,
        ge=-1.0,
        le=1.0,
        description="Shift weight between negative and positive advantages (ART's): above 0 "
        "each negative advantage is multiplied by 1 - balance (1: only rewarded answers "
        "train), below 0 each positive one by 1 + balance.",
    )
    precalculate_logprobs: bool = Field(
        default=False,
        description="Take the importance ratio against the trainer's own logprobs of the "
        "sampled tokens before the step, not the sampler's (ART's); the sampler's then "
        "enter only through truncated_importance_sampling.",
    )
    truncated_importance_sampling: float | None = Field(
        default=None,
        gt=0,
        description="Multiply each token's loss by its importance weight capped at this "
        "bound (truncated importance sampling, Yao et al. 2025, 'Your efficient RL framework "
        "secretly brings you off-policy RL training'; ART's): with precalculate_logprobs "
        "the weight is trainer/sampler, else the policy's ratio to the sampler. None: off.",
    )
    kl_ref_adapter_path: str | None = Field(
        default=None,
        description="A LoRA adapter directory (of this base model) whose policy is the "
        "reference of the KL terms (kl_penalty_coef, beta) in place of the base model "
        "(ART's; backend.train's kl_penalty_reference_step names one of the model's own "
        "checkpoints). None: the base model.",
    )
    num_trajectories_learning_rate_multiplier_power: float = Field(
        default=0.0,
        description="Multiply the step's learning rate by the number of trajectories it "
        "trains raised to this power (ART's; 0: unchanged). ART counts per packed row; here "
        "a step is one optimizer step, so it counts the step's.",
    )
    packed_sequence_length: int | None = Field(
        default=None,
        ge=16,
        description="Pack the step's sequences into rows of at most this many tokens, each "
        "row one forward pass; a sequence longer than it is left out of the step with a "
        "warning, and it may not exceed InitArgs.max_seq_length (ART's). None: rows of up "
        "to 1024 tokens, or fewer where the memory budget needs it.",
    )
    logprob_calculation_chunk_size: int | None = Field(
        default=None,
        ge=1,
        description="Tokens whose logits the LM head computes at once when the step takes "
        "logprobs (ART's; its LocalBackend defaults to 1024). None: as many as fit in "
        "64 MiB of float32 logits (341 for a 49k vocabulary).",
    )


class TrainSFTConfig(_OptimizerStep):
    """Experimental settings of `model.train_sft(..., _config=...)`."""

    assistant_turns: Literal["all", "last"] = Field(
        default="all",
        description="Which assistant turns the loss trains; `model.train_sft` sets it from "
        "`art.TrainSFTConfig.assistant_turns`.",
    )


class InitArgs(_Config):
    """How the base model is loaded."""

    max_seq_length: int = Field(default=8192, ge=16, description="Longest sequence trained.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto",
        description="Weight dtype; auto picks bf16 on CUDA and on CPUs whose kernels compute "
        "it natively (AVX512-BF16 or AMX), else fp32 (AVX2, plain AVX512, ARM), and says "
        "which once per process on stderr.",
    )
    load_in_4bit: bool = Field(
        default=False,
        description="QLoRA-style 4-bit base (bitsandbytes), with trainer_backend='unsloth' only.",
    )


class EngineArgs(_Config):
    """How the inference engine serves the model."""

    max_num_seqs: int = Field(default=64, ge=1, description="Most sequences decoded together.")
    gpu_memory_utilization: float | None = Field(
        default=None, gt=0, le=1, description="Share of GPU memory vLLM may take."
    )
    max_model_len: int | None = Field(
        default=None, ge=16, description="Longest prompt plus completion served."
    )
    enforce_eager: bool = Field(default=False, description="Disable CUDA graphs in vLLM.")
    merge_lora: bool | None = Field(
        default=None,
        description="Transformers engine: sample from a plain copy of the base model with the "
        "served LoRA adapter merged in (faster decoding, the base weights' memory once more). "
        "None: on when the copy takes under a quarter of the free memory (the CPU's or the "
        "GPU's).",
    )


class PeftArgs(_Config):
    """The LoRA adapter that training updates."""

    r: int = Field(default=8, ge=1, description="LoRA rank.")
    lora_alpha: int = Field(default=16, ge=1, description="LoRA scaling numerator.")
    lora_dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on LoRA inputs.")
    target_modules: tuple[str, ...] = Field(
        default=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        description="Module names that get adapters.",
    )


class TrainerArgs(_Config):
    """Optimizer settings of the trainer."""

    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    adam_beta1: float = Field(default=0.9, ge=0, lt=1)
    adam_beta2: float = Field(default=0.99, ge=0, lt=1)
    seed: int = Field(
        default=0,
        description="Seeds the adapter's initialisation and the trainer's own RNG (LoRA "
        "dropout); the global RNG that sampling uses is left alone.",
    )
    gradient_checkpointing: bool | None = Field(
        default=None,
        description="Recompute activations in backward instead of keeping them; None: on "
        "when a sequence is over 1024 tokens or the memory budget needs it.",
    )
    memory_budget_gb: float | None = Field(
        default=None,
        gt=0,
        description="Most memory (GiB) a training step may bring the model service to (RSS "
        "on CPU, allocated memory on CUDA); None: what the machine has free at the step.",
    )


VllmRuntimeMode = Literal["managed", "external"]
"""ART 0.5.23's `vllm_runtime.mode`: 'managed' (the backend starts vLLM) or 'external'."""


class VllmRuntimeArgs(TypedDict, total=False):
    """ART 0.5.23's `InternalModelConfig(vllm_runtime=...)`, as a dict (see `VllmRuntime`)."""

    mode: Required[VllmRuntimeMode]
    server_url: str
    api_key: str | None
    local_checkpoint_root: str | None
    server_checkpoint_root: str | None
    health_timeout_s: float


_EXTERNAL_ONLY = ("server_url", "api_key", "local_checkpoint_root", "server_checkpoint_root")


class VllmRuntime(_Config):
    """Where the vLLM engine runs: started by the backend ('managed'), or a vLLM server
    you launched ('external'), which samples every rollout while the trainer runs here.

    An external server needs `--enable-lora` (with `--max-lora-rank` at least the
    adapter's rank), `--enable-scale-out` (vLLM's token-in, token-out API, which the
    endpoint feeds) and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` in its environment: each
    checkpoint reaches it through `/v1/load_lora_adapter`.
    """

    mode: VllmRuntimeMode = Field(description="'managed' (default) or 'external'.")
    server_url: str | None = Field(
        default=None,
        description="External mode: the server's URL, e.g. http://127.0.0.1:8000 ('/v1' "
        "may end it).",
    )
    api_key: str | None = Field(
        default=None, description="External mode: the server's --api-key, if it has one."
    )
    local_checkpoint_root: str | None = Field(
        default=None,
        description="External mode: this machine's folder of checkpoints that the server "
        "sees as server_checkpoint_root (give both, or neither when it sees the same paths).",
    )
    server_checkpoint_root: str | None = Field(
        default=None, description="External mode: that folder as the server's path."
    )
    health_timeout_s: float = Field(
        default=120.0, gt=0, description="External mode: how long to wait for its /health."
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.mode == "managed":
            given = [name for name in _EXTERNAL_ONLY if getattr(self, name) is not None]
            if given:
                raise ValueError(
                    f"mode is 'managed', and {', '.join(given)} apply to mode='external' "
                    "only; set mode='external' or remove them"
                )
            return self
        if not self.server_url:
            raise ValueError(
                "server_url is required for mode='external': the URL of your vLLM server, "
                "e.g. 'http://127.0.0.1:8000'"
            )
        vllm_server_url(self.server_url)
        if (self.local_checkpoint_root is None) != (self.server_checkpoint_root is None):
            raise ValueError(
                "local_checkpoint_root and server_checkpoint_root: set both (the server "
                "sees checkpoints under another path) or neither"
            )
        return self


def vllm_server_url(server_url: str) -> str:
    """`server_url` without a trailing '/' or '/v1': the server's root URL."""
    from urllib.parse import urlparse

    root = server_url.rstrip("/").removesuffix("/v1").rstrip("/")
    parsed = urlparse(root)
    if parsed.scheme not in {"http", "https"} or not parsed.netloc:
        raise ValueError(
            f"server_url {server_url!r} is not an HTTP URL; give e.g. 'http://127.0.0.1:8000'"
        )
    return root


class InternalModelConfig(_Config):
    """How a `TrainableModel` is loaded, served and trained (`_internal_config=...`)."""

    engine: Literal["transformers", "vllm"] | None = Field(
        default=None, description="Inference engine; None picks vLLM on CUDA, else transformers."
    )
    trainer_backend: Literal["peft", "unsloth"] | None = Field(
        default=None,
        description="Trainer: 'peft' (ours, any torch device) or 'unsloth' (Unsloth's model in "
        "a process of its own, `make venv-unsloth`); None: PEFT. (ART's own `trainer` key "
        "held the GRPO trainer's arguments: here they are `trainer_args`.)",
    )
    init_args: InitArgs = Field(default_factory=InitArgs)
    engine_args: EngineArgs = Field(default_factory=EngineArgs)
    peft_args: PeftArgs = Field(default_factory=PeftArgs)
    trainer_args: TrainerArgs = Field(default_factory=TrainerArgs)
    trainer_gpu_ids: list[int] | None = Field(
        default=None, description="GPUs for training in dedicated mode."
    )
    inference_gpu_ids: list[int] | None = Field(
        default=None, description="GPUs for inference in dedicated mode."
    )
    chat_template: str | None = Field(
        default=None,
        description="A Jinja chat template (ART's key) in place of the tokenizer's own: the "
        "endpoint renders prompts with it and training tokenizes with it.",
    )
    chat_template_path: str | None = Field(
        default=None,
        description="A file holding such a template (ART's key), read when the model loads; "
        "give this or chat_template.",
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None,
        description="Extra variables for the chat template (ART's key; e.g. "
        "`{'enable_thinking': False}`), for rollout prompts and training alike; a request's "
        "own `chat_template_kwargs` override them for that request.",
    )
    chat_template_content_format: Literal["auto", "string", "openai"] = Field(
        default="auto",
        description="How a message's content reaches the template (ART's key, vLLM's "
        "meaning): 'string' joins its text parts with newlines, 'openai' gives a list of "
        "parts, 'auto' picks 'openai' where the template loops over a message's content.",
    )
    chat_template_tool_schema_format: Literal["default", "vllm_openai"] = Field(
        default="default",
        description="How tool schemas reach the template (ART's key): as the request gave "
        "them, or with their keys in the order vLLM's OpenAI server writes them.",
    )
    rollout_weights_mode: Literal["lora", "merged"] | None = Field(
        default=None,
        description="How the engine samples from a checkpoint (ART's key): 'lora' applies "
        "the adapter to the base's weights as it decodes, 'merged' samples from a copy of "
        "the base with the adapter merged in (the transformers engine only). None: the "
        "engine picks (engine_args.merge_lora's rule).",
    )

    vllm_runtime: VllmRuntime | None = Field(
        default=None,
        description="Where vLLM runs (ART 0.5.23's key): None or mode='managed' starts it "
        "here; mode='external' samples with the vLLM server at server_url (`VllmRuntime`).",
    )

    rollout_weight_update_mode: RolloutWeightUpdateMode | None = Field(
        default=None,
        description="How a new checkpoint reaches rollouts (ART 0.5.23's key): 'step_lora' "
        "serves each step as its own adapter, requests in flight finishing on the one they "
        "started with, which is what this version does; 'in_flight_lora' is refused. None: "
        "'step_lora'.",
    )

    @field_validator("rollout_weight_update_mode")
    @classmethod
    def _no_in_flight_updates(cls, value: str | None) -> str | None:
        if value == "in_flight_lora":
            raise ValueError(
                "'in_flight_lora' (one adapter updated in place under running requests, with "
                "token-level policy spans) is not built here; use 'step_lora' (each step "
                "served as its own adapter) or leave it unset"
            )
        return value

    @field_validator("init_args", "engine_args", "peft_args", "trainer_args", mode="before")
    @classmethod
    def _none_is_default(cls, value: Any) -> Any:
        # ART's clients send None for every section the user left unset.
        return {} if value is None else value

    @model_validator(mode="after")
    def _check_chat_template(self) -> Self:
        if self.chat_template is not None and self.chat_template_path is not None:
            raise ValueError("chat_template and chat_template_path: give one, not both")
        return self

    @property
    def external_vllm(self) -> VllmRuntime | None:
        """The external vLLM server's settings, or None where vLLM (if any) is started here."""
        runtime = self.vllm_runtime
        return runtime if runtime is not None and runtime.mode == "external" else None

    @model_validator(mode="after")
    def _check_external_vllm(self) -> Self:
        if self.external_vllm is None:
            return self
        if self.engine == "transformers":
            raise ValueError(
                "engine is 'transformers' while vllm_runtime.mode is 'external', whose server "
                "samples every rollout; set engine='vllm' (or leave it unset)"
            )
        if self.inference_gpu_ids is not None:
            raise ValueError(
                "inference_gpu_ids places a vLLM this backend starts; with vllm_runtime.mode "
                "'external' the server's own GPUs serve: remove inference_gpu_ids"
            )
        return self

    @model_validator(mode="after")
    def _check_gpu_split(self) -> Self:
        trainer, inference = self.trainer_gpu_ids, self.inference_gpu_ids
        if self.external_vllm is not None:
            return self  # trainer_gpu_ids alone places the trainer; the server has its own
        if (trainer is None) != (inference is None):
            raise ValueError(
                "trainer_gpu_ids and inference_gpu_ids: set both (dedicated mode) or neither"
            )
        if trainer is not None and inference is not None and set(trainer) & set(inference):
            raise ValueError(
                "trainer_gpu_ids and inference_gpu_ids overlap; dedicated mode needs "
                "separate GPUs for training and inference"
            )
        return self


class LoRAConfig(TypedDict, total=False):
    """ART 0.5.23's adapter settings, `TrainableModel(lora_config=...)` (a dict).

    Read into `InternalModelConfig` by `with_lora_config`: rank, alpha, dropout and
    target_modules are `peft_args`; max_seq_length is `init_args.max_seq_length`;
    random_state is `trainer_args.seed`; use_gradient_checkpointing (True, False or
    "unsloth") is `trainer_args.gradient_checkpointing`. bias, layers_to_transform,
    layers_pattern, use_rslora, modules_to_save, init_weights and loftq_config are taken
    at PEFT's defaults only, and temporary_location (Unsloth's scratch directory) not at
    all: another value is refused by name.
    """

    rank: int
    target_modules: list[str]
    alpha: int
    dropout: float
    bias: str
    layers_to_transform: list[int] | None
    layers_pattern: str | None
    use_gradient_checkpointing: str
    random_state: int
    max_seq_length: int
    use_rslora: bool
    modules_to_save: list[str] | None
    init_weights: bool
    loftq_config: dict[str, Any]
    temporary_location: str


# LoRAConfig keys that are one of our settings: (section of InternalModelConfig, field).
_LORA_KEYS: dict[str, tuple[str, str]] = {
    "rank": ("peft_args", "r"),
    "alpha": ("peft_args", "lora_alpha"),
    "dropout": ("peft_args", "lora_dropout"),
    "target_modules": ("peft_args", "target_modules"),
    "max_seq_length": ("init_args", "max_seq_length"),
    "random_state": ("trainer_args", "seed"),
    "use_gradient_checkpointing": ("trainer_args", "gradient_checkpointing"),
}
# LoRAConfig keys taken only at PEFT's default, which is what our adapters are.
_LORA_DEFAULTS: dict[str, tuple[tuple[Any, ...], str]] = {
    "bias": (("none",), "LoRA bias terms are not trained here"),
    "layers_to_transform": ((None,), "every layer of target_modules gets an adapter here"),
    "layers_pattern": ((None,), "every layer of target_modules gets an adapter here"),
    "use_rslora": ((False,), "rank-stabilised LoRA scaling is not built here"),
    "modules_to_save": ((None, []), "only the LoRA adapter is trained and saved here"),
    "init_weights": ((True,), "adapters start from PEFT's default initialisation here"),
    "loftq_config": ((None, {}), "LoftQ initialisation is not built here"),
}


def with_lora_config(
    config: InternalModelConfig, lora_config: Mapping[str, Any]
) -> InternalModelConfig:
    """`config` with ART 0.5.23's `lora_config` read into it (see `LoRAConfig`).

    A key that names a setting `config` already sets to another value, a key at a value
    this version does not build, and an unknown key are each a `ConfigError` naming it.
    """
    from .errors import ConfigError

    updates: dict[str, dict[str, Any]] = {}
    for key, value in lora_config.items():
        where = f"lora_config[{key!r}]"
        if key in _LORA_DEFAULTS:
            allowed, why = _LORA_DEFAULTS[key]
            if value not in allowed:
                raise ConfigError(where, f"is {value!r}: {why}", f"Remove {key!r}")
            continue
        if key == "temporary_location":
            raise ConfigError(
                where, "is Unsloth's scratch directory, which nothing here writes", "Remove it"
            )
        if key not in _LORA_KEYS:
            raise ConfigError(
                where,
                "is not a key of art.dev.LoRAConfig",
                f"Use {', '.join(LoRAConfig.__annotations__)}",
            )
        section, field = _LORA_KEYS[key]
        if key == "use_gradient_checkpointing":
            if value not in (True, False, "unsloth"):
                raise ConfigError(
                    where, f"is {value!r}", "Use True, False or 'unsloth' (which is True here)"
                )
            value = value is not False
        current: _Config = getattr(config, section)
        if field in current.model_fields_set and getattr(current, field) != _as_field(value):
            raise ConfigError(
                where,
                f"is {value!r}, but _internal_config.{section}.{field} is "
                f"{getattr(current, field)!r}",
                "Set it in one place",
            )
        updates.setdefault(section, {})[field] = value
    data = config.model_dump(exclude_unset=True)
    for section, fields in updates.items():
        data[section] = data.get(section, {}) | fields
    try:
        return InternalModelConfig(**data)
    except ConfigError as error:  # a value out of range, say: named as the user gave it
        raise ConfigError(f"lora_config ({error.field})", error.problem, error.fix) from None


def _as_field(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


class ServerArgs(TypedDict, total=False):
    """ART's vLLM OpenAI-server arguments, as a dict (`OpenAIServerConfig.server_args`).

    Our backends run no vLLM OpenAI server: `LocalBackend` refuses the config, `art run`
    honours `host`, `port` and `api_key` and refuses the rest by name.
    """

    host: str | None
    port: int
    api_key: str | None
    uvicorn_log_level: str
    allow_credentials: bool
    allowed_origins: str
    allowed_methods: str
    allowed_headers: str
    lora_modules: list[str] | None
    prompt_adapters: list[str] | None
    chat_template: str | None
    chat_template_content_format: str
    response_role: str | None
    ssl_keyfile: str | None
    ssl_certfile: str | None
    ssl_ca_certs: str | None
    enable_ssl_refresh: bool
    ssl_cert_reqs: int
    root_path: str | None
    middleware: list[str]
    return_tokens_as_token_ids: bool
    disable_frontend_multiprocessing: bool
    enable_request_id_headers: bool
    enable_auto_tool_choice: bool
    tool_call_parser: str
    tool_parser_plugin: str
    max_log_len: int | None
    disable_fastapi_docs: bool
    enable_prompt_tokens_details: bool
    enable_server_load_tracking: bool
    enable_reasoning: bool
    reasoning_parser: str | None


class OpenAIServerConfig(TypedDict, total=False):
    """ART's `_openai_client_config` (a dict): what `_prepare_backend_for_training` gets."""

    log_file: str
    server_args: ServerArgs
    engine_args: dict[str, Any]


def is_dedicated_mode(config: InternalModelConfig | Mapping[str, Any]) -> bool:
    """Whether `config` puts training and inference on resources of their own (both
    `trainer_gpu_ids` and `inference_gpu_ids` set, empty lists on the CPU; or an external
    vLLM server, as in ART)."""
    checked = validate_dedicated_config(config)
    return checked.trainer_gpu_ids is not None or checked.external_vllm is not None


def is_external_vllm_mode(config: InternalModelConfig | Mapping[str, Any]) -> bool:
    """Whether `config` samples with a vLLM server you run (`vllm_runtime.mode='external'`)."""
    return validate_dedicated_config(config).external_vllm is not None


def validate_dedicated_config(
    config: InternalModelConfig | Mapping[str, Any],
) -> InternalModelConfig:
    """`config` checked (ART's dict form too): both GPU lists or neither, not
    overlapping; `ConfigError` names what is wrong. Returns the checked config."""
    if isinstance(config, InternalModelConfig):
        return config
    return InternalModelConfig(**config)


__all__ = [
    "EngineArgs",
    "InitArgs",
    "InternalModelConfig",
    "LoRAConfig",
    "OpenAIServerConfig",
    "PeftArgs",
    "RolloutWeightUpdateMode",
    "ServerArgs",
    "TrainConfig",
    "TrainSFTConfig",
    "TrainerArgs",
    "VllmRuntime",
    "VllmRuntimeArgs",
    "VllmRuntimeMode",
    "is_dedicated_mode",
    "is_external_vllm_mode",
    "validate_dedicated_config",
    "vllm_server_url",
    "with_lora_config",
]
