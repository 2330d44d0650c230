"""ART's `art.utils` import path: the helpers ART exports, and its submodules.

`art.utils.iterate_dataset`, `.limit_concurrency`, `.retry`, `.format_message`,
`.get_model_step`, `.log_http_errors` and `.litellm` are modules here as in ART, so
`from art.utils.litellm import convert_litellm_choice_to_openai` works unchanged.
"""

# Imported from the submodules (as ART does), so importing a submodule later does not
# replace the function of the same name on this package.
from ..core.data.not_built import not_built_function
from .format_message import format_message
from .get_model_step import get_model_step
from .iterate_dataset import DatasetBatch, iterate_dataset
from .limit_concurrency import limit_concurrency
from .log_http_errors import log_http_errors
from .retry import retry

record_provenance = not_built_function(
    "art.utils.record_provenance",
    "it marks a W&B artifact's metadata through W&B's API, which this version never "
    "calls (checkpoints are local files, or art serve's); nothing is recorded",
)


def init_weave_with_wandb(project: str) -> None:
    """Start Weave for `project` (ART's helper), so `@weave.op` rollouts are traced.

    Where Weave cannot work (`WEAVE_DISABLED=true`, not installed, offline, no W&B key,
    no server) this logs one warning saying why and returns: it never raises for that.
    """
    from ..integrations.observability import init_weave

    init_weave(project)


__all__ = [
    "DatasetBatch",
    "format_message",
    "get_model_step",
    "init_weave_with_wandb",
    "iterate_dataset",
    "limit_concurrency",
    "log_http_errors",
    "record_provenance",
    "retry",
]
