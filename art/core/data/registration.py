"""A model registered again: what it may and may not change.

A trainable model's checkpoints are LoRA adapters of one base model, of one shape. A
registration that names another `base_model`, or another LoRA shape (`peft_args`), than
the model's stored record cannot resume from those checkpoints, so it is refused, naming
the field. Other `_internal_config` fields (the engine, its arguments, the trainer's
optimizer settings) may change between runs; within one backend process, a model (or a
base model its siblings share) is loaded with one config, so a registration there that
changes any field is refused too, rather than silently served with the old one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import dev
from .errors import ConfigError

_CHECKPOINT_SHAPE = ("peft_args",)  # what the stored checkpoints were trained with


def refuse_changed_registration(
    existing: dict[str, Any] | None, record: dict[str, Any], *, where: str, loaded: bool = False
) -> None:
    """Raise `ConfigError` if `record` re-registers the model of `existing` as another.

    `existing`: the model's stored record (`model.json`), or the one it is loaded with
    in this process (`loaded=True`: then every `_internal_config` field must match).
    `where`: the store's directory or the server, for the message.
    """
    if existing is None:
        return
    if existing.get("base_model") != record.get("base_model"):
        raise ConfigError(
            "base_model",
            f"model {record.get('name')!r} in {where} was trained from "
            f"{existing.get('base_model')!r}, not {record.get('base_model')!r}",
            "Give the new run its own name, or keep the original base_model",
        )
    if record.get("base_model") is None:  # not trainable: no config to compare
        return
    old = _config(existing.get("internal_config"))
    new = _config(record.get("internal_config"))
    if loaded:
        refuse_changed_config(
            old,
            new,
            fields=None,
            what=f"model {record.get('name')!r}",
            fix="Register it with the config it was loaded with, or close this backend "
            "(`await backend.close()`) and register it with the new config in a new one",
        )
    else:
        refuse_changed_config(
            old,
            new,
            fields=_CHECKPOINT_SHAPE,
            what=f"model {record.get('name')!r}'s checkpoints in {where}",
            fix="Keep the LoRA shape the model was trained with, or give the new run its own name",
        )


def refuse_changed_config(
    old: dev.InternalModelConfig,
    new: dev.InternalModelConfig,
    *,
    fields: Iterable[str] | None,
    what: str,
    fix: str,
) -> None:
    """`ConfigError` naming each of `fields` (None: all) where `new` differs from `old`."""
    before, after = old.model_dump(mode="json"), new.model_dump(mode="json")
    keys = list(after) if fields is None else list(fields)
    changed = [key for key in keys if before.get(key) != after.get(key)]
    if not changed:
        return
    listed = "; ".join(f"{key}: {before.get(key)!r} -> {after.get(key)!r}" for key in changed)
    raise ConfigError(
        f"_internal_config.{changed[0]}",
        f"differs from the config of {what} ({listed})",
        fix,
    )


def _config(raw: dict[str, Any] | None) -> dev.InternalModelConfig:
    stored = dict(raw or {})
    # model.json written before the trainer was chosen by `trainer_backend` holds it as
    # `trainer` (always None or 'peft' then: 'unsloth' was refused at register).
    if "trainer" in stored and "trainer_backend" not in stored:
        stored["trainer_backend"] = stored.pop("trainer")
    return dev.InternalModelConfig(**stored)


__all__ = ["refuse_changed_config", "refuse_changed_registration"]
