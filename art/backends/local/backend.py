"""`LocalBackend`: models stored, served and trained on this machine."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal, Unpack

from ...core.backend import InferenceEndpoint
from ...core.data import dev
from ...core.data.errors import ConfigError
from ...core.data.registration import refuse_changed_registration
from ...core.data.sft_data import spool_examples
from ...core.data.train_options import LocalTrainKeywords, local_train_options
from ...core.data.trajectories import Trajectory, TrajectoryGroup
from ...core.data.types import LocalTrainResult, TrainConfig, TrainSFTConfig
from ...core.model import Model, TrainableModel
from ...core.store.model_store import ModelStore, fork_checkpoint
from ...core.store.s3 import ExcludableOption
from ...core.training import run_step

logger = logging.getLogger("art")

if TYPE_CHECKING:
    from ...runtime.service.api import ServiceAPI
    from ...runtime.service.placement import Placement


class LocalBackend:
    """Serves, trains and stores models on this machine, under `path`.

    Trainable models are served on an OpenAI-compatible endpoint on 127.0.0.1 and
    trained with LoRA GRPO; each step's adapter becomes `checkpoints/{step:04d}` and is
    served to the next rollouts.

    Args:
        in_process: run the model service (inference engine and trainer) inside this
            process (True), or in a child process that exits with this one (False),
            which keeps torch out of the agent's process.
        path: where models, checkpoints and trajectory logs are stored.
        placement: makes the `Placement` that runs the engines and trainers elsewhere (a
            Ray cluster: `RayBackend` passes one), called on the first registration;
            None runs them here. Needs `in_process=True`.
    """

    def __init__(
        self,
        *,
        in_process: bool = False,
        path: str | os.PathLike[str] = "./.art",
        placement: Callable[[], Placement] | None = None,
    ) -> None:
        if placement is not None and not in_process:
            raise ConfigError(
                "in_process",
                "a placement runs the engines and trainers from this process's model service",
                "Pass in_process=True with placement",
            )
        self.in_process = in_process
        self.path = os.fspath(path)
        self._placement = placement
        self._locks: dict[str, asyncio.Lock] = {}
        self._service: ServiceAPI | None = None
        self._served: set[str] = set()  # trainable models registered with the service

    def _model_service(self) -> ServiceAPI:
        if self._service is None:
            if self.in_process:
                from ...runtime.service.model_service import ModelService

                placement = self._placement() if self._placement is not None else None
                self._service = ModelService(self.path, placement)
            else:
                from ...runtime.process import ServiceProcess

                self._service = ServiceProcess(self.path)
        return self._service

    @property
    def service(self) -> ServiceAPI | None:
        """The model service while one runs (from the first registration to `close`):
        what a server built on this backend (`art run`) routes inference to."""
        return self._service

    def __repr__(self) -> str:
        return f"LocalBackend(path={self.path!r}, in_process={self.in_process})"

    def _supports_concurrent_training_and_inference(self, model: TrainableModel) -> bool:
        """Dedicated mode (ART's name, an external vLLM server included): the engine keeps
        serving while a step trains."""
        return dev.is_dedicated_mode(model.internal_config)

    def _store(self, model: Model) -> ModelStore:
        return ModelStore(self.path, model.project, model.storage_name)

    def _lock(self, model: Model) -> asyncio.Lock:
        # One writer per model at a time: two concurrent `log` calls must not both
        # read-modify-write the same Parquet file or history.
        return self._locks.setdefault(f"{model.project}/{model.storage_name}", asyncio.Lock())

    async def register(self, model: Model) -> InferenceEndpoint | None:
        store = self._store(model)
        record: dict[str, Any] = {
            "name": model.name,
            "project": model.project,
            "trainable": model.trainable,
            "config": model.config,
        }
        if model.storage_name != model.name:  # (absent, model.json is as it always was)
            record["run_name"] = model.storage_name
        if isinstance(model, TrainableModel):
            record["base_model"] = model.base_model
            record["internal_config"] = model.internal_config.model_dump(mode="json")
        refuse_changed_registration(store.read_model(), record, where=str(store.dir))
        endpoint = None
        if isinstance(model, TrainableModel):
            # Loaded before model.json is written: a base model that cannot be loaded must
            # not leave a record that the corrected registration would then conflict with.
            service = self._model_service()
            served = await asyncio.to_thread(service.register, record)
            endpoint = InferenceEndpoint(
                base_url=served["base_url"],
                api_key=served["api_key"],
                model_name=served["model_name"],
                http_transport=_transport(service),
            )
        async with self._lock(model):
            await asyncio.to_thread(store.write_model, record)
        if isinstance(model, TrainableModel):
            self._served.add(f"{model.project}/{model.storage_name}")
        return endpoint

    async def get_step(self, model: Model) -> int:
        return await asyncio.to_thread(self._store(model).step)

    async def log(
        self,
        model: Model,
        groups: list[TrajectoryGroup],
        *,
        split: str,
        step: int,
        metrics: dict[str, float],
    ) -> None:
        store = self._store(model)
        async with self._lock(model):
            await asyncio.to_thread(store.write_log, split, step, groups, metrics)

    async def train(
        self,
        model: TrainableModel,
        trajectory_groups: Iterable[TrajectoryGroup],
        **keywords: Unpack[LocalTrainKeywords],
    ) -> LocalTrainResult:
        """One training step on `trajectory_groups` (ART 0.5.18's call); nothing is logged.

        Log the groups (`await model.log(groups, split="train")`) and the result
        (`await model.log(metrics=result.metrics, step=result.step)`) yourself, or use
        `model.train`, which does both. The keywords are ART's, with its defaults; each is
        honoured or refused by name before anything is trained (what each does, and which
        are refused: `art.core.data.train_options`). `save_checkpoint=False` only reports
        `checkpoint_path=None`: as in ART, the checkpoint is still written and served.
        """
        options = local_train_options(**keywords)
        if options.reference_step is not None:
            reference = self._reference(model, options.reference_step)
            options = replace(
                options,
                dev_config=options.dev_config.model_copy(update={"kl_ref_adapter_path": reference}),
            )
        result = await run_step(
            model,
            trajectory_groups,
            config=options.config,
            dev_config=options.dev_config,
            verbose=options.verbose,
            log=False,
            backend=self,
        )
        step = await self.get_step(model)
        checkpoint = self._store(model).checkpoint_dir(step)
        path = str(checkpoint) if options.report_checkpoint and checkpoint.is_dir() else None
        return LocalTrainResult(step=step, metrics=result.metrics, checkpoint_path=path)

    def _reference(self, model: TrainableModel, step: int) -> str:
        """ART's kl_penalty_reference_step: that checkpoint's directory of `model`, as the
        KL reference (`dev.TrainConfig.kl_ref_adapter_path`)."""
        store = self._store(model)
        directory = store.checkpoint_dir(step)
        if not directory.is_dir():
            raise ConfigError(
                "kl_penalty_reference_step",
                f"is {step}, but {model.project}/{model.storage_name} has no checkpoint there "
                f"(it has steps {store.checkpoint_steps()})",
                "Name a step it still has (model.delete_checkpoints may have removed it)",
            )
        return str(directory)

    async def train_step(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        *,
        config: TrainConfig,
        dev_config: dev.TrainConfig,
        verbose: bool,
    ) -> dict[str, float]:
        service = self._model_service()
        store = self._store(model)
        async with self._lock(model):
            if verbose:
                trajectories = sum(len(group.trajectories) for group in groups)
                print(
                    f"[{model.project}/{model.storage_name}] training step {store.step() + 1} on "
                    f"{len(groups)} groups ({trajectories} trajectories), "
                    f"learning_rate={config.learning_rate:g}"
                )
            metrics = await asyncio.to_thread(
                service.train, model.project, model.storage_name, groups, config, dev_config
            )
            if verbose:
                print(
                    f"[{model.project}/{model.storage_name}] saved and serving "
                    f"{store.checkpoint_dir(store.step())}"
                )
            return metrics

    async def train_sft(
        self,
        model: TrainableModel,
        examples: Iterator[tuple[str, Trajectory]],
        *,
        config: TrainSFTConfig,
        dev_config: dev.TrainSFTConfig,
        verbose: bool,
    ) -> list[dict[str, float]]:
        service = self._model_service()
        store = self._store(model)
        async with self._lock(model):
            # Spooled to a file the service streams: the examples are read once, as they
            # come, and need not fit in memory (nor cross to the service process at once).
            spool, count = await asyncio.to_thread(spool_examples, examples, store.dir)
            try:
                if count == 0:
                    logger.warning(
                        "%s: train_sft got no trajectories; nothing trained", model.storage_name
                    )
                    return []
                if verbose:
                    print(
                        f"[{model.project}/{model.storage_name}] SFT on {count} trajectories, "
                        f"batch_size={config.resolved_batch_size()}, making checkpoint "
                        f"{store.step() + 1}"
                    )
                rows = await asyncio.to_thread(
                    service.train_sft,
                    model.project,
                    model.storage_name,
                    str(spool),
                    config.learning_rate,
                    config.resolved_batch_size(),
                    dev_config,
                )
            finally:
                spool.unlink(missing_ok=True)
            if verbose:
                print(
                    f"[{model.project}/{model.storage_name}] saved and serving {store.checkpoint_dir(store.step())}"
                )
            return rows

    async def delete_checkpoints(self, model: Model, *, best_checkpoint_metric: str) -> list[int]:
        store = self._store(model)
        async with self._lock(model):
            deleted = await asyncio.to_thread(
                store.delete_checkpoints_but_best, best_checkpoint_metric
            )
            await self._forget(model, deleted)
            return deleted

    async def _delete_checkpoint_files(self, model: Model, steps_to_keep: list[int]) -> list[int]:
        """Delete every checkpoint not in `steps_to_keep` (ART's name); the latest is
        always kept. Returns the deleted steps."""
        store = self._store(model)
        async with self._lock(model):
            keep = {*steps_to_keep, store.step()}
            deleted = await asyncio.to_thread(store.delete_checkpoints, keep)
            await self._forget(model, deleted)
            return deleted

    async def _experimental_fork_checkpoint(
        self,
        model: Model,
        from_model: str,
        from_project: str | None = None,
        from_s3_bucket: str | None = None,
        not_after_step: int | None = None,
        verbose: bool = False,
        prefix: str | None = None,
    ) -> None:
        """Start `model` from another model's checkpoint (ART's experimental call): its
        latest, or its latest at or before `not_after_step`, is copied in as `model`'s
        checkpoint of the same step, which `model` then serves and trains on from.

        The source is `from_project/from_model` (default: the model's own project); it
        must share the base model. With `from_s3_bucket` (and `prefix`, the key prefix it
        was pushed under) that checkpoint and the source's `model.json` are first pulled
        from S3 into this backend's path (`art.utils.s3`); otherwise the source is read
        from this backend's path.
        """
        if prefix is not None and from_s3_bucket is None:
            raise ConfigError(
                "prefix",
                "is an S3 key prefix, and no from_s3_bucket was given",
                "Pass from_s3_bucket too, or leave prefix=None",
            )
        if not isinstance(model, TrainableModel):
            raise ConfigError("model", "is not a TrainableModel", "Fork into a trainable model")
        from_project = from_project or model.project
        if from_s3_bucket is not None:
            await self._pull_fork_source(
                from_model, from_project, from_s3_bucket, prefix, not_after_step, verbose
            )
        source = ModelStore(self.path, from_project, from_model)
        service = self._model_service()
        async with self._lock(model):
            source_dir = await asyncio.to_thread(
                fork_checkpoint, self._store(model), model.base_model, source, not_after_step
            )
            await asyncio.to_thread(service.continue_from_latest, model.project, model.storage_name)
        if verbose:
            print(f"[{model.project}/{model.storage_name}] forked {source_dir}")

    async def _pull_fork_source(
        self,
        name: str,
        project: str,
        bucket: str,
        prefix: str | None,
        not_after_step: int | None,
        verbose: bool,
    ) -> None:
        """Pull the checkpoint a fork from S3 starts from, with the source's model.json."""
        from ...core.store import s3

        step = await s3.fork_step_from_s3(name, project, bucket, prefix, not_after_step, verbose)
        async with self._lock(Model(name=name, project=project)):
            await s3.pull_model_from_s3(
                name, project, step, bucket, prefix, verbose, art_path=self.path
            )
            await s3.pull_model_record(name, project, bucket, prefix, self.path)

    # --- S3 (ART's experimental calls; the work is art.core.store.s3's) ----------------------

    async def _experimental_push_to_s3(
        self,
        model: Model,
        *,
        s3_bucket: str | None = None,
        prefix: str | None = None,
        verbose: bool = False,
        delete: bool = False,
    ) -> None:
        """Upload the model's directory (checkpoints, trajectories, history, model.json)
        to `s3://<s3_bucket>/<prefix>/<project>/models/<name>/`, creating the bucket if
        it is missing. `s3_bucket=None`: the BACKUP_BUCKET environment variable.
        `delete`: also delete what is stored there and not here. No step is written
        while it uploads."""
        from ...core.store.s3 import push_model_to_s3

        async with self._lock(model):
            await push_model_to_s3(
                model.storage_name, model.project, s3_bucket, prefix, verbose, delete, self.path
            )

    async def _experimental_pull_from_s3(
        self,
        model: Model,
        *,
        s3_bucket: str | None = None,
        prefix: str | None = None,
        verbose: bool = False,
        delete: bool = False,
        only_step: int | Literal["latest"] | None = None,
        step: int | None = None,
        exclude: list[ExcludableOption] | None = None,
        latest_only: bool = False,
    ) -> None:
        """Download the model's directory from S3 into this backend's path (deprecated in
        ART, as here: use `_experimental_pull_model_checkpoint` for one checkpoint).

        Pull into a fresh path, then `await model.register(backend)`: the model resumes
        from the highest checkpoint pulled. A registered model pulled to a later step
        trains and serves on from it at once.

        Args:
            only_step: one checkpoint only: its step, or "latest" (the highest stored;
                where none is stored nothing is pulled). None: everything.
            step: ART's older name for an int `only_step`.
            latest_only: ART's older spelling of `only_step="latest"`.
            exclude: top-level folders to leave out ("checkpoints", "logs", "trajectories").
            delete: also delete local files of the model that S3 does not hold.
        """
        warnings.warn(
            "_experimental_pull_from_s3 is deprecated. Use "
            "_experimental_pull_model_checkpoint instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        from ...core.store import s3

        if latest_only and only_step not in (None, "latest"):
            raise ConfigError(
                "latest_only", f"contradicts only_step={only_step!r}", "Pass only_step alone"
            )
        if step is not None and only_step not in (None, step):
            raise ConfigError(
                "step",
                f"is {step} and only_step is {only_step!r}",
                "Pass only_step alone (step is its older name)",
            )
        wanted = step if step is not None else ("latest" if latest_only else only_step)
        if wanted == "latest":
            wanted = await s3.get_latest_checkpoint_step_from_s3(
                model.storage_name, model.project, s3_bucket, prefix
            )
            if wanted is None:
                if verbose:
                    print("No checkpoints found in S3")
                return
        async with self._lock(model):
            before = await self.get_step(model)
            await s3.pull_model_from_s3(
                model.storage_name,
                model.project,
                wanted,
                s3_bucket,
                prefix,
                verbose,
                delete,
                self.path,
                exclude,
            )
            await self._serve_latest_if_moved(model, before)

    async def _experimental_pull_model_checkpoint(
        self,
        model: TrainableModel,
        *,
        step: int | Literal["latest"] | None = None,
        local_path: str | None = None,
        s3_bucket: str | None = None,
        prefix: str | None = None,
        verbose: bool = False,
    ) -> str:
        """The local directory of one checkpoint of `model`, pulled from S3 if this
        backend's path lacks it; returns that directory (or `local_path`, a copy).

        `step` None or "latest": the highest step here or, with `s3_bucket`, in S3
        (here wins a tie). `local_path`: copy the checkpoint's files there too.
        """
        from ...core.store import s3

        store = self._store(model)
        if step is None or step == "latest":
            local = store.step() or None
            remote = (
                await s3.get_latest_checkpoint_step_from_s3(
                    model.storage_name, model.project, s3_bucket, prefix
                )
                if s3_bucket is not None
                else None
            )
            if local is None and remote is None:
                raise FileNotFoundError(
                    f"No checkpoints found for {model.project}/{model.storage_name} in {store.dir}"
                    + (f" or in S3 bucket {s3_bucket!r}" if s3_bucket is not None else "")
                )
            resolved = max(found for found in (local, remote) if found is not None)
        else:
            resolved = step
        directory = store.checkpoint_dir(resolved)
        if not directory.is_dir():
            if s3_bucket is None:
                raise FileNotFoundError(
                    f"Checkpoint not found at {directory} and no S3 bucket specified"
                )
            if verbose:
                print(f"Pulling checkpoint step {resolved} from S3...")
            async with self._lock(model):
                before = await self.get_step(model)
                await s3.pull_model_from_s3(
                    model.storage_name,
                    model.project,
                    resolved,
                    s3_bucket,
                    prefix,
                    verbose,
                    art_path=self.path,
                )
                await self._serve_latest_if_moved(model, before)
        if local_path is None:
            return str(directory)
        if verbose:
            print(f"Copying checkpoint from {directory} to {local_path}...")
        await asyncio.to_thread(shutil.copytree, directory, local_path, dirs_exist_ok=True)
        return local_path

    async def _serve_latest_if_moved(self, model: Model, before: int) -> None:
        """A registered model whose latest checkpoint a pull changed trains and serves
        on from it (as after a fork); the caller holds the model's lock."""
        served = (
            self._service is not None and f"{model.project}/{model.storage_name}" in self._served
        )
        if served and self._service is not None and await self.get_step(model) != before:
            await asyncio.to_thread(
                self._service.continue_from_latest, model.project, model.storage_name
            )

    async def _forget(self, model: Model, deleted: list[int]) -> None:
        if deleted and self._service is not None:  # an engine may still hold them
            await asyncio.to_thread(
                self._service.forget_deleted_checkpoints, model.project, model.storage_name
            )

    async def delete(self, model: Model) -> None:
        """Delete the model: stop serving and training it (the memory its adapter held is
        freed), then remove its files under `path`, as `ServerlessBackend.delete` does on
        the server. The same name registered again starts afresh at step 0."""
        async with self._lock(model):
            key = f"{model.project}/{model.storage_name}"
            if self._service is not None and key in self._served:
                await asyncio.to_thread(self._service.unload, model.project, model.storage_name)
            self._served.discard(key)
            await asyncio.to_thread(self._store(model).delete)

    async def close(self) -> None:
        """Stop the model service (and its process); stored files stay."""
        if self._service is not None:
            service, self._service = self._service, None
            self._served.clear()
            await asyncio.to_thread(service.close)

    async def __aenter__(self) -> LocalBackend:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def _transport(service: ServiceAPI) -> Any:
    """The child process's transport, which names the child if it died; None in-process."""
    from ...runtime.process import ServiceProcess
    from ...runtime.service_transport import service_transport

    return service_transport(service) if isinstance(service, ServiceProcess) else None
