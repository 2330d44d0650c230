"""Hand-scored groups for `benchmarks/ruler_agreement.py`: rollouts whose right ranking is known.

Two task sets, each group four rollouts of one task with a score given by hand:

- `arithmetic_groups`: the demo's task (`examples/demo.py`: its system prompt and
  questions), answers of the kinds the default model writes, scored by the demo's reward
  (1.0 the bare correct number, 0.5 the correct number among other text, else 0).
- `tool_groups`: an agent with tools (weather, order status, currency), multi-turn
  trajectories scored by hand for the rubric RULER grades by: the goal reached with the
  right tool scores highest, a detour less, a wrong or invented answer least.

Every group holds at least two different scores, so each has pairs to rank. The answers
are written here, not sampled: the pairs are the same on every machine and run.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from .demo import demo_module

Message = dict[str, Any]

# Task rubrics: what a user who knows the task would write, its preferences in words with
# no answers in them. The judge still has to work out what is right in each group; the
# hand scores pay for the same things.
ARITHMETIC_RUBRIC = """\
- The reply must give the correct sum of the two numbers asked about: work the sum out
  yourself and check each reply against it. A reply without the correct sum scores 0.
- The system prompt asks for the number only: a reply that is just the correct number
  scores 1; the correct number among other words scores about 0.5."""
TOOL_RUBRIC = """\
- The final answer must report what the tool returned for what the user asked, with the
  same figures: check each figure of the answer against that trajectory's own tool
  results. An answer whose figures differ from them, or one given without calling the
  tool, scores 0.2 at most.
- Between two correct answers, the one that took fewer tool calls scores higher."""


@dataclass(frozen=True)
class ScoredGroup:
    """The rollouts of one task, each a message list, with their scores by hand."""

    task: str  # a short name for the printout
    rollouts: list[list[Message]]
    scores: list[float]
    tools: list[dict[str, Any]] | None = None

    def first(self, count: int) -> ScoredGroup:
        """The group cut to `count` rollouts, the first two of them scored differently."""
        first, *rest = range(len(self.rollouts))
        other = next(i for i in rest if self.scores[i] != self.scores[first])
        order = [first, other, *(i for i in rest if i != other)][:count]
        return ScoredGroup(
            self.task,
            [self.rollouts[i] for i in order],
            [self.scores[i] for i in order],
            self.tools,
        )


def arithmetic_groups(count: int, seed: int = 11) -> list[ScoredGroup]:
    """`count` groups of four answers to the demo's additions."""
    demo = demo_module()
    rng = random.Random(seed)
    groups = []
    for a, b in demo.questions(seed=seed, count=count):
        right = a + b
        wrong = right + rng.choice([-10, -2, -1, 1, 2, 10])
        kinds = [
            f"{right}",
            f"The answer is {right}.",
            f"{a} + {b} = {right}",
            f"{wrong}",
            f"The answer is {wrong}.",
            f"{a} + {b} = {wrong}",
            "I like turtles.",
            "Sure! I can help you with that math problem.",
        ]
        while True:
            answers = rng.sample(kinds, 4)
            scores = [demo.reward(answer, right) for answer in answers]
            if len(set(scores)) > 1:
                break
        question = [
            {"role": "system", "content": demo.SYSTEM},
            {"role": "user", "content": f"What is {a} + {b}?"},
        ]
        rollouts = [[*question, {"role": "assistant", "content": text}] for text in answers]
        groups.append(ScoredGroup("arithmetic", rollouts, scores))
    return groups


def _tool(name: str, description: str, **parameters: str) -> dict[str, Any]:
    properties = {key: {"type": kind} for key, kind in parameters.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(properties),
            },
        },
    }


WEATHER = _tool("get_weather", "Current weather in a city", city="string")
ORDER = _tool("lookup_order", "Status of a customer's order by its number", order_id="string")
CURRENCY = _tool(
    "convert_currency", "Convert an amount between currencies at today's rate",
    amount="number", source="string", target="string",
)  # fmt: skip


class _Calls:
    """Numbers each tool call of one rollout: call_1, call_2, ..."""

    def __init__(self) -> None:
        self.count = 0

    def call(self, name: str, arguments: dict[str, Any], result: Any) -> list[Message]:
        self.count += 1
        call_id = f"call_{self.count}"
        return [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments)},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)},
        ]


def _say(text: str) -> Message:
    return {"role": "assistant", "content": text}


def _weather(rng: random.Random) -> tuple[str, list[tuple[list[Message], float]]]:
    city, other = rng.sample(["Paris", "Lima", "Oslo", "Cairo", "Osaka", "Quito"], 2)
    temp, cond = rng.randint(-5, 32), rng.choice(["cloudy", "sunny", "rainy", "windy"])
    report = {"city": city, "temperature_c": temp, "conditions": cond}
    elsewhere = {"city": other, "temperature_c": temp + 9, "conditions": "clear"}
    right = f"It is {temp}°C and {cond} in {city} right now."
    ask = f"What's the weather like in {city} right now?"
    a, b, c, d = _Calls(), _Calls(), _Calls(), _Calls()
    rollouts = [
        ([*a.call("get_weather", {"city": city}, report), _say(right)], 1.0),
        (
            [
                *b.call("get_weather", {"city": other}, elsewhere),
                *b.call("get_weather", {"city": city}, report),
                _say(right),
            ],
            0.7,
        ),
        (
            [
                *c.call("get_weather", {"city": city}, report),
                _say(f"It is {temp + 12}°C and clear in {city}."),
            ],
            0.2,
        ),
        ([_say(f"It's usually mild in {city}; probably around 20°C.")], 0.1),
        (
            [
                *d.call("get_weather", {"city": other}, elsewhere),
                _say(f"It is {temp + 9}°C and clear in {city}."),
            ],
            0.0,
        ),
    ]
    return ask, rollouts


def _order(rng: random.Random) -> tuple[str, list[tuple[list[Message], float]]]:
    number = str(rng.randint(10_000, 99_999))
    typo = number[:-2] + number[-1] + number[-2]
    day = rng.choice(["June 3", "July 14", "May 28", "August 9"])
    status = {"order_id": number, "status": "shipped", "estimated_delivery": day}
    right = f"Your order {number} has shipped and should arrive on {day}."
    ask = f"Where is my order {number}? When will it arrive?"
    a, b, c, d = _Calls(), _Calls(), _Calls(), _Calls()
    rollouts = [
        ([*a.call("lookup_order", {"order_id": number}, status), _say(right)], 1.0),
        (
            [
                *b.call("lookup_order", {"order_id": typo}, {"error": f"no order {typo}"}),
                *b.call("lookup_order", {"order_id": number}, status),
                _say(right),
            ],
            0.7,
        ),
        (
            [
                *c.call("lookup_order", {"order_id": number}, status),
                _say(f"Your order {number} was delivered yesterday."),
            ],
            0.1,
        ),
        (
            [
                *d.call("lookup_order", {"order_id": typo}, {"error": f"no order {typo}"}),
                _say("I could not find that order. Please check the number."),
            ],
            0.2,
        ),
        ([_say("Your order is on its way and will arrive soon!")], 0.0),
    ]
    return ask, rollouts


def _currency(rng: random.Random) -> tuple[str, list[tuple[list[Message], float]]]:
    amount = rng.choice([40, 120, 250, 75])
    source, target = rng.sample(["USD", "EUR", "JPY", "GBP"], 2)
    rate = round(rng.uniform(0.6, 1.6), 4)
    if "JPY" in (source, target):
        rate = 150.25 if target == "JPY" else round(1 / 150.25, 6)
    converted = round(amount * rate, 2)
    result = {"amount": converted, "currency": target}
    wrong_way = {"amount": round(amount / rate, 2), "currency": source}
    right = f"{amount} {source} is {converted} {target} at today's rate."
    ask = f"How much is {amount} {source} in {target}?"
    args = {"amount": amount, "source": source, "target": target}
    swapped = {"amount": amount, "source": target, "target": source}
    a, b, c, d = _Calls(), _Calls(), _Calls(), _Calls()
    rollouts = [
        ([*a.call("convert_currency", args, result), _say(right)], 1.0),
        (
            [
                *b.call("convert_currency", swapped, wrong_way),
                *b.call("convert_currency", args, result),
                _say(right),
            ],
            0.7,
        ),
        (
            [
                *c.call("convert_currency", swapped, wrong_way),
                _say(f"{amount} {source} is {wrong_way['amount']} {target}."),
            ],
            0.0,
        ),
        ([_say(f"{amount} {source} is about {amount} {target}; rates are close.")], 0.1),
        (
            [
                *d.call("convert_currency", args, result),
                _say(f"That converts to roughly {round(converted * 1.3)} {target}."),
            ],
            0.2,
        ),
    ]
    return ask, rollouts


_SCENARIOS = [
    ("weather", WEATHER, _weather, "You answer questions about the weather with your tool."),
    ("order", ORDER, _order, "You are a shop's support agent. Look orders up with your tool."),
    ("currency", CURRENCY, _currency, "You convert money between currencies with your tool."),
]


def tool_groups(count: int, seed: int = 12) -> list[ScoredGroup]:
    """`count` groups of four tool-using rollouts, the scenarios taken in turn."""
    rng = random.Random(seed)
    groups = []
    for index in range(count):
        name, tool, scenario, system = _SCENARIOS[index % len(_SCENARIOS)]
        ask, candidates = scenario(rng)
        while True:
            chosen = rng.sample(candidates, 4)
            if len({score for _, score in chosen}) > 1:
                break
        opening = [{"role": "system", "content": system}, {"role": "user", "content": ask}]
        groups.append(
            ScoredGroup(
                f"tools/{name}",
                [[*opening, *messages] for messages, _ in chosen],
                [score for _, score in chosen],
                tools=[tool],
            )
        )
    return groups


__all__ = ["ARITHMETIC_RUBRIC", "TOOL_RUBRIC", "ScoredGroup", "arithmetic_groups", "tool_groups"]
