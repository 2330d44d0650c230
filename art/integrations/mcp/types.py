"""Plain data of the MCP integration: tools, resources, and generated scenarios."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ...core.data.errors import ArtValueError


class MCPTool(BaseModel):
    """A tool an MCP server offers: its name, description and JSON schema of arguments."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MCPTool:
        """From `{'name', 'description', 'parameters'}` (MCP's `inputSchema` is accepted too)."""
        parameters = data.get("parameters", data.get("inputSchema", data.get("input_schema")))
        return cls(
            name=data["name"],
            description=data.get("description") or "",
            parameters=dict(parameters or {"type": "object", "properties": {}}),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def to_tool_schema(self) -> dict[str, Any]:
        """The tool as an OpenAI function tool, ready for `tools=` of a chat completion."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


class MCPResource(BaseModel):
    """A resource an MCP server offers (read it with `MCPSession.read_resource(uri)`)."""

    model_config = ConfigDict(frozen=True)

    uri: str
    name: str
    description: str = ""
    mime_type: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MCPResource:
        return cls(
            uri=str(data["uri"]),
            name=data.get("name") or str(data["uri"]),
            description=data.get("description") or "",
            mime_type=data.get("mimeType") or data.get("mime_type"),
        )

    def to_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {
            "uri": self.uri,
            "name": self.name,
            "description": self.description,
        }
        if self.mime_type:
            result["mimeType"] = self.mime_type
        return result


class GeneratedScenario(BaseModel):
    """A task in natural language that a server's tools can solve, with a difficulty 1..5."""

    model_config = ConfigDict(frozen=True)

    task: str = Field(min_length=1)
    difficulty: int = Field(ge=1, le=5)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GeneratedScenario:
        return cls(task=data["task"], difficulty=data["difficulty"])

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "difficulty": self.difficulty}

    def preview(self, max_length: int = 120) -> str:
        """The task, cut to `max_length` characters."""
        if len(self.task) <= max_length:
            return self.task
        return self.task[:max_length].rstrip() + "…"


class GeneratedScenarioCollection:
    """An ordered set of generated scenarios: split, filter, shuffle, save as JSON."""

    def __init__(self, scenarios: list[GeneratedScenario]) -> None:
        self.scenarios = list(scenarios)

    @classmethod
    def from_dicts(cls, data: list[Mapping[str, Any]]) -> GeneratedScenarioCollection:
        return cls([GeneratedScenario.from_dict(item) for item in data])

    @classmethod
    def from_json(cls, text: str) -> GeneratedScenarioCollection:
        """Read `{"scenarios": [...]}` (as `to_json` writes) or a bare list."""
        data = json.loads(text)
        items = data.get("scenarios") if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise ArtValueError(
                "scenarios",
                "the JSON holds no list of scenarios",
                'Pass {"scenarios": [{"task": ..., "difficulty": 1..5}, ...]}',
            )
        return cls.from_dicts(items)

    def to_dicts(self) -> list[dict[str, Any]]:
        return [scenario.to_dict() for scenario in self.scenarios]

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps({"scenarios": self.to_dicts()}, indent=indent)

    def __len__(self) -> int:
        return len(self.scenarios)

    def __iter__(self) -> Iterator[GeneratedScenario]:
        return iter(self.scenarios)

    def __getitem__(self, index: int) -> GeneratedScenario:
        return self.scenarios[index]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GeneratedScenarioCollection) and self.scenarios == other.scenarios

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"GeneratedScenarioCollection({len(self.scenarios)} scenarios)"

    def shuffle(self, seed: int | None = None) -> GeneratedScenarioCollection:
        """A new collection in random order (reproducible with `seed`)."""
        shuffled = list(self.scenarios)
        random.Random(seed).shuffle(shuffled)
        return GeneratedScenarioCollection(shuffled)

    def split(
        self, train_size: int
    ) -> tuple[GeneratedScenarioCollection, GeneratedScenarioCollection]:
        """The first `train_size` scenarios, and the rest (for validation)."""
        if not 0 <= train_size <= len(self.scenarios):
            raise ArtValueError(
                "train_size",
                f"{train_size} is outside 0..{len(self.scenarios)} (the collection's size)",
                "Pass a train_size no larger than the number of scenarios",
            )
        return (
            GeneratedScenarioCollection(self.scenarios[:train_size]),
            GeneratedScenarioCollection(self.scenarios[train_size:]),
        )

    def filter_by_difficulty(
        self, min_difficulty: int = 1, max_difficulty: int = 5
    ) -> GeneratedScenarioCollection:
        """The scenarios whose difficulty lies in `min_difficulty..max_difficulty`."""
        return GeneratedScenarioCollection(
            [s for s in self.scenarios if min_difficulty <= s.difficulty <= max_difficulty]
        )

    def get_difficulty_distribution(self) -> Counter[int]:
        return Counter(scenario.difficulty for scenario in self.scenarios)

    def get_summary(self) -> dict[str, Any]:
        count = len(self.scenarios)
        return {
            "total_scenarios": count,
            "difficulty_distribution": dict(self.get_difficulty_distribution()),
            "avg_difficulty": sum(s.difficulty for s in self.scenarios) / count if count else 0,
            "avg_task_length": sum(len(s.task) for s in self.scenarios) / count if count else 0,
        }

    def preview(self, n: int = 5, max_task_length: int = 120) -> str:
        """Print (and return) the first `n` tasks with their difficulties."""
        lines = [
            f"{i + 1}. {scenario.preview(max_task_length)}  (difficulty {scenario.difficulty}/5)"
            for i, scenario in enumerate(self.scenarios[:n])
        ]
        text = "\n".join(lines)
        print(text)
        return text
