"""`Replica`: one inference engine in a Ray actor, serving the adapters it is told to load.

The router in the driver renders prompts and tokenizes; a replica gets token ids and
samples with its own copy of the base model. It picks and starts its engine itself
(`engines.start`), on its own node: vLLM where that node has CUDA and vLLM's
environment, else the transformers engine, with every `EngineArgs` field honoured as
in LocalBackend. It serves checkpoints only: each published adapter is loaded by name
(`load_adapter`) before any request names it.

A grammar's matcher does not pickle, so a constrained request carries the grammar's
source, which the replica compiles (once per distinct grammar) against its own tokenizer.
It remembers the requests it served last (adapter and prompt), which is how a test or an
operator sees where the router sent a conversation.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...core.data import dev
from ...runtime import models
from ...runtime.engines.base import EngineSpec, Sample, SamplingParams
from ...runtime.engines.start import choose_engine, start_engine

_REMEMBERED_PROMPTS = 256
_MAX_LORAS = 8


class Replica:
    """An engine for one base model inside a Ray actor (`ray.remote(Replica)`)."""

    def __init__(
        self,
        index: int,
        resolved: models.ResolvedModel,
        config_json: dict[str, Any],
        dtype: str,
        context_length: int,
        stop_token_ids: frozenset[int],
        log_dir: str,
    ) -> None:
        from transformers import AutoTokenizer

        self.index = index
        config = dev.InternalModelConfig(**config_json)
        self._served: deque[tuple[str | None, list[int]]] = deque(maxlen=_REMEMBERED_PROMPTS)
        self._requests = 0
        self._adapters: list[str] = []
        self.engine_name = choose_engine(config)  # this node's CUDA and venv decide
        spec = EngineSpec(
            resolved,
            config,
            AutoTokenizer.from_pretrained(resolved.weights),
            dtype=dtype,
            context_length=context_length,
            stop_token_ids=stop_token_ids,
            log_dir=_log_dir(Path(log_dir)),
            index=self.index,
            max_loras=_MAX_LORAS,
        )
        self.engine = start_engine(spec)  # no trainer here: the engine has its own weights

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        n: int,
        adapter: str | None,
        grammar: tuple[str, str] | None,
    ) -> list[Sample]:
        """Sample `n` sequences; `grammar` is (key, source) of the request's grammar."""
        self._requests += 1
        self._served.append((adapter, prompt_ids))
        if grammar is not None:
            params = replace(params, grammar=self.engine.grammars.from_source(*grammar))
        return await self.engine.generate(prompt_ids, params, n=n, adapter=adapter)

    async def load_adapter(self, name: str, directory: str) -> None:
        """Serve the checkpoint in `directory` as `name`."""
        # Off the actor's event loop: loading waits for the running batch to finish.
        await asyncio.to_thread(self.engine.load_adapter, name, Path(directory))
        self._adapters.append(name)

    async def unload_adapter(self, name: str) -> None:
        await asyncio.to_thread(self.engine.unload_adapter, name)
        self._adapters.remove(name)

    def status(self) -> dict[str, Any]:
        """What this replica has done: requests served, the recent ones (adapter, prompt
        ids), adapters loaded, and the engine it runs."""
        return {
            "index": self.index,
            "engine": self.engine_name,
            "merged": self.engine.samples_merged,
            "requests": self._requests,
            "served": list(self._served),
            "adapters": list(self._adapters),
            "active_rows": self.engine.active_rows,
        }

    def pid(self) -> int:
        import os

        return os.getpid()

    def close(self) -> None:
        self.engine.close()


def _log_dir(wanted: Path) -> Path:
    """The backend's log directory on this node, where an engine's server log (vLLM's
    `vllm-<index>.log`) is found beside the local engines'; a node that cannot write that
    path (another machine of the cluster) logs to a temporary directory instead."""
    try:
        wanted.mkdir(parents=True, exist_ok=True)
        return wanted
    except OSError:
        return Path(tempfile.mkdtemp(prefix="art-replica-"))


__all__ = ["Replica"]
