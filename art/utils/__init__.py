"""ART's `art.utils` import path: the helpers ART exports, and its submodules.

`art.utils.iterate_dataset`, `.limit_concurrency`, `.retry`, `.format_message`,
`.get_model_step`, `.log_http_errors` and `.litellm` are modules here as in ART, so
`from art.utils.litellm import convert_litellm_choice_to_openai` works unchanged.
"""

from ..core.not_built import not_built_function

# Imported from the submodules (as ART does), so importing a submodule later does not
# replace the function of the same name on this package.
from .format_message import format_message
from .get_model_step import get_model_step
from .iterate_dataset import DatasetBatch, iterate_dataset
from .limit_concurrency import limit_concurrency
from .log_http_errors import log_http_errors
from .retry import retry

init_weave_with_wandb = not_built_function(
    "art.utils.init_weave_with_wandb",
    "call weave.init(project) yourself; art does not start W&B Weave for you",
)

__all__ = [
    "DatasetBatch",
    "format_message",
    "get_model_step",
    "init_weave_with_wandb",
    "iterate_dataset",
    "limit_concurrency",
    "log_http_errors",
    "retry",
]
