"""`art.get_tokenizer`: the tokenizer the endpoint and the trainers use for a base model.

ART 0.5.23's call. `base_model` is resolved as a `TrainableModel`'s is (the embedded
default model, a local model or LoRA adapter directory, a hub name), so the tokenizer is
the one that renders and tokenizes that model's conversations here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.data.errors import ConfigError
from .models import DEFAULT_MODEL, resolve

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def get_tokenizer(
    base_model: str, *, revision: str | None = None, **kwargs: Any
) -> PreTrainedTokenizerBase:
    """The Hugging Face tokenizer of `base_model`, as training and serving load it.

    `revision` and the other keyword arguments go to `AutoTokenizer.from_pretrained`, as
    in ART. A revision names a commit of a hub repository, so with a local directory (the
    embedded default model's included) it is refused rather than not applied.
    """
    from transformers import AutoTokenizer

    resolved = resolve(base_model)
    if revision is not None:
        if Path(resolved.weights).is_dir():
            raise ConfigError(
                "revision",
                f"{base_model!r} loads from the local directory {resolved.weights}, which has "
                "no revisions",
                f"Remove revision, or name a hub repository other than {DEFAULT_MODEL}",
            )
        kwargs["revision"] = revision
    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(resolved.weights, **kwargs)
    return tokenizer


__all__ = ["get_tokenizer"]
