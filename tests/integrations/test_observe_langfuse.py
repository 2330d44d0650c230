"""Langfuse: each rollout of a gather is a trace carrying its reward, its chat completions inside.

The real langfuse SDK exports OpenTelemetry spans (OTLP/HTTP protobuf) to a receiver on
127.0.0.1 that stands in for a Langfuse server; each case runs in a fresh interpreter,
since Langfuse installs a process-wide OpenTelemetry tracer provider.
"""

from __future__ import annotations

import json
from typing import Any

from observe_helpers import closed_port_url, otlp_spans, recording_server, run_python

# Two rollouts through `model.openai_client()` against the test's chat endpoint, and a
# third that raises after its completion; then Langfuse's queue is flushed.
GATHER = """
import asyncio, sys
import art

async def rollout(model, i):
    trajectory = art.Trajectory(messages_and_choices=[{"role": "user", "content": f"hello {i}"}])
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(), messages=trajectory.messages(), temperature=0.5
    )
    trajectory.messages_and_choices.append(completion.choices[0])
    if i == 2:
        raise ValueError("the tool broke")
    trajectory.reward = 0.25 + i / 2
    trajectory.metrics["chars"] = len(completion.choices[0].message.content)
    return trajectory

async def main():
    model = art.Model(name="echo", project="obs", inference_base_url=URL, inference_api_key="k")
    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup(rollout(model, i) for i in range(3))], pbar_desc=None, max_exceptions=1
    )
    for trajectory in groups[0].trajectories:
        print("TRAJECTORY", trajectory.reward, trajectory.metadata.get("langfuse_trace_id"))
    if "langfuse" in sys.modules:
        from art.integrations.observability.langfuse_trace import wait_for_connection_check
        from langfuse import get_client
        wait_for_connection_check()
        get_client().flush()
    print("modules:", sorted(m for m in sys.modules if m.split(".")[0] in ("wandb", "weave", "langfuse")))

asyncio.run(main())
"""


def _langfuse_answer(method: str, path: str, body: bytes) -> tuple[int, Any]:
    if path.startswith("/api/public/projects"):
        project = {"id": "p1", "name": "obs", "organization": {"id": "o1", "name": "lab"}}
        return 200, {"data": [{**project, "metadata": {}}]}
    return 200, {}


def _env(url: str) -> dict[str, str]:
    return {
        "LANGFUSE_PUBLIC_KEY": "pk-lf-test",
        "LANGFUSE_SECRET_KEY": "sk-lf-test",
        "LANGFUSE_BASE_URL": url,
        "LANGFUSE_TRACING_ENABLED": "true",
        "LANGFUSE_OTEL_COMPRESSION": "none",
    }


def _metadata(span: dict[str, Any], key: str) -> Any:
    value = span["attributes"][f"langfuse.observation.metadata.{key}"]
    return json.loads(value)


def test_each_rollout_is_a_trace_with_its_reward_and_its_chat_completion(
    chat_server_url: str,
) -> None:
    with recording_server(_langfuse_answer) as langfuse:
        result = run_python(GATHER.replace("URL", repr(chat_server_url)), _env(langfuse.url))
        assert result.returncode == 0, result.stderr
        spans = otlp_spans(langfuse.bodies("/api/public/otel/v1/traces"))
        scores = [json.loads(body) for body in langfuse.bodies("/api/public/scores")]

    trajectories = [
        line.split()[1:] for line in result.stdout.splitlines() if line.startswith("TRAJECTORY")
    ]
    assert [float(reward) for reward, _ in trajectories] == [0.25, 0.75]
    roots = {span["trace_id"]: span for span in spans if span["name"] == "rollout"}
    assert len(roots) == 3  # one trace per rollout, the failed one included
    for reward, trace_id in trajectories:
        root = roots[trace_id]  # the trajectory names its trace
        assert _metadata(root, "reward") == float(reward)
        assert _metadata(root, "metrics")["chars"] > 0
        (generation,) = [s for s in spans if s["parent_id"] == root["span_id"]]
        attributes = generation["attributes"]
        assert attributes["langfuse.observation.type"] == "generation"
        assert attributes["langfuse.observation.model.name"] == "echo"
        assert json.loads(attributes["langfuse.observation.model.parameters"]) == {
            "temperature": 0.5
        }
        assert json.loads(attributes["langfuse.observation.input"])[-1]["content"].startswith(
            "hello"
        )
        output = json.loads(attributes["langfuse.observation.output"])
        assert output["content"].startswith("echo: hello")
        assert "logprobs" not in output
    (failed,) = [
        root for trace_id, root in roots.items() if trace_id not in {t for _, t in trajectories}
    ]
    assert failed["attributes"]["langfuse.observation.level"] == "ERROR"
    assert "the tool broke" in failed["attributes"]["langfuse.observation.status_message"]
    # The reward is also the trace's score, which Langfuse takes over its REST API.
    sent_scores = [score for batch in scores for score in batch]
    assert sorted((s["traceId"], s["name"], s["value"]) for s in sent_scores) == sorted(
        (trace_id, "reward", float(reward)) for reward, trace_id in trajectories
    )
    assert "Langfuse at" not in result.stderr  # the server answered: no warning


def test_langfuse_switched_off_exports_nothing_and_is_not_imported(chat_server_url: str) -> None:
    with recording_server(_langfuse_answer) as langfuse:
        for switch in (
            {"LANGFUSE_TRACING_ENABLED": "false"},
            {"LANGFUSE_PUBLIC_KEY": "", "LANGFUSE_SECRET_KEY": ""},
        ):
            result = run_python(
                GATHER.replace("URL", repr(chat_server_url)), {**_env(langfuse.url), **switch}
            )
            assert result.returncode == 0, result.stderr
            assert "modules: []" in result.stdout, (switch, result.stdout)
            assert "TRAJECTORY 0.25 None" in result.stdout
        assert langfuse.requests == []


def test_an_unreachable_langfuse_warns_once_and_the_rollouts_go_on(chat_server_url: str) -> None:
    result = run_python(GATHER.replace("URL", repr(chat_server_url)), _env(closed_port_url()))
    assert result.returncode == 0, result.stderr
    rewards = [
        line.split()[1] for line in result.stdout.splitlines() if line.startswith("TRAJECTORY")
    ]
    assert rewards == ["0.25", "0.75"]
    assert result.stderr.count("Langfuse at http://127.0.0.1:") == 1, result.stderr


def test_a_missing_secret_key_warns_once_and_traces_nothing(chat_server_url: str) -> None:
    with recording_server(_langfuse_answer) as langfuse:
        result = run_python(
            GATHER.replace("URL", repr(chat_server_url)),
            {**_env(langfuse.url), "LANGFUSE_SECRET_KEY": ""},
        )
        assert result.returncode == 0, result.stderr
        assert result.stderr.count("Langfuse is configured without LANGFUSE_SECRET_KEY") == 1
        assert "TRAJECTORY 0.75 None" in result.stdout
        assert langfuse.requests == []


# A LangGraph rollout: its chat model comes from `art.langgraph`, not `model.openai_client()`.
LANGGRAPH = """
import asyncio
import art
from art.langgraph import init_chat_model, wrap_rollout
from art.integrations.observability.langfuse_trace import wait_for_connection_check
from langfuse import get_client

async def answer(question):
    reply = await init_chat_model().ainvoke([("user", question)])
    return art.Trajectory(reward=len(reply.content) / 100)

async def main():
    model = art.Model(name="echo", project="obs", inference_base_url=URL, inference_api_key="k")
    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup([wrap_rollout(model, answer)("capital of Peru?")])], pbar_desc=None
    )
    (trajectory,) = groups[0].trajectories
    print("TRAJECTORY", trajectory.reward, trajectory.metadata["langfuse_trace_id"])
    wait_for_connection_check()
    get_client().flush()

asyncio.run(main())
"""


def test_a_langgraph_rollout_is_traced_with_its_chat_model_call(chat_server_url: str) -> None:
    with recording_server(_langfuse_answer) as langfuse:
        result = run_python(LANGGRAPH.replace("URL", repr(chat_server_url)), _env(langfuse.url))
        assert result.returncode == 0, result.stderr
        spans = otlp_spans(langfuse.bodies("/api/public/otel/v1/traces"))

    (line,) = [line for line in result.stdout.splitlines() if line.startswith("TRAJECTORY")]
    reward, trace_id = line.split()[1:]
    (root,) = [s for s in spans if s["trace_id"] == trace_id and not s["parent_id"]]
    assert _metadata(root, "reward") == float(reward) > 0
    (generation,) = [s for s in spans if s["parent_id"] == root["span_id"]]
    output = json.loads(generation["attributes"]["langfuse.observation.output"])
    assert output["content"] == "echo: capital of Peru?"


def test_a_streamed_answer_is_assembled_for_its_generation() -> None:
    from art.integrations.observability.langfuse_trace import _answer

    def event(delta: dict[str, Any], **extra: Any) -> str:
        return "data: " + json.dumps({"choices": [{"index": 0, "delta": delta}], **extra})

    call = {"index": 0, "id": "call_1", "function": {"name": "get_weather", "arguments": '{"ci'}}
    stream = "\n\n".join(
        [
            event({"role": "assistant", "content": "Let me "}),
            event({"content": "check."}),
            event({"tool_calls": [call]}),
            event({"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Lima"}'}}]}),
            "data: "
            + json.dumps({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}),
            "data: [DONE]",
        ]
    )
    message, usage = _answer(stream)
    assert message == {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {
                "type": "function",
                "id": "call_1",
                "function": {"name": "get_weather", "arguments": '{"city": "Lima"}'},
            }
        ],
    }
    assert usage == {"input": 9, "output": 4}
