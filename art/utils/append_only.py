"""ART's `art.utils.append_only`: the chat helpers, and refusals of the engine internals.

In ART this module (from its `art_inference` package) maps the tokens its vLLM and SGLang
patches re-render for a conversation's history back to the ids first sampled, and patches
DeepSeek's and Harmony's renderers. Here the endpoint returns each choice's exact sampled
token ids and the trainer trains on those, so there is nothing to map back, and no
third-party renderer is patched: those names raise `NotBuiltError` saying so. The plain
chat helpers work as ART's.
"""

from ..core.capture.chat_deltas import (
    has_renderable_tool_arguments,
    merge_chat_delta,
    openai_tool_arguments,
    preserves_history,
)
from ..core.data.not_built import not_built_class, not_built_function

_EXACT_IDS = (
    "ART maps re-rendered history tokens back to the ids its vLLM/SGLang patches first "
    "sampled; here the endpoint returns each choice's exact token ids and training uses "
    "them, so there is nothing to map: log the Choice objects the endpoint returned"
)
_NO_PATCHING = (
    "ART patches {} in the inference engine's process; this version patches no "
    "third-party code (its endpoint renders the chat template itself)"
)

PrefixObservation = not_built_class("art.utils.append_only.PrefixObservation", _EXACT_IDS)
chat_prefix_scope = not_built_function("art.utils.append_only.chat_prefix_scope", _EXACT_IDS)
chat_prefix_eligible = not_built_function("art.utils.append_only.chat_prefix_eligible", _EXACT_IDS)
output_prefix_observations = not_built_function(
    "art.utils.append_only.output_prefix_observations", _EXACT_IDS
)
chat_prefix_observations = not_built_function(
    "art.utils.append_only.chat_prefix_observations", _EXACT_IDS
)
chat_response_prefixes = not_built_function(
    "art.utils.append_only.chat_response_prefixes", _EXACT_IDS
)
shifted_span = not_built_function("art.utils.append_only.shifted_span", _EXACT_IDS)
aligned_values = not_built_function("art.utils.append_only.aligned_values", _EXACT_IDS)
patch_deepseek_renderer = not_built_function(
    "art.utils.append_only.patch_deepseek_renderer",
    _NO_PATCHING.format("DeepSeek's chat renderer"),
)
patch_harmony = not_built_function(
    "art.utils.append_only.patch_harmony", _NO_PATCHING.format("openai_harmony's renderer")
)

__all__ = [
    "PrefixObservation",
    "aligned_values",
    "chat_prefix_eligible",
    "chat_prefix_observations",
    "chat_prefix_scope",
    "chat_response_prefixes",
    "has_renderable_tool_arguments",
    "merge_chat_delta",
    "openai_tool_arguments",
    "output_prefix_observations",
    "patch_deepseek_renderer",
    "patch_harmony",
    "preserves_history",
    "shifted_span",
]
