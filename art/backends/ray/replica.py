"""`Replica`: one inference engine in a Ray actor, serving the adapters it is told to load.

The router in the driver renders prompts and tokenizes; a replica gets token ids and
samples with its own copy of the base model (the transformers engine on CPU, vLLM where
the replica has a GPU). It serves checkpoints only: each published adapter is loaded by
name (`load_adapter`) before any request names it.

A grammar's matcher does not pickle, so a constrained request carries the grammar's
source, which the replica compiles (once per distinct grammar) against its own tokenizer.
It remembers the requests it served last (adapter and prompt), which is how a test or an operator sees where
the router sent a conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...core import dev
from ..local import models
from ..local.engines.base import Engine, EngineName, Sample, SamplingParams

_REMEMBERED_PROMPTS = 256


class Replica:
    """An engine for one base model inside a Ray actor (`ray.remote(Replica)`)."""

    def __init__(
        self,
        index: int,
        resolved: models.ResolvedModel,
        config_json: dict[str, Any],
        engine_name: EngineName,
        dtype: str,
        context_length: int,
        stop_token_ids: frozenset[int],
    ) -> None:
        self.index = index
        config = dev.InternalModelConfig(**config_json)
        self._lock = threading.Lock()
        self._served: deque[tuple[str | None, list[int]]] = deque(maxlen=_REMEMBERED_PROMPTS)
        self._requests = 0
        self._adapters: list[str] = []
        if engine_name == "vllm":
            self.engine = self._vllm(resolved, config, dtype, context_length, stop_token_ids)
            self.model: Any = None
            return
        from ..local.engines.transformers.engine import TransformersEngine
        from ..local.torch_thread import shared as torch_thread

        # On the thread the engine decodes on: one OpenMP team per process (torch_thread.py).
        self.model, tokenizer = torch_thread().run(lambda: models.load(resolved, dtype, _device()))
        self.engine = torch_thread().run(
            lambda: TransformersEngine(
                self.model,
                tokenizer,
                max_num_seqs=config.engine_args.max_num_seqs,
                model_lock=self._lock,
                select_adapter=self._select_adapter,
                stop_token_ids=set(stop_token_ids),
            )
        )

    @staticmethod
    def _vllm(
        resolved: models.ResolvedModel,
        config: dev.InternalModelConfig,
        dtype: str,
        context_length: int,
        stop_token_ids: frozenset[int],
    ) -> Engine:
        import tempfile

        from transformers import AutoTokenizer

        from ..local.engines.vllm.engine import start_vllm_engine

        tokenizer = AutoTokenizer.from_pretrained(resolved.weights)
        return start_vllm_engine(
            resolved,
            tokenizer,
            config,
            dtype=dtype,
            context_length=context_length,
            stop_token_ids=set(stop_token_ids),
            log_path=Path(tempfile.mkdtemp(prefix="art-replica-")) / "vllm.log",
            max_loras=8,
        )

    def _select_adapter(self, adapter: str | None) -> contextlib.AbstractContextManager[None]:
        if adapter is None:
            if hasattr(self.model, "disable_adapter"):
                return self.model.disable_adapter()  # type: ignore[no-any-return]
            return contextlib.nullcontext()
        self.model.set_adapter(adapter)
        return contextlib.nullcontext()

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
        await asyncio.to_thread(self._load_adapter, name, directory)

    async def unload_adapter(self, name: str) -> None:
        await asyncio.to_thread(self.engine.unload_adapter, name)
        self._adapters.remove(name)

    def _load_adapter(self, name: str, directory: str) -> None:
        if self.model is None or hasattr(self.model, "peft_config"):
            self.engine.load_adapter(name, Path(directory))
        else:  # the first adapter turns the base into a PeftModel
            from ..local.engines.transformers.engine import TransformersEngine

            assert isinstance(self.engine, TransformersEngine)
            self.engine.exclusive(lambda: self._wrap_in_peft(name, directory))
        self._adapters.append(name)

    def _wrap_in_peft(self, name: str, directory: str) -> None:
        from peft import PeftModel

        self.model = PeftModel.from_pretrained(self.model, directory, adapter_name=name)
        self.model.eval()
        self.engine.model = self.model  # type: ignore[attr-defined]

    def status(self) -> dict[str, Any]:
        """What this replica has done: requests served, the recent ones (adapter, prompt
        ids), adapters loaded."""
        return {
            "index": self.index,
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


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


__all__ = ["Replica"]
