"""Weave: rollouts decorated with `@weave.op` traced in the model's W&B project.

Weave traces an op's calls once `weave.init(project)` has run. `art` runs it where ART
does: when a model's W&B run starts online (ART's LocalBackend did so), and when asked,
`art.utils.init_weave_with_wandb(project)`. A trajectory created inside a traced op
keeps the op call's ids in its metadata (`weave_call_id`, `weave_trace_id`), so each
step's Parquet log links every rollout to its trace. `WEAVE_DISABLED=true` (Weave's own
switch) turns all of it off.

Weave has no local mode: it needs W&B credentials and a W&B (or self-hosted) server. It
would ask for a login on a terminal when it has no key, so without one `art` does not
start it and says so once.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from ._warn import warn_once

if TYPE_CHECKING:
    from ...core.data.trajectories import MetadataValue


def _disabled() -> bool:
    return os.environ.get("WEAVE_DISABLED", "").strip().lower() == "true"


def init_weave(project: str) -> Any:
    """`weave.init(project)` where Weave can work; else None and one warning saying why."""
    if _disabled():
        return None
    try:
        import weave
        from weave.wandb_interface.context import get_wandb_auth_context
    except ImportError:
        warn_once(
            "weave-missing",
            "Weave is not installed (pip install 'art-grpo[weave]'): @weave.op rollouts "
            "are not traced",
        )
        return None
    if os.environ.get("WANDB_MODE", "").strip().lower() in ("offline", "dryrun", "disabled"):
        warn_once(
            "weave-offline",
            f"Weave has no offline mode: with WANDB_MODE={os.environ['WANDB_MODE']}, "
            f"@weave.op rollouts of {project} are not traced",
        )
        return None
    if get_wandb_auth_context() is None:
        warn_once(
            "weave-key",
            f"Weave needs W&B credentials (WANDB_API_KEY or `wandb login`); without them "
            f"@weave.op rollouts of {project} are not traced",
        )
        return None
    try:
        return weave.init(project)
    except Exception as error:
        warn_once(
            f"weave-init:{project}",
            f"Weave could not start for {project} ({error}); @weave.op rollouts are not "
            "traced and training goes on",
        )
        return None


def weave_links() -> dict[str, MetadataValue]:
    """The ids of the Weave call this code runs in, if any (none while Weave is off)."""
    weave = sys.modules.get("weave")
    if weave is None or _disabled():
        return {}
    try:
        call = weave.get_current_call()
    except Exception as error:  # a trajectory is never lost to a tracing problem
        warn_once(
            "weave-call",
            f"Weave could not say which call is running ({type(error).__name__}: {error}); "
            "trajectories are not linked to their traces",
        )
        return {}
    if call is None or not call.id:  # no op running, or Weave not initialised
        return {}
    links: dict[str, MetadataValue] = {"weave_call_id": call.id}
    if call.trace_id:
        links["weave_trace_id"] = call.trace_id
    return links


__all__ = ["init_weave", "weave_links"]
