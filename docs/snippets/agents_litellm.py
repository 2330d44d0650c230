"""An agent calling LiteLLM, trained as it is: LiteLLM takes the capturing OpenAI client."""

import litellm
from openai import AsyncOpenAI

import art


# --8<-- [start:agent]
async def litellm_agent(model: art.Model, question: str) -> None:
    await litellm.acompletion(
        model=f"openai/{model.get_inference_name()}",
        messages=[{"role": "user", "content": question}],
        max_tokens=8,
        client=AsyncOpenAI(
            base_url=model.inference_base_url,
            api_key=model.inference_api_key,
            http_client=art.capture_http_client(),
        ),
    )


# --8<-- [end:agent]
