"""ART's chat-template keys on `InternalModelConfig`, as the renderer applies them.

`chat_template_kwargs` reach the template (a request's own override them),
`chat_template_content_format` gives a message's content as a string or as parts ("auto"
detects which the template reads, as vLLM does), and `chat_template_tool_schema_format`
orders a tool's keys as vLLM's OpenAI server writes them. The same rendering reaches
training's tokenizer; `test_local_backend_projects` shows it through the endpoint.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from transformers import AutoTokenizer

import art
from art.runtime import models
from art.runtime.chat_format import (
    TOOL_CHATML_TEMPLATE,
    ChatRendering,
    chat_rendering,
    render_prompt,
)
from art.runtime.trainer.tokenize import tokenize_trajectory

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
# Reads a message's content as parts, a template variable, and the first tool's schema.
PARTS_TEMPLATE = (
    "{{ greeting }}\n{% if tools %}{{ tools[0] | tojson }}{{ '\\n' }}{% endif %}"
    "{% for m in messages %}{{ m.role }}:{% for part in m.content %}[{{ part.text }}]"
    "{% endfor %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)
# Reads a message's content as one string.
STRING_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
TOOL = {
    "function": {"parameters": {"type": "object"}, "name": "lookup", "description": "Finds."},
    "type": "function",
}
PARTS = [{"type": "text", "text": "Name"}, {"type": "text", "text": "a colour."}]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(models.resolve(BASE).weights)


def _config(**fields: Any) -> art.dev.InternalModelConfig:
    return art.dev.InternalModelConfig(**fields)


def test_auto_reads_the_template_for_how_it_takes_content(tokenizer: Any) -> None:
    assert chat_rendering(_config(chat_template=PARTS_TEMPLATE), tokenizer).content_format == (
        "openai"
    )
    indexed = PARTS_TEMPLATE.replace("m.content", "m['content']")
    assert chat_rendering(_config(chat_template=indexed), tokenizer).content_format == "openai"
    assert chat_rendering(_config(chat_template=STRING_TEMPLATE), tokenizer).content_format == (
        "string"
    )
    default = chat_rendering(_config(), tokenizer)  # SmolLM2: our tool template
    assert (default.template, default.content_format) == (TOOL_CHATML_TEMPLATE, "string")
    chosen = _config(chat_template=PARTS_TEMPLATE, chat_template_content_format="string")
    assert chat_rendering(chosen, tokenizer).content_format == "string"


def test_the_content_format_gives_the_template_a_string_or_parts(tokenizer: Any) -> None:
    as_string = ChatRendering(template=STRING_TEMPLATE, content_format="string")
    text = render_prompt(tokenizer, [{"role": "user", "content": PARTS}], None, as_string)
    assert text == "user:Name\na colour.\nassistant:"  # parts joined by newlines, as vLLM does

    as_parts = ChatRendering(template=PARTS_TEMPLATE, content_format="openai")
    text = render_prompt(tokenizer, [{"role": "user", "content": "Hi."}], None, as_parts)
    assert text == "\nuser:[Hi.]\nassistant:"  # a string became one text part
    # Without the key, the same template given a string loops over its characters.
    text = render_prompt(
        tokenizer, [{"role": "user", "content": "Hi."}], None, ChatRendering(PARTS_TEMPLATE)
    )
    assert text == "\nuser:[][][]\nassistant:"


def test_template_kwargs_reach_the_template_and_a_requests_own_win(tokenizer: Any) -> None:
    rendering = chat_rendering(
        _config(chat_template=PARTS_TEMPLATE, chat_template_kwargs={"greeting": "Ahoy"}),
        tokenizer,
    )
    messages = [{"role": "user", "content": PARTS}]
    assert render_prompt(tokenizer, messages, None, rendering).startswith("Ahoy\n")
    overridden = render_prompt(tokenizer, messages, None, rendering, kwargs={"greeting": "Hi"})
    assert overridden.startswith("Hi\n")


def test_vllm_openai_orders_a_tools_keys_as_vllm_writes_them(tokenizer: Any) -> None:
    def first_tool(fmt: str) -> list[str]:
        rendering = chat_rendering(
            _config(chat_template=PARTS_TEMPLATE, chat_template_tool_schema_format=fmt),
            tokenizer,
        )
        text = render_prompt(tokenizer, [{"role": "user", "content": PARTS}], [TOOL], rendering)
        schema = json.loads(text.splitlines()[1])
        return [*schema, *schema["function"]]

    assert first_tool("default") == ["function", "type", "parameters", "name", "description"]
    assert first_tool("vllm_openai") == ["type", "function", "name", "description", "parameters"]


def test_training_tokenizes_with_the_same_rendering(tokenizer: Any) -> None:
    """An assistant turn without token ids (SFT data, or allowed re-encoding) is found
    after the prompt exactly as the rendering writes it, kwargs and parts included."""
    rendering = chat_rendering(
        _config(chat_template=PARTS_TEMPLATE, chat_template_kwargs={"greeting": "Ahoy"}),
        tokenizer,
    )
    messages = [{"role": "user", "content": PARTS}]
    trajectory = art.Trajectory(
        messages_and_choices=[*messages, {"role": "assistant", "content": "Red."}], reward=1.0
    )
    (sequence,) = tokenize_trajectory(
        trajectory,
        tokenizer,
        group_index=0,
        trajectory_index=0,
        rendering=rendering,
        allow_training_without_logprobs=True,
    )
    prompt = render_prompt(tokenizer, messages, None, rendering)
    untrained = sequence.token_ids[: sequence.trained.index(True)]
    assert tokenizer.decode(untrained) == prompt
    assert tokenizer.decode(sequence.token_ids) == prompt + "[Red.]\n"


def test_an_unknown_format_is_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match="chat_template_content_format"):
        art.dev.InternalModelConfig(chat_template_content_format="markdown")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="chat_template_tool_schema_format"):
        art.dev.InternalModelConfig(chat_template_tool_schema_format="xml")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rollout_weights_mode"):
        art.dev.InternalModelConfig(rollout_weights_mode="fused")  # type: ignore[arg-type]
