"""LangGraph agents trained through `art.langgraph`: real graphs against our local backend.

One in-process LocalBackend and model serve the module. The 135M model will not call
tools on its own, so the agents force the first tool call with `tool_choice`, as a
LangGraph user steers any model, and sample greedily from prompts whose forced calls
it closes within the token budget; everything else (the graph, the tools, the
recording, the token ids) is the real path.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, TypedDict

import pytest
import pytest_asyncio
from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, create_react_agent
from openai.types.chat.chat_completion import Choice
from pydantic import BaseModel

import art
from art.core.metrics.batch_metrics import completion_tokens
from art.core.store.model_store import ModelStore
from art.langgraph import init_chat_model, wrap_rollout
from art.local import LocalBackend

pytestmark = [
    pytest.mark.model,
    pytest.mark.filterwarnings("ignore:create_react_agent has been moved:DeprecationWarning"),
]
BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Peru": "Lima", "Kenya": "Nairobi"}
SYSTEM = (
    "You answer questions about countries. "
    'To find a capital, call lookup_capital with {"country": "<name>"}.'
)


@tool
def lookup_capital(country: str) -> str:
    """Look up the capital city of a country."""
    return CAPITALS.get(country, "unknown")


@tool
def lookup_population(city: str) -> str:
    """Look up how many people live in a city."""
    return f"{city}: about 2 million people"


TOOLS = [lookup_capital, lookup_population]
FORCE_CAPITAL = {"type": "function", "function": {"name": "lookup_capital"}}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def model(shared_backend: LocalBackend) -> art.TrainableModel:
    model = art.TrainableModel(name="langgraph-agent", project="langgraph", base_model=BASE)
    await model.register(shared_backend)
    return model


def roles(items: list[Any]) -> list[str]:
    return ["assistant" if isinstance(item, Choice) else item["role"] for item in items]


def assert_sampled(choice: object) -> None:
    assert isinstance(choice, Choice)
    extra = choice.model_extra or {}
    assert extra["token_ids"]
    assert extra["prompt_token_ids"]
    assert len(extra["token_logprobs"]) == len(extra["token_ids"])


# --- a prebuilt ReAct agent, 8 rollouts at once, streamed -------------------------------


async def react_rollout(country: str) -> art.Trajectory:
    """A prebuilt ReAct agent; the model is chosen per turn to force the first tool call."""
    llm = init_chat_model(temperature=0, max_tokens=24)

    def pick_model(state: dict[str, Any], runtime: Any) -> Any:
        answered = isinstance(state["messages"][-1], ToolMessage)
        return llm.bind_tools(TOOLS, tool_choice="none" if answered else FORCE_CAPITAL)

    agent = create_react_agent(pick_model, TOOLS, prompt=SYSTEM)
    question = {"messages": [("user", f"What is the capital of {country}?")]}
    # stream_mode="messages" makes LangChain stream every LLM call (server-sent events).
    streamed = [chunk async for chunk in agent.astream(question, stream_mode="messages")]
    assert streamed
    return art.Trajectory(reward=0.0, metadata={"country": country})


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def react_trajectories(model: art.TrainableModel) -> list[art.Trajectory]:
    countries = ["France", "Japan"] * 4  # 8 rollouts
    rollout = wrap_rollout(model, react_rollout)
    return list(await asyncio.gather(*(rollout(country) for country in countries)))


async def test_react_agent_records_system_user_tool_call_tool_result_and_answer(
    react_trajectories: list[art.Trajectory],
) -> None:
    trajectory = react_trajectories[0]
    items = trajectory.messages_and_choices
    assert roles(items) == ["system", "user", "assistant", "tool", "assistant"]
    assert items[0] == {"role": "system", "content": SYSTEM}
    call_choice, tool_result, answer = items[2], items[3], items[4]
    assert isinstance(call_choice, Choice)
    assert call_choice.message.tool_calls
    call = call_choice.message.tool_calls[0]
    assert call.function.name == "lookup_capital"  # type: ignore[union-attr]
    assert isinstance(tool_result, dict)
    assert tool_result["tool_call_id"] == call.id
    assert_sampled(call_choice)
    assert_sampled(answer)
    assert {tool["function"]["name"] for tool in trajectory.tools or []} == {
        "lookup_capital",
        "lookup_population",
    }
    assert trajectory.additional_histories == []


async def test_eight_concurrent_rollouts_never_mix_messages(
    react_trajectories: list[art.Trajectory],
) -> None:
    for trajectory in react_trajectories:
        country = trajectory.metadata["country"]
        messages = trajectory.messages()
        assert messages[1]["content"] == f"What is the capital of {country}?"
        assert len(messages) == 5, messages  # one rollout's turns only
        call_id = messages[2]["tool_calls"][0]["id"]  # type: ignore[typeddict-item]
        assert messages[3]["tool_call_id"] == call_id  # type: ignore[typeddict-item]
        assert isinstance(trajectory.messages_and_choices[4], Choice)
    choices = [
        item
        for t in react_trajectories
        for item in t.messages_and_choices
        if isinstance(item, Choice)
    ]
    assert len({id(choice) for choice in choices}) == 16  # each call recorded once, in one rollout


# --- a custom StateGraph with sync nodes and a second LLM node --------------------------


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    summary: str


class Summary(BaseModel):
    """A one-line summary of the conversation."""

    text: str


async def custom_graph_rollout(country: str) -> art.Trajectory:
    llm = init_chat_model(temperature=0, max_tokens=24)

    def agent(state: State) -> dict[str, Any]:
        answered = isinstance(state["messages"][-1], ToolMessage)
        bound = llm.bind_tools(TOOLS, tool_choice="none" if answered else FORCE_CAPITAL)
        return {"messages": [bound.invoke([("system", SYSTEM), *state["messages"]])]}

    def route(state: State) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else "summarize"

    def summarize(state: State) -> dict[str, Any]:
        # A second LLM node with a prompt of its own: another conversation.
        transcript = "\n".join(str(message.content) for message in state["messages"])
        summary = llm.with_structured_output(Summary).invoke(
            [("user", f"Summarize in a few words:\n{transcript}")]
        )
        return {"summary": summary.text if isinstance(summary, Summary) else ""}

    graph = StateGraph(State)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(TOOLS))
    graph.add_node("summarize", summarize)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", "summarize"])
    graph.add_edge("tools", "agent")
    graph.add_edge("summarize", END)
    result = await graph.compile().ainvoke(
        {"messages": [("user", f"What is the capital of {country}?")], "summary": ""}
    )
    return art.Trajectory(reward=1.0, metrics={"summary_chars": len(result["summary"])})


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def custom_trajectory(model: art.TrainableModel) -> art.Trajectory:
    return await wrap_rollout(model, custom_graph_rollout)("Japan")


async def test_custom_graph_records_the_agent_conversation_with_token_ids(
    custom_trajectory: art.Trajectory,
) -> None:
    items = custom_trajectory.messages_and_choices
    assert roles(items) == ["system", "user", "assistant", "tool", "assistant"]
    assert items[3]["tool_call_id"] == items[2].message.tool_calls[0].id  # type: ignore[index, union-attr]
    assert_sampled(items[2])
    assert_sampled(items[4])
    assert custom_trajectory.reward == 1.0


async def test_a_second_llm_node_becomes_an_additional_history(
    custom_trajectory: art.Trajectory,
) -> None:
    (history,) = custom_trajectory.additional_histories
    assert roles(history.messages_and_choices) == ["user", "assistant"]
    assert history.messages()[0]["content"].startswith("Summarize")  # type: ignore[union-attr]
    choice = history.messages_and_choices[1]
    assert_sampled(choice)
    assert [tool["function"]["name"] for tool in history.tools or []] == ["Summary"]


# --- training on what was recorded ------------------------------------------------------


async def test_one_training_step_trains_every_sampled_token_of_the_recorded_trajectories(
    model: art.TrainableModel,
    react_trajectories: list[art.Trajectory],
    custom_trajectory: art.Trajectory,
) -> None:
    for index, trajectory in enumerate(react_trajectories):
        trajectory.reward = float(index % 2)
    custom_trajectory.reward = 1.0  # above its group's mean: its summary history trains too
    groups = [
        art.TrajectoryGroup(react_trajectories[:4]),
        art.TrajectoryGroup([*react_trajectories[4:], custom_trajectory]),
    ]
    sampled = sum(completion_tokens(t) for group in groups for t in group.trajectories)
    assert completion_tokens(custom_trajectory) > completion_tokens(
        art.Trajectory(messages_and_choices=custom_trajectory.messages_and_choices)
    )  # the additional history holds sampled tokens of its own
    before = await model.get_step()
    await model.train(groups, config=art.TrainConfig(learning_rate=1e-5))
    assert await model.get_step() == before + 1
    backend = model.backend()
    assert isinstance(backend, LocalBackend)
    row = ModelStore(backend.path, model.project, model.name).read_history()[-1]
    # Every trajectory has a non-zero advantage, so every token the model sampled, in the
    # main conversations and the additional history alike, is trained; nothing else is.
    assert row["data/step_loss_bearing_tokens"] == sampled > 0


# --- errors -----------------------------------------------------------------------------


def test_init_chat_model_outside_a_rollout_says_how_to_fix_it() -> None:
    with pytest.raises(art.RolloutError, match="wrap_rollout"):
        init_chat_model()


async def test_a_wrapped_rollout_must_return_a_trajectory(model: art.TrainableModel) -> None:
    async def returns_a_number() -> float:
        return 1.0

    with pytest.raises(art.RolloutError, match=r"must return an art\.Trajectory"):
        await wrap_rollout(model, returns_a_number)()  # type: ignore[arg-type]
