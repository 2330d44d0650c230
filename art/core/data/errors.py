"""The exceptions `art` raises, one tree so callers can catch as broadly as they like.

    ArtError
    ├── ArtValueError (also a ValueError)        bad input: names the field and the fix
    │   ├── TrajectoryValidationError            a trajectory or group that cannot be logged or trained
    │   └── ConfigError                          a model, backend or training config that is wrong
    │       └── ModelInUseError                  a model another process holds for training
    │                                            (`ModelStore.hold_writer_lock`)
    ├── ModelNotRegisteredError                  a model used before `await model.register(backend)`
    ├── NotBuiltError (also a NotImplementedError) a capability this version does not have yet
    ├── RolloutError                             a rollout that failed in a way `art` itself detected
    ├── JudgeError                               an LLM judge (RULER) that answered unusably
    ├── BackendError                             a backend that failed or cannot be reached
    │   ├── LocalServingUnavailableError          (also a RuntimeError) a model's own endpoint
    │   │                                        went away mid-run: training must stop
    │   ├── ArtVllmMetricsTimeoutError            (also a TimeoutError) a vLLM engine's
    │   │                                        metrics did not answer in time
    │   ├── S3Error                               an S3 request failed (`bucket`, `key`,
    │   │   │                                    `code`; art.core.store.s3, ART's art.utils.s3)
    │   │   ├── S3SyncError                       (also a RuntimeError) a transfer or listing
    │   │   └── ForbiddenBucketCreationError      a missing bucket that could not be created
    │   └── DeploymentError                       a LoRA deployment to an inference provider
    │       │                                    failed (`status_code`; ART's names)
    │       ├── UnsupportedLoRADeploymentProviderError
    │       ├── UnsupportedBaseModelDeploymentError
    │       └── LoRADeploymentTimedOutError
    ├── TrainingError                            a training step that failed (`step`: the step it was making)
    ├── StorageError                             a file or directory that could not be written
    │                                            (`path`; a full disk: `free_bytes`, `needed_bytes`)
    ├── MCPConnectionError                       an MCP server that could not be started or reached
    │                                            (art.integrations.mcp.session)
    ├── ScenarioGenerationError                  MCP scenarios the generator model could not write
    │                                            (art.integrations.mcp.generate)
    └── InputGenerationError                     AutoRL inputs the generator model could not write
                                                 (art.autorl.inputs)

Each error carries the context it is about (a field path, a model name, a step) as
attributes, and its message says what to do about it. Bad config values (`TrainConfig`,
`art.dev.*`, `Model`) raise `ConfigError`, never pydantic's `ValidationError`.
"""

from __future__ import annotations

from typing import Any


class ArtError(Exception):
    """Base class of every error `art` raises on purpose."""


class ArtValueError(ArtError, ValueError):
    """Bad input. `field` is the dotted path of the offending value."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"{field}: {problem}. {fix}")

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:
        # Rebuilt from its parts, so it crosses a process boundary as itself.
        return type(self), (self.field, self.problem, self.fix)


class TrajectoryValidationError(ArtValueError):
    """A trajectory or trajectory group that cannot be logged or trained as it is."""


class ConfigError(ArtValueError):
    """A model, backend or training configuration that is wrong."""


class ModelInUseError(ConfigError):
    """A model directory whose writer lock another process holds: two processes training
    one model would each write their own steps over the other's. `path` is the model's
    directory, `pid` and `host` the holder's (None where it had not written them yet)."""

    def __init__(self, path: str, pid: int | None, host: str | None) -> None:
        self.path = path
        self.pid = pid
        self.host = host
        holder = "another process" if pid is None else f"process {pid}"
        if host is not None:
            holder += f" on {host}"
        close = "the other backend" + ("" if pid is None else f" (pid {pid})")
        super().__init__(
            "path",
            f"{path} is being trained by {holder}",
            f"Close {close}, or give this run another name or path",
        )

    def __reduce__(self) -> tuple[type, tuple[str, int | None, str | None]]:  # type: ignore[override]
        return type(self), (self.path, self.pid, self.host)


class ModelNotRegisteredError(ArtError):
    """A model was used before `await model.register(backend)`."""

    def __init__(self, model_name: str, action: str) -> None:
        self.model_name = model_name
        self.action = action
        super().__init__(
            f"model {model_name!r} is not registered, so it cannot {action}. "
            "Call `await model.register(backend)` first."
        )

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (self.model_name, self.action)


class NotBuiltError(ArtError, NotImplementedError):
    """A public name whose capability this version of `art` does not have yet."""

    def __init__(self, name: str, missing: str) -> None:
        self.name = name
        self.missing = missing
        super().__init__(f"{name} is not available yet: {missing}")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (self.name, self.missing)


class RolloutError(ArtError):
    """A rollout failed in a way `art` detected (not an error raised by user code)."""


class JudgeError(ArtError):
    """An LLM judge answered with something that cannot be used as scores."""


class BackendError(ArtError):
    """A backend failed, or could not be reached."""


class TrainingError(ArtError):
    """A training step failed. `step` is the checkpoint step it was making (`model.train`
    fills it in when the backend did not)."""

    def __init__(self, message: str, *, step: int | None = None) -> None:
        self.step = step
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return _training_error, (str(self), self.step)


def _training_error(message: str, step: int | None) -> TrainingError:
    return TrainingError(message, step=step)


class StorageError(ArtError):
    """A file or directory under the art path could not be written: a full disk, or the
    OS's reason. `path` is what was being written, `free_bytes` the space free on its
    filesystem afterwards, `needed_bytes` an estimate of what the write needed (None: no
    estimate); the message says where the estimate comes from and what to do."""

    def __init__(
        self, message: str, *, path: str, free_bytes: int, needed_bytes: int | None
    ) -> None:
        self.path = path
        self.free_bytes = free_bytes
        self.needed_bytes = needed_bytes
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return _storage_error, (str(self), self.path, self.free_bytes, self.needed_bytes)


def _storage_error(
    message: str, path: str, free_bytes: int, needed_bytes: int | None
) -> StorageError:
    return StorageError(message, path=path, free_bytes=free_bytes, needed_bytes=needed_bytes)


class LocalServingUnavailableError(BackendError, RuntimeError):
    """The inference endpoint a backend runs for a trainable model cannot be reached any
    more, so rollouts would all fail: training must stop rather than count them as
    failed rollouts (ART 0.5.23's name)."""


class ArtVllmMetricsTimeoutError(BackendError, TimeoutError):
    """A vLLM engine's metrics endpoint did not answer within the scrape timeout (ART
    0.5.23's name)."""


class DeploymentError(BackendError):
    """Deploying a LoRA checkpoint to an inference provider failed; `status_code` is the
    HTTP status ART gives the case. ART's `art.utils.deploy_model` raises these; here
    that call is not built, and the names exist for code that catches them."""

    status_code = 500

    def __init__(self, message: str) -> None:
        self.detail = message
        super().__init__(message)


class UnsupportedLoRADeploymentProviderError(DeploymentError):
    """The provider does not serve LoRA adapters."""

    status_code = 400


class UnsupportedBaseModelDeploymentError(DeploymentError):
    """The provider does not serve LoRA adapters of this base model."""

    status_code = 400


class LoRADeploymentTimedOutError(DeploymentError):
    """The provider did not finish deploying the adapter in time."""

    status_code = 504
