"""W&B, Weave and Langfuse, each on when its user turns it on, each off (and not imported) otherwise.

    wandb_run       every history.jsonl row into one W&B run per model, resumed across processes
    weave_trace     `weave.init` for the model's project; each trajectory keeps its op's call id
    langfuse_trace  one Langfuse trace per rollout of a gather, its chat completions inside

`art.core.data.observe` calls the hooks below when a service is switched on; nothing here runs,
and none of the three libraries is imported, while every switch is off. No service that is
unreachable, misconfigured or missing a key ever fails a rollout or a training step: each
logs one warning on the `art.observability` logger saying what it could not do.
"""

from __future__ import annotations

from .langfuse_trace import chat_trace, rollout_trace
from .wandb_run import finish_wandb_runs, report_history, update_wandb_config
from .weave_trace import init_weave, weave_links

__all__ = [
    "chat_trace",
    "finish_wandb_runs",
    "init_weave",
    "report_history",
    "rollout_trace",
    "update_wandb_config",
    "weave_links",
]
