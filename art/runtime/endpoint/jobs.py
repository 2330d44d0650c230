"""A request made ready for the engine, and run on it: the part every protocol shares.

Each route (chat completions, completions, responses, messages) reads its body (the last
three with `read_request`), finds its model's route (`find_route`) and releases it once
(`once`), and reads its own protocol into a `ChatCompletionRequest`-shaped body where it is
a chat; then `ready_job` renders the prompt, applies the tool policy and compiles the
grammar (off the event loop), and `run_job` samples, cancelled as soon as the client
disconnects. Bad input raises `ApiError`, which each route answers in its protocol's error
shape.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.requests import Request

from ..chat_format import render_prompt
from ..engines.base import Sample, SamplingParams
from ..engines.structured import Grammar, GrammarError, Grammars
from .request import ApiError, ChatCompletionRequest, log_rejected, read_body
from .response import Job, Route

if TYPE_CHECKING:
    from .response import Router

DEFAULT_MAX_TOKENS = 2048  # when a request sets none: a small model can ramble for a long time

Parsed = TypeVar("Parsed")


async def read_request(
    request: Request, max_body_bytes: int, parse: Callable[[bytes], Parsed]
) -> Parsed:
    """The body of `request` (a 413 past `max_body_bytes`), parsed by `parse` in a worker
    thread; the raw bytes are not kept alive while the request decodes."""
    raw = await read_body(request, max_body_bytes)
    return await asyncio.to_thread(parse, raw)


async def find_route(router: Router, model: str) -> Route:
    """`router`'s route for `model` (looked up in a worker thread), or a 404 naming it."""
    try:
        return await asyncio.to_thread(router.route, model)
    except KeyError as error:
        raise ApiError(404, str(error.args[0]), param="model", code="model_not_found") from error


def once(release: Callable[[], None]) -> Callable[[], None]:
    """`release`, run on the first call only: a streamed request ends two ways (its stream
    closes, and a background task runs for a stream that never started), and Starlette
    runs a sync background task on a worker thread."""
    lock = threading.Lock()
    done = False

    def release_once() -> None:
        nonlocal done
        with lock:
            if done:
                return
            done = True
        release()

    return release_once


async def ready_job(body: ChatCompletionRequest, route: Route) -> Job:
    """`body` made ready for `route`'s engine: prompt ids, sampling, tool policy, grammar."""
    job = await asyncio.to_thread(prepare_job, body, route)
    constrained = job.prefill or (body.response_format or {}).get("type", "text") != "text"
    if constrained:  # compiling may take a while: off the event loop
        grammar = await asyncio.to_thread(_grammar, body, route, job)
        job = replace(job, params=replace(job.params, grammar=grammar))
    return job


async def run_job(request: Request, route: Route, job: Job, n: int = 1) -> list[Sample]:
    """The `n` samples of `job`, cancelled as soon as the client disconnects."""
    generation = route.engine.generate(job.prompt_ids, job.params, n=n, adapter=route.adapter)
    return await _unless_disconnected(request, generation)


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def _unless_disconnected(request: Request, work: Awaitable[list[Sample]]) -> list[Sample]:
    """`await work`, cancelled as soon as the client disconnects.

    uvicorn does not cancel a handler whose client went away; once the body is read, the
    next ASGI message the request receives is its `http.disconnect`.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():
        log_rejected(request, 499, "the client disconnected; its generation was cancelled")
        raise ClientGone
    return task.result()


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def prepare_job(body: ChatCompletionRequest, route: Route) -> Job:
    tools = body.tools if body.tool_choice != "none" else None
    if (
        tools
        and route.rendering.template is None
        and "tools" not in str(route.tokenizer.chat_template)
    ):
        raise ApiError(400, "this model's chat template has no tool support", param="tools")
    prefill, forced = "", None
    names = [tool["function"]["name"] for tool in tools or []]
    if tools and isinstance(body.tool_choice, dict):
        forced = body.tool_choice.get("function", {}).get("name")
        if forced not in names:
            raise ApiError(
                400, f"tool_choice names {forced!r}, which is not in tools", param="tool_choice"
            )
    elif tools and body.tool_choice == "required":
        forced = names[0] if len(names) == 1 else None
        prefill = "<tool_call>"
    if forced is not None:
        # The call is written up to its arguments; the model writes those.
        prefill = '<tool_call>{"name": ' + json.dumps(forced) + ', "arguments": '
    if prefill and body.continue_final_message:
        raise ApiError(
            400,
            "tool_choice: a forced tool call opens its own assistant text; it cannot continue "
            "the last message (continue_final_message): use tool_choice 'auto'",
            param="tool_choice",
        )
    try:
        text = render_prompt(
            route.tokenizer,
            body.messages,
            tools,
            route.rendering,
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
            kwargs=body.chat_template_kwargs,
        )
    except Exception as error:  # a template that cannot render these messages
        raise ApiError(400, f"messages: cannot be rendered: {error}", param="messages") from error
    prompt_ids: list[int] = route.tokenizer(text + prefill, add_special_tokens=False).input_ids
    asked = body.max_completion_tokens or body.max_tokens
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    params = SamplingParams(
        max_tokens=token_budget(route, prompt_ids, "messages", asked or None, DEFAULT_MAX_TOKENS),
        temperature=body.temperature,
        top_p=body.top_p,
        stop=stop,
        seed=body.seed,
        top_logprobs=body.top_logprobs or 0,
    )
    return Job(prompt_ids, params, prefill, forced, tool_names=tuple(names))


def token_budget(
    route: Route, prompt_ids: list[int], param: str, asked: int | None, default: int
) -> int:
    """The tokens a request may sample after `prompt_ids` (sent as `param`): `asked` (its
    `max_tokens`, else `default`), cut to the room `route`'s context has left, as vLLM
    does (0.32's `get_max_tokens`), so a budget past the context ends with
    `finish_reason: "length"` where the context does; a 400 if the prompt fills it."""
    room = route.context_length - len(prompt_ids)
    if room < 1:
        raise ApiError(
            400,
            f"{param}: the prompt has {len(prompt_ids)} tokens; the model's context is "
            f"{route.context_length}",
            param=param,
            code="context_length_exceeded",
        )
    return min(default if asked is None else asked, room)


def _grammar(body: ChatCompletionRequest, route: Route, job: Job) -> Grammar | None:
    """The grammar the completion is sampled under: a forced call's arguments, else the
    `response_format` (a turn that must call a tool has no room for other JSON)."""
    grammars = route.engine.grammars
    if job.prefill:
        tools = body.tools or []
        if job.forced_tool is None:
            # `required` among several tools: one call of any of them, named and with
            # arguments that fit that tool's parameters.
            schema = {"anyOf": [_call_schema(tool) for tool in tools]}
            return _tools_grammar(
                grammars, tools, lambda: grammars.json_then(schema, "</tool_call>")
            )
        tool = next(t for t in tools if t["function"]["name"] == job.forced_tool)
        parameters = tool["function"].get("parameters")
        if not isinstance(parameters, dict):
            return None
        return _tools_grammar(
            grammars, tools, lambda: grammars.json_then(parameters, "}</tool_call>"), only=tool
        )
    response_format = body.response_format or {}
    try:
        if response_format.get("type") == "json_object":
            return grammars.json_object()
        if response_format.get("type") == "json_schema":
            spec = response_format["json_schema"]
            return grammars.json_schema(spec["schema"], strict=spec.get("strict") is not False)
    except GrammarError as error:
        raise ApiError(
            400,
            f"response_format: the JSON schema does not compile: {error}",
            param="response_format",
        ) from error
    return None


def _call_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """A `<tool_call>` body for `tool`: its name, then arguments under its parameters."""
    parameters = tool["function"].get("parameters")
    return {
        "type": "object",
        "properties": {
            "name": {"const": tool["function"]["name"]},
            "arguments": parameters if isinstance(parameters, dict) else {"type": "object"},
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _tools_grammar(
    grammars: Grammars,
    tools: list[dict[str, Any]],
    compile: Callable[[], Grammar],
    only: dict[str, Any] | None = None,
) -> Grammar:
    """`compile()`d, or a 400 naming the tool (of `tools`, or just `only`) that breaks it."""
    try:
        return compile()
    except GrammarError as error:
        param = "tools"
        for index, tool in enumerate(tools):
            parameters = tool["function"].get("parameters")
            if (only is not None and tool is not only) or not isinstance(parameters, dict):
                continue
            try:
                grammars.json_then(parameters, "")
            except GrammarError:
                param = f"tools[{index}].function.parameters"
                break
        raise ApiError(400, f"{param}: not a usable JSON schema: {error}", param=param) from error


__all__ = [
    "DEFAULT_MAX_TOKENS",
    "ClientGone",
    "find_route",
    "once",
    "prepare_job",
    "read_request",
    "ready_job",
    "run_job",
    "token_budget",
]
