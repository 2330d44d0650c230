"""A LangGraph agent on LangChain's `ChatOpenAI` or `ChatAnthropic`, trained as it is."""

from typing import Any

from langchain_anthropic import ChatAnthropic
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph

import art


def one_node_graph(llm: Any) -> Any:
    """A graph whose one node asks `llm` (yours may have many; each call is captured)."""

    async def ask(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("ask", ask)
    graph.add_edge(START, "ask")
    return graph.compile()


# --8<-- [start:chatopenai]
async def chatopenai_agent(model: art.Model, question: str) -> None:
    llm = ChatOpenAI(
        model=model.get_inference_name(),
        base_url=model.inference_base_url,
        api_key=model.inference_api_key,  # type: ignore[arg-type]
        max_completion_tokens=8,
        http_async_client=art.capture_http_client(),
    )
    await one_node_graph(llm).ainvoke({"messages": [("user", question)]})


# --8<-- [end:chatopenai]


# --8<-- [start:chatanthropic]
async def chatanthropic_agent(model: art.Model, question: str) -> None:
    llm = ChatAnthropic(  # type: ignore[call-arg]
        model_name=model.get_inference_name(),
        base_url=str(model.inference_base_url).removesuffix("/v1"),
        api_key=model.inference_api_key,  # type: ignore[arg-type]
        max_tokens_to_sample=8,
        # ChatAnthropic makes its own HTTP client: LangChain's callbacks capture its calls.
        callbacks=[art.capture_callback()],
    )
    await one_node_graph(llm).ainvoke({"messages": [("user", question)]})


# --8<-- [end:chatanthropic]
