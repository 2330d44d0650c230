"""A JSON-schema answer and a forced tool call, sampled under constrained decoding."""

import json

import art

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},  # bound strings: see below
        "population": {"type": "integer"},
    },
    "required": ["city", "population"],
    "additionalProperties": False,
}
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup_capital",
        "description": "Look up the capital city of a country.",
        "parameters": {
            "type": "object",
            "properties": {"country": {"type": "string", "maxLength": 40}},
            "required": ["country"],
        },
    },
}


async def structured(model: art.Model) -> dict[str, object]:
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(),
        messages=[{"role": "user", "content": "The largest city of France, as JSON."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "city", "schema": SCHEMA, "strict": True},
        },
        max_tokens=64,
    )
    return json.loads(completion.choices[0].message.content or "")  # valid under SCHEMA


async def tool_call(model: art.Model) -> str:
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(),
        messages=[{"role": "user", "content": "What is the capital of Peru?"}],
        tools=[LOOKUP],
        tool_choice={"type": "function", "function": {"name": "lookup_capital"}},
        max_tokens=32,
    )
    call = (completion.choices[0].message.tool_calls or [])[0]
    return json.loads(call.function.arguments)["country"]  # arguments under the schema
