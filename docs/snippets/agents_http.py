"""An agent posting raw JSON with `requests` (or aiohttp), trained as it is."""

import aiohttp

import art


# --8<-- [start:requests]
async def requests_agent(model: art.Model, question: str) -> None:
    session = art.capture_requests_session()  # a requests.Session that records
    answer = session.post(
        f"{model.inference_base_url}/chat/completions",
        headers={"Authorization": f"Bearer {model.inference_api_key}"},
        json={
            "model": model.get_inference_name(),
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 8,
        },
        timeout=120,
    )
    answer.raise_for_status()


# --8<-- [end:requests]


# --8<-- [start:aiohttp]
async def aiohttp_agent(model: art.Model, question: str) -> None:
    body = {
        "model": model.get_inference_name(),
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 8,
    }
    headers = {"Authorization": f"Bearer {model.inference_api_key}"}
    async with (
        aiohttp.ClientSession(trace_configs=[art.capture_trace_config()]) as session,
        session.post(
            f"{model.inference_base_url}/chat/completions", json=body, headers=headers
        ) as answer,
    ):
        answer.raise_for_status()
        await answer.json()


# --8<-- [end:aiohttp]
