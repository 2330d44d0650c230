"""Peak memory and seconds of one training step on long agent trajectories.

Each setting (N trajectories whose final completion is ~T tokens) runs in a fresh
`LocalBackend` (its model service in a child process, as users run it): register the
default model, then one `model.train` on N trajectories shaped like a LangGraph ReAct
agent's (system, user, a sampled tool call, the tool's answer, a sampled final answer of
T tokens), with rewards that differ so every trajectory trains. Printed per setting: the
service process's peak RSS (VmHWM: loading, serving and the step together), the wall
seconds of `model.train`, and what the trainer reported (`train/peak_memory_gb` where the
trainer has it).

A watchdog kills the service when its RSS passes `--kill-above-gb` (default 10), so a
trainer without bounded memory is recorded as "killed" instead of taking the machine down.

`--agent langgraph` samples the trajectories instead: a real LangGraph ReAct agent
(`art.langgraph`: `init_chat_model`, `wrap_rollout`) calls its tool, then is asked for a
long, detailed report with up to T tokens (the default model at temperature 1 mostly
writes to the limit), N rollouts in groups of 4 through the endpoint, then one
`model.train`. Each rollout is seeded, so two runs mostly sample the same answers (a
row's logits may differ in their last bits with the rows it is batched with, and one
token drawn differently changes the rest). The whole process tree's peak is printed as
well (`tree_peak_rss_gb`, `tree_peak_pss_gb`: this process, the service and their
children, summed, polled every 0.1 s; RSS counts a page shared by two processes twice,
PSS splits it), for the rollouts and the step, with the mean completion tokens sampled.
This process then stands for a user's agent script: it loads neither torch nor a
tokenizer (the machine line comes from a child process).

    python benchmarks/train_memory.py                     # 8x2048, 8x4096, 32x2048, 32x4096
    python benchmarks/train_memory.py --settings 8x2048   # one setting
    python benchmarks/train_memory.py --quick             # a smoke setting: 4x64
    python benchmarks/train_memory.py --agent langgraph --settings 8x2048

`--peer trl` runs TRL's `GRPOTrainer` instead, in a child process of its own, on the same
sequences: its `rollout_func` hands it each trajectory's last prompt (system, user, tool
call, tool answer) and sampled answer as token ids, so it trains the same tokens (all
but the tool call) with the same LoRA, dtype, loss (CISPO) and rewards, one optimizer
step, one sequence per forward/backward, gradient checkpointing on (TRL's default and
its way to fit long sequences). TRL comes from the `bench` extra.

`--peer unsloth` runs the same step with the Unsloth trainer
(`InternalModelConfig(trainer_backend="unsloth")`, `.venv-unsloth`): our loss and step on
Unsloth's model, in the trainer's own child process, whose peak RSS is printed apart
(`trainer_peak_rss_gb`); the service's then holds only loading and serving. Run it after
the default (`ours`) on the same settings for Unsloth against our PEFT trainer on equal
work (benchmarks/RESULTS.md has the machine's numbers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

from support.machine import machine
from support.trl_data import trl_dataset

import art
from art.core.gather import completion_tokens as sampled_tokens
from art.local import LocalBackend
from art.runtime import models

_FILLER = (
    "Let me think about the weather data step by step. The tool returned the temperature, "
    "the humidity and the wind speed for the city, so I will compare them with the averages "
    "for this time of the year and then write a short summary for the user. "
)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def _choice(message: dict[str, Any], prompt: list[int], tokens: list[int]) -> Any:
    from openai.types.chat.chat_completion import Choice

    return Choice.model_validate(
        {
            "index": 0,
            "finish_reason": "tool_calls" if message.get("tool_calls") else "length",
            "message": message,
            "prompt_token_ids": prompt,
            "token_ids": tokens,
            "token_logprobs": [-1.0] * len(tokens),
        }
    )


def agent_trajectory(tokenizer: Any, index: int, completion_tokens: int) -> art.Trajectory:
    """A ReAct trajectory: a sampled tool call, the tool's answer, a long sampled answer."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    messages: list[Any] = [
        {"role": "system", "content": "You are a helpful assistant. Use the tools."},
        {"role": "user", "content": f"What is the weather like in city number {index}?"},
    ]
    prompt = _encode(
        tokenizer,
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
    )
    call_text = (
        f'<tool_call>{{"name": "get_weather", "arguments": {{"city": "c{index}"}}}}</tool_call>'
    )
    call = _encode(tokenizer, call_text + "<|im_end|>")
    call_message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{index}",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": f"c{index}"})},
            }
        ],
    }
    tool_result = f"sunny, {10 + index % 20} C, wind {index % 7} m/s"
    second_prompt = (
        prompt
        + call
        + _encode(
            tokenizer, f"\n<|im_start|>tool\n{tool_result}<|im_end|>\n<|im_start|>assistant\n"
        )
    )
    filler = _encode(tokenizer, _FILLER * 8)
    # Offset per trajectory so no two answers are the same token sequence.
    answer = [filler[(index * 7 + k) % len(filler)] for k in range(completion_tokens)]
    return art.Trajectory(
        messages_and_choices=[
            *messages,
            _choice(call_message, prompt, call),
            {"role": "tool", "tool_call_id": f"call_{index}", "content": tool_result},
            _choice(
                {"role": "assistant", "content": tokenizer.decode(answer)}, second_prompt, answer
            ),
        ],
        tools=tools,
        reward=float(index % 4) / 3,
    )


class Watchdog:
    """Polls a process's RSS; kills it above `limit_gb`."""

    def __init__(self, pid: int, limit_gb: float) -> None:
        self.pid, self.limit_gb, self.killed_at_gb = pid, limit_gb, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            rss = status_gb(self.pid, "VmRSS")
            if rss > self.limit_gb:
                self.killed_at_gb = rss
                os.kill(self.pid, 9)
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class TreePeak:
    """Polls the summed RSS and PSS of a process tree (this process and its descendants)
    every 0.1 s; `peak()` gives the highest sums since the last `reset()`."""

    def __init__(self) -> None:
        self._rss = self._pss = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            pids = tree_pids(os.getpid())
            rss = sum(status_gb(pid, "VmRSS") for pid in pids)
            pss = sum(pss_gb(pid) for pid in pids)
            with self._lock:
                self._rss, self._pss = max(self._rss, rss), max(self._pss, pss)

    def reset(self) -> None:
        with self._lock:
            self._rss = self._pss = 0.0

    def peak(self) -> tuple[float, float]:
        with self._lock:
            return self._rss, self._pss

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def tree_pids(root: int) -> list[int]:
    """`root` and every process descended from it (/proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # The command name may hold spaces and parentheses: fields follow the last ")".
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack += children.get(pid, [])
    return found


def pss_gb(pid: int) -> float:
    return proc_field_gb(f"/proc/{pid}/smaps_rollup", "Pss")


async def langgraph_groups(
    model: art.TrainableModel, trajectories: int, completion_tokens: int
) -> list[art.TrajectoryGroup]:
    """`trajectories` rollouts of a LangGraph ReAct agent, in groups of 4: a forced call of
    its weather tool, then a long report of up to `completion_tokens` tokens; the reward
    is the report's length (every rollout trains)."""
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    from art.langgraph import init_chat_model, wrap_rollout

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"{city}: sunny, 18 C, wind 3 m/s; last year's monthly averages on file"

    async def rollout(index: int) -> art.Trajectory:
        # Seeded: every run (and every build compared) samples the same answers.
        llm = init_chat_model(max_tokens=completion_tokens, seed=index)

        def choose_model(state: dict[str, Any], runtime: Any) -> Any:
            # A 135M model will not call tools unprompted: force the call, then the report.
            after_tool = isinstance(state["messages"][-1], ToolMessage)
            forced = {"type": "function", "function": {"name": "get_weather"}}
            return llm.bind_tools([get_weather], tool_choice="none" if after_tool else forced)

        agent = create_react_agent(
            choose_model, [get_weather], prompt="You are a helpful assistant. Use the tools."
        )
        question = (
            f"Look up the weather in city number {index}, then write a very long, detailed "
            "report on it, month by month, with many sections."
        )
        result = await agent.ainvoke({"messages": [("user", question)]})
        last = result["messages"][-1]
        report = str(last.content) if isinstance(last, AIMessage) else ""
        return art.Trajectory(reward=len(report) / (4 * completion_tokens) + 1e-3 * index)

    return await art.gather_trajectory_groups(
        (
            art.TrajectoryGroup(wrap_rollout(model, rollout)(g * 4 + k) for k in range(4))
            for g in range(trajectories // 4)
        ),
        pbar_desc=None,
    )


def status_gb(pid: int, field: str) -> float:
    return proc_field_gb(f"/proc/{pid}/status", field)


def proc_field_gb(path: str, field: str) -> float:
    """A `field:  N kB` line of a /proc file in GiB; 0.0 where the process is gone."""
    try:
        text = Path(path).read_text()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024**2
    return 0.0


async def one_setting(
    tokenizer: Any, trajectories: int, completion_tokens: int, args: argparse.Namespace
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="art-train-memory-") as path:
        backend = LocalBackend(path=path)
        model = art.TrainableModel(
            name="mem",
            project="bench",
            base_model=models.DEFAULT_MODEL,
            _internal_config=args.config,
        )
        await model.register(backend)
        service = backend._service
        pid = service._process.pid  # type: ignore[union-attr]
        loaded_gb = status_gb(pid, "VmRSS")
        result: dict[str, Any] = {"loaded_gb": loaded_gb}
        tree = TreePeak()
        if args.agent == "langgraph":
            started = time.monotonic()
            groups = await langgraph_groups(model, trajectories, completion_tokens)
            result["rollout_seconds"] = time.monotonic() - started
            sampled = [sampled_tokens(t) for g in groups for t in g.trajectories]
            result["completion_tokens"] = sum(sampled) / max(1, len(sampled))
            result["rollouts_tree_peak_rss_gb"], result["rollouts_tree_peak_pss_gb"] = tree.peak()
            tree.reset()
        else:
            groups = [
                art.TrajectoryGroup(
                    agent_trajectory(tokenizer, g * 4 + k, completion_tokens) for k in range(4)
                )
                for g in range(trajectories // 4)
            ]
        trainer_pid = unsloth_child(pid) if args.peer == "unsloth" else None
        watchdogs = [Watchdog(p, args.kill_above_gb) for p in (pid, trainer_pid) if p]
        started = time.monotonic()
        try:
            await model.train(groups, config=art.TrainConfig(learning_rate=1e-5))
            result["seconds"] = time.monotonic() - started
            result["peak_rss_gb"] = status_gb(pid, "VmHWM")
            result["tree_peak_rss_gb"], result["tree_peak_pss_gb"] = tree.peak()
            if trainer_pid is not None:
                result["trainer_peak_rss_gb"] = status_gb(trainer_pid, "VmHWM")
            rows = [
                json.loads(line)
                for line in (Path(path) / "bench/models/mem/history.jsonl").read_text().splitlines()
            ]
            train_row = rows[-1]
            result["tokens_trained"] = train_row.get("data/step_loss_bearing_tokens")
            result["trainer_peak_gb"] = train_row.get("train/peak_memory_gb")
        except Exception as error:  # a killed service is the result being measured
            result["error"] = f"{type(error).__name__}: {str(error)[:200]}"
            result["seconds"] = time.monotonic() - started
            for watchdog in watchdogs:
                if watchdog.killed_at_gb:
                    result["error"] = (
                        f"killed by the watchdog at {watchdog.killed_at_gb:.1f} GB RSS"
                    )
        finally:
            tree.stop()
            for watchdog in watchdogs:
                watchdog.stop()
            await backend.close()
    return result


def unsloth_child(service_pid: int) -> int | None:
    """The Unsloth trainer's process among the service's children."""
    for task in Path(f"/proc/{service_pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"unsloth_worker" in cmdline:
                return int(child)
    return None


def trl_child(trajectories: int, completion_tokens: int) -> None:
    """One TRL GRPO step on the same sequences (run as this script's child)."""
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from art.core.data.dev import PeftArgs
    from art.runtime.trainer.peft_trainer import lora_config

    tokenizer = AutoTokenizer.from_pretrained(str(models.default_model_dir()))
    answers = []
    for index in range(trajectories):
        last = agent_trajectory(tokenizer, index, completion_tokens).messages_and_choices[-1]
        extra = last.model_extra or {}  # type: ignore[union-attr]
        answers.append((extra["prompt_token_ids"], extra["token_ids"], extra["token_logprobs"]))

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        # TRL repeats each prompt once per generation; a prompt names its group, and the
        # group's k-th copy gets the group's k-th trajectory.
        seen: dict[str, int] = {}
        picked = []
        for prompt in prompts:
            k = seen[prompt] = seen.get(prompt, -1) + 1
            picked.append(answers[int(prompt.split()[-1]) * 4 + k])
        return {
            "prompt_ids": [a[0] for a in picked],
            "completion_ids": [a[1] for a in picked],
            "logprobs": [a[2] for a in picked],
        }

    def reward(completions: list[Any], **_: Any) -> list[float]:
        return [float(k % 4) / 3 for k in range(len(completions))]

    hf_model, _ = models.load(models.resolve(models.DEFAULT_MODEL))
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-train-memory-"),
        use_cpu=True,
        bf16=next(hf_model.parameters()).dtype == torch_bf16(),
        num_generations=4,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=trajectories,
        max_steps=1,
        max_completion_length=completion_tokens,
        learning_rate=1e-5,
        beta=0.0,
        loss_type="cispo",
        epsilon_high=1.2,
        gradient_checkpointing=True,
        logging_strategy="no",
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=hf_model,
        reward_funcs=reward,
        args=config,
        train_dataset=trl_dataset([{"prompt": f"group {g}"} for g in range(trajectories // 4)]),
        processing_class=tokenizer,
        peft_config=lora_config(PeftArgs()),
        rollout_func=rollout,
    )
    trainer.train()


def torch_bf16() -> Any:
    import torch

    return torch.bfloat16


def trl_setting(
    trajectories: int, completion_tokens: int, args: argparse.Namespace
) -> dict[str, Any]:
    import subprocess
    import sys

    started = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, __file__, "--trl-child", f"{trajectories}x{completion_tokens}"],
        env={**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"},
    )
    watchdog = Watchdog(child.pid, args.kill_above_gb)
    peak = 0.0
    while child.poll() is None:
        peak = max(peak, status_gb(child.pid, "VmHWM"))
        time.sleep(0.2)
    watchdog.stop()
    result: dict[str, Any] = {"seconds": time.monotonic() - started, "peak_rss_gb": peak}
    if watchdog.killed_at_gb:
        result["error"] = f"killed by the watchdog at {watchdog.killed_at_gb:.1f} GB RSS"
    elif child.returncode:
        result["error"] = f"exit code {child.returncode}"
    return result


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default="8x2048,8x4096,32x2048,32x4096")
    parser.add_argument("--kill-above-gb", type=float, default=10.0)
    parser.add_argument(
        "--memory-budget-gb",
        type=float,
        default=None,
        help="art.dev.TrainerArgs(memory_budget_gb=...) for the service; default: none set",
    )
    parser.add_argument("--peer", choices=["ours", "trl", "unsloth"], default="ours")
    parser.add_argument(
        "--agent",
        choices=["synthesized", "langgraph"],
        default="synthesized",
        help="trajectories built as a ReAct agent's (default) or sampled by a LangGraph agent",
    )
    parser.add_argument("--trl-child", help=argparse.SUPPRESS)
    parser.add_argument("--machine-line", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="one setting, 4x64")
    args = parser.parse_args()
    if args.quick:
        args.settings = "4x64"
    settings: list[tuple[int, int]] = []
    for setting in args.settings.split(","):
        n, _, t = setting.partition("x")
        # Ours trains groups of 4 (rewards that differ in each): N is a whole number of them.
        if not (n.isdigit() and t.isdigit()) or int(t) < 1 or int(n) < 4 or int(n) % 4:
            parser.error(f"--settings {setting}: give NxT, N a multiple of 4, T at least 1")
        settings.append((int(n), int(t)))
    if args.agent == "langgraph" and args.peer == "trl":
        parser.error("--peer trl trains the synthesized trajectories; leave --agent unset")
    if args.trl_child:
        n, t = (int(part) for part in args.trl_child.split("x"))
        trl_child(n, t)
        return
    if args.machine_line:
        print(f"machine: {machine()}; dtype {models.torch_dtype('auto')}")
        return
    args.config = art.dev.InternalModelConfig(
        trainer_backend="unsloth" if args.peer == "unsloth" else None,
        trainer_args=art.dev.TrainerArgs(memory_budget_gb=args.memory_budget_gb),
    )
    tokenizer = None
    if args.agent == "langgraph":
        # The tree's peak counts this process as a user's agent script: it imports neither
        # torch nor a tokenizer (0.4 GiB more), so the machine line comes from a child.
        import sys

        child = await asyncio.create_subprocess_exec(sys.executable, __file__, "--machine-line")
        if await child.wait():
            raise SystemExit("the machine line's child process failed")
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(models.default_model_dir()))
        print(f"machine: {machine()}; dtype {models.torch_dtype('auto')}")
    for n, t in settings:
        if args.peer == "trl":
            result = trl_setting(n, t, args)  # its seconds include loading, its own process
        else:
            result = await one_setting(tokenizer, n, t, args)
        shown = ", ".join(
            f"{key}={value:.2f}" if isinstance(value, float) else f"{key}={value}"
            for key, value in result.items()
        )
        if args.peer == "unsloth":
            shown = f"trainer=unsloth, {shown}"
        print(f"{n} x {t} tokens: {shown}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
