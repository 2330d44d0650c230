"""Supervised fine-tuning data: chat JSONL checked line by line, streamed, and scheduled.

A line is one conversation in the chat fine-tuning format, `{"messages": [...], "tools":
[...]}`; its assistant turns (text and tool calls) are what SFT trains. A file is checked
whole before anything trains (`check_file`), every bad line named as `file:line` with the
field at fault, then streamed (`iterate_file`): epochs, a bounded shuffle buffer and a
skip for resuming, never the whole file in memory. `create_lr_schedule` gives ART's
per-batch learning rates (linear, cosine or constant decay after a linear warm-up).
"""

from __future__ import annotations

import json
import math
import os
import random
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import ValidationError

from .errors import ArtValueError
from .trajectories import Trajectory, messages_of
from .types import TrainSFTConfig

ScheduleType = Literal["cosine", "linear", "constant"]
ROLES = ("system", "developer", "user", "assistant", "tool")
# Keys of a line other than these are refused: one we do not read (the OpenAI format's
# per-message `weight`, say) would otherwise be silently ignored.
_LINE_KEYS = {"messages", "tools", "parallel_tool_calls"}
_MESSAGE_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id", "refusal"}
SHOWN_PROBLEMS = 50  # listed in a message or an HTTP error; the rest counted


class SFTDataError(ArtValueError):
    """SFT data that cannot be trained: `problems` lists each as `where: field: problem`."""

    def __init__(self, source: str, problems: list[str], total: int | None = None) -> None:
        """`total`: how many problems there were, where `problems` lists only the first."""
        self.problems = problems
        self.total = len(problems) if total is None else total
        shown = problems[:SHOWN_PROBLEMS]
        more = self.total - len(shown)
        listed = "\n  ".join(shown) + (f"\n  ... and {more} more" if more else "")
        super().__init__(
            source,
            f"{self.total} bad example(s):\n  {listed}\n",
            "Fix or remove these examples; nothing was trained or written",
        )


def conversation_problems(data: Any) -> list[str]:
    """What is wrong with one chat-format example (a parsed JSONL line), as `field: problem`."""
    if not isinstance(data, dict):
        return [f"line: expected a JSON object, got {type(data).__name__}"]
    problems = [
        f"{key}: not a field of the chat format (it has messages, tools)"
        for key in data
        if key not in _LINE_KEYS
    ]
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        return [*problems, "messages: expected a non-empty list of chat messages"]
    problems += _message_problems(messages)
    problems += _tools_problems(data.get("tools"))
    return problems


def trajectory_problems(trajectory: Trajectory) -> list[str]:
    """What keeps `trajectory` from training with SFT: each conversation needs an
    assistant turn, and every message a valid role, content and tool calls."""
    problems = _message_problems(messages_of(trajectory.messages_and_choices))
    for h, history in enumerate(trajectory.additional_histories):
        where = f"additional_histories[{h}]."
        problems += [
            where + p for p in _message_problems(messages_of(history.messages_and_choices))
        ]
    return problems


def _message_problems(messages: Sequence[Any]) -> list[str]:
    problems: list[str] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            problems.append(f"{where}: expected an object, got {type(message).__name__}")
            continue
        role = message.get("role")
        if role not in ROLES:
            problems.append(f"{where}.role: {role!r} is not one of {', '.join(ROLES)}")
            continue
        problems += [
            f"{where}.{key}: not a field of a chat message"
            for key in message
            if key not in _MESSAGE_KEYS
        ]
        content = message.get("content")
        calls = message.get("tool_calls")
        if role == "assistant" and calls is not None:
            problems += _tool_call_problems(calls, f"{where}.tool_calls")
        elif calls is not None:
            problems.append(f"{where}.tool_calls: only assistant messages call tools")
        if content is None and not (role == "assistant" and calls):
            problems.append(f"{where}.content: missing (only an assistant's tool call may omit it)")
        elif content is not None and not _is_content(content):
            problems.append(f"{where}.content: expected a string or a list of text parts")
    if not any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages):
        problems.append("messages: no assistant turn, so nothing to train")
    return problems


def _is_content(content: Any) -> bool:
    if isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        for part in content
    )


def _tool_call_problems(calls: Any, where: str) -> list[str]:
    if not isinstance(calls, list):
        return [f"{where}: expected a list of tool calls"]
    problems: list[str] = []
    for k, call in enumerate(calls):
        at = f"{where}[{k}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            problems.append(f"{at}.function: expected an object with name and arguments")
            continue
        if call.get("type", "function") != "function":
            problems.append(f"{at}.type: {call.get('type')!r}; only 'function' calls exist")
        if not isinstance(function.get("name"), str) or not function["name"]:
            problems.append(f"{at}.function.name: expected the tool's name")
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as error:
                problems.append(f"{at}.function.arguments: not JSON ({error.msg})")
                continue
        if not isinstance(arguments, dict):
            problems.append(f"{at}.function.arguments: expected a JSON object")
    return problems


def _tools_problems(tools: Any) -> list[str]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        return ["tools: expected a list of tool schemas"]
    problems: list[str] = []
    for k, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            problems.append(f"tools[{k}].function.name: expected a function tool with a name")
    return problems


def parse_line(text: str) -> tuple[Trajectory | None, list[str]]:
    """One JSONL line as a trajectory, or None and what is wrong with it."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        return None, [f"line: not JSON ({error.msg} at column {error.colno})"]
    except RecursionError:
        return None, ["line: nested deeper than the JSON parser goes"]
    except ValueError as error:  # e.g. an integer over Python's 4300-digit limit
        return None, [f"line: not JSON that can be read ({error})"]
    problems = conversation_problems(data)
    if problems:
        return None, problems
    try:
        trajectory = Trajectory(messages_and_choices=data["messages"], tools=data.get("tools"))
    except ValidationError as error:
        return None, [
            f"{'.'.join(str(part) for part in e['loc'])}: {e['msg']}" for e in error.errors()
        ]
    return trajectory, []


def check_file(path: str | Path, label: str | None = None) -> int:
    """The number of examples in the JSONL file at `path`, after checking every line.

    Raises `SFTDataError` naming each bad line (`file:line: field: problem`, the file
    named `label` where given); blank lines are skipped. Reads the file once, a line at
    a time.
    """
    path = Path(path)
    name = label or str(path)
    if path.suffix != ".jsonl":
        raise ArtValueError(
            "file_path", f"{path} is not a .jsonl file", "Write the examples as JSON Lines"
        )
    if not path.is_file():
        raise ArtValueError("file_path", f"{path} does not exist", "Pass the path of a file")
    rows = 0
    problems: list[str] = []
    for number, line, found in _lines(path):
        if not line.strip() and not found:
            continue
        rows += 1
        if not found:
            _, found = parse_line(line)
        problems += [f"{name}:{number}: {problem}" for problem in found]
    if problems:
        raise SFTDataError(name, problems)
    return rows


def iterate_file(
    path: str | Path,
    *,
    epochs: int = 1,
    shuffle_buffer_size: int = 10_000,
    initial_skip: int = 0,
    label: str | None = None,
    seed: int = 42,
) -> Iterator[tuple[str, Trajectory]]:
    """The file's examples, each with its `file:line`, `epochs` times, shuffled within a
    buffer of `shuffle_buffer_size` (epoch k seeded with `seed + k`, as in ART, so a
    resumed run sees the same order), the first `initial_skip` left out. Check the file
    first (`check_file`)."""
    skipped = 0
    for epoch in range(epochs):
        rng = random.Random(seed + epoch)
        for item in _buffer_shuffled(read_file(path, label), shuffle_buffer_size, rng):
            if skipped < initial_skip:
                skipped += 1
                continue
            yield item


def read_file(path: str | Path, label: str | None = None) -> Iterator[tuple[str, Trajectory]]:
    """The file's examples in order, each with its `file:line` (the file named `label`
    where given). Check the file first (`check_file`)."""
    name = label or str(path)
    for number, line, problems in _lines(Path(path)):
        if not line.strip() and not problems:
            continue
        trajectory, problems = (None, problems) if problems else parse_line(line)
        if trajectory is None:  # changed since it was checked
            raise SFTDataError(name, [f"{name}:{number}: {p}" for p in problems])
        yield f"{name}:{number}", trajectory


def _lines(path: Path) -> Iterator[tuple[int, str, list[str]]]:
    """Each line of `path` with its number, decoded as UTF-8 on its own, so a bad byte
    is a problem of its line (with none for a line that decoded)."""
    with path.open("rb") as file:
        for number, raw in enumerate(file, start=1):
            try:
                yield number, raw.decode("utf-8"), []
            except UnicodeDecodeError as error:
                problem = f"line: not UTF-8 text (byte {error.start + 1}); JSONL is plain UTF-8"
                yield number, "", [problem + (", not gzip" if raw[:2] == b"\x1f\x8b" else "")]


def _buffer_shuffled(
    items: Iterator[tuple[str, Trajectory]], size: int, rng: random.Random
) -> Iterator[tuple[str, Trajectory]]:
    buffer: list[tuple[str, Trajectory]] = []
    for item in items:
        if len(buffer) < max(size, 1):
            buffer.append(item)
            continue
        k = rng.randrange(len(buffer))
        yield buffer[k]
        buffer[k] = item
    rng.shuffle(buffer)
    yield from buffer


def spool_examples(examples: Iterable[tuple[str, Trajectory]], directory: Path) -> tuple[Path, int]:
    """Write `examples` (read once) to a JSONL file in `directory` for the trainer to
    stream, checking each; returns the file and the count. Bad examples raise
    `SFTDataError` naming every one, and leave no file."""
    directory.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=".sft-", suffix=".jsonl", dir=directory)
    path = Path(name)
    count = 0
    problems: list[str] = []
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            for where, trajectory in examples:
                if not isinstance(trajectory, Trajectory):
                    problems.append(
                        f"{where}: expected an art.Trajectory, got {type(trajectory).__name__}"
                    )
                    continue
                problems += [f"{where}: {problem}" for problem in trajectory_problems(trajectory)]
                if not problems:
                    line = {"where": where, "trajectory": trajectory.model_dump(mode="json")}
                    file.write(json.dumps(line) + "\n")
                count += 1
        if problems:
            raise SFTDataError("trajectories", problems)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path, count


def read_spool(path: Path) -> Iterator[tuple[str, Trajectory]]:
    """The examples `spool_examples` wrote, in order."""
    with path.open(encoding="utf-8") as file:
        for line in file:
            data = json.loads(line)
            yield data["where"], Trajectory.model_validate(data["trajectory"])


def create_lr_schedule(
    total_steps: int,
    peak_lr: float,
    method: ScheduleType = "linear",
    warmup_steps: int = 0,
    min_lr: float = 0.0,
) -> list[float]:
    """One learning rate per step: a linear warm-up from `min_lr` to `peak_lr` over
    `warmup_steps` (the first step above `min_lr`), then `method`'s decay to `min_lr` at
    the last step ("constant" stays at `peak_lr`)."""
    if method not in ("cosine", "linear", "constant"):
        raise ArtValueError(
            "schedule_type", f"{method!r} is not a schedule", "Use 'linear', 'cosine' or 'constant'"
        )
    rates: list[float] = []
    decay_steps = total_steps - warmup_steps
    for step in range(max(total_steps, 0)):
        if step < warmup_steps:
            rates.append(min_lr + (peak_lr - min_lr) * (step + 1) / warmup_steps)
            continue
        progress = (step - warmup_steps) / (decay_steps - 1) if decay_steps > 1 else 0.0
        if method == "cosine":
            rates.append(min_lr + (peak_lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress)))
        elif method == "linear":
            rates.append(peak_lr - (peak_lr - min_lr) * progress)
        else:
            rates.append(peak_lr)
    return rates


def get_file_row_count(file_path: str | Path) -> int:
    """The number of non-blank lines of a JSONL file: its examples (ART's helper; unlike
    `check_file` it reads no line's JSON)."""
    with Path(file_path).open("rb") as file:
        return sum(1 for line in file if line.strip())


def resolve_sft_batch_size(*, batch_size: int | Literal["auto"], default_batch_size: int) -> int:
    """`batch_size`, with "auto" taken as `default_batch_size` (ART's helper)."""
    return default_batch_size if batch_size == "auto" else batch_size


class SFTChunk(NamedTuple):
    """One `model.train_sft` call's share of a dataset (`create_sft_dataset_iterator`):
    its trajectories, a config holding their batches' learning rates, the global batch
    index of its first batch (`step`), its epoch, and that batch's index in the epoch."""

    trajectories: list[Trajectory]
    config: TrainSFTConfig
    step: int
    epoch: int
    epoch_step: int


def create_sft_dataset_iterator(
    trajectories: Sequence[Trajectory],
    chunk_size: int = 10,
    epochs: int = 1,
    batch_size: int = 2,
    peak_lr: float = 2e-4,
    schedule_type: ScheduleType = "linear",
    warmup_ratio: float = 0.1,
    shuffle: bool = True,
    seed: int = 42,
    initial_step: int = 0,
    show_progress: bool = True,
) -> Iterator[SFTChunk]:
    """`trajectories` cut into chunks of `chunk_size` batches, one `model.train_sft` call
    each (ART's `art.utils.sft` helper, its defaults).

    The learning-rate schedule is made over every batch of every epoch
    (`create_lr_schedule(total, peak_lr, schedule_type, int(total * warmup_ratio))`), so
    warm-up and decay run across the chunks; each chunk's config holds its batches'
    rates. Each epoch is shuffled with `random.Random(seed + epoch)` (or not, with
    `shuffle=False`); `initial_step`, a global batch index, resumes at the chunk holding
    it. `show_progress` shows a tqdm bar counted in batches.
    """
    checks: list[tuple[str, float, bool, str]] = [
        ("chunk_size", chunk_size, chunk_size >= 1, "Use 1 or more"),
        ("epochs", epochs, epochs >= 1, "Use 1 or more"),
        ("batch_size", batch_size, batch_size >= 1, "Use 1 or more"),
        ("peak_lr", peak_lr, peak_lr > 0, "Use a positive learning rate"),
        ("warmup_ratio", warmup_ratio, 0 <= warmup_ratio <= 1, "Use 0.0 to 1.0"),
        ("initial_step", initial_step, initial_step >= 0, "Use 0 or more"),
    ]
    for field, value, ok, fix in checks:
        if not ok:
            raise ArtValueError(field, f"is {value!r}", fix)
    items = list(trajectories)
    if not items:
        return
    batches_per_epoch = math.ceil(len(items) / batch_size)
    total = batches_per_epoch * epochs
    schedule = create_lr_schedule(total, peak_lr, schedule_type, int(total * warmup_ratio))
    per_chunk = batch_size * chunk_size
    chunks_per_epoch = math.ceil(len(items) / per_chunk)
    first_chunk = initial_step // chunk_size
    from tqdm.auto import tqdm

    progress = tqdm(
        initial=min(first_chunk * chunk_size, total),
        total=total,
        desc="sft",
        unit="batch",
        disable=not show_progress,
    )
    try:
        for epoch in range(epochs):
            order = list(items)
            if shuffle:
                random.Random(seed + epoch).shuffle(order)
            for chunk in range(chunks_per_epoch):
                if epoch * chunks_per_epoch + chunk < first_chunk:
                    continue
                start = chunk * per_chunk
                part = order[start : start + per_chunk]
                epoch_step = start // batch_size
                step = epoch * batches_per_epoch + epoch_step
                batches = math.ceil(len(part) / batch_size)
                config = TrainSFTConfig(
                    learning_rate=schedule[step : step + batches], batch_size=batch_size
                )
                yield SFTChunk(part, config, step, epoch, epoch_step)
                progress.update(batches)
    finally:
        progress.close()


__all__ = [
    "SFTChunk",
    "SFTDataError",
    "check_file",
    "conversation_problems",
    "create_lr_schedule",
    "create_sft_dataset_iterator",
    "get_file_row_count",
    "iterate_file",
    "parse_line",
    "read_file",
    "read_spool",
    "resolve_sft_batch_size",
    "spool_examples",
    "trajectory_problems",
]
