"""Weave: `@weave.op` rollouts traced once art starts Weave, each trajectory naming its call.

Weave has no local mode: it needs W&B credentials and a W&B server (GraphQL for the
entity and project) with its trace server. A stand-in on 127.0.0.1 answers as both, and
records the calls the real weave library sends it. Each case runs in a fresh
interpreter, since `weave.init` sets process-wide state.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from observe_helpers import closed_port_url, recording_server, run_python

# ART's documented pattern: a rollout decorated with @weave.op, gathered and logged.
WEAVE_ROLLOUTS = """
import asyncio, sys
import weave
import art
from art.local import LocalBackend

@weave.op
async def rollout(model, i):
    trajectory = art.Trajectory(messages_and_choices=[{"role": "user", "content": f"hello {i}"}])
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(), messages=trajectory.messages()
    )
    trajectory.messages_and_choices.append(completion.choices[0])
    trajectory.reward = 0.25 + i / 2
    return trajectory

async def main():
    art.utils.init_weave_with_wandb("obs")
    # W&B metrics off (the key alone would turn them on): only Weave talks to the server.
    model = art.Model(
        name="echo", project="obs", inference_base_url=URL, inference_api_key="k", report_metrics=[]
    )
    await model.register(LocalBackend(path=PATH))
    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup(rollout(model, i) for i in range(2))], pbar_desc=None
    )
    await model.log(groups, split="train", step=0)
    for trajectory in groups[0].trajectories:
        print("TRAJECTORY", trajectory.reward, trajectory.metadata.get("weave_call_id"))
    client = weave.get_client() if hasattr(weave, "get_client") else None
    if client is not None:
        client.flush()

asyncio.run(main())
"""


def _wandb_answer(method: str, path: str, body: bytes) -> tuple[int, Any]:
    if path.startswith("/graphql"):  # W&B: who the key belongs to, and the project
        viewer = {"username": "tester", "defaultEntity": {"name": "lab"}}
        return 200, {"data": {"viewer": viewer, "project": {"name": "obs"}}}
    if path.startswith("/server_info"):
        return 200, {"min_required_weave_python_version": "0.0.1", "trace_server_version": "99.0.0"}
    if path in ("/obj/create", "/file/create", "/table/create"):
        return 200, {"digest": "d" * 43}
    return 200, {}


def _env(url: str, home: Path) -> dict[str, str]:
    return {
        "WANDB_API_KEY": "x" * 40,
        "WANDB_BASE_URL": url,
        "WF_TRACE_SERVER_URL": url,
        "WANDB_MODE": "",  # Weave has no offline mode
        "WEAVE_DISABLED": "",
        "HOME": str(home),  # no cached server answers, no ~/.netrc from elsewhere
        "WANDB_DIR": str(home),
        "WEAVE_PRINT_CALL_LINK": "false",
    }


def _script(chat_url: str, art_path: Path) -> str:
    return WEAVE_ROLLOUTS.replace("URL", repr(chat_url)).replace("PATH", repr(str(art_path)))


def _finished_calls(bodies: list[bytes]) -> list[dict[str, Any]]:
    return [call for body in bodies for call in json.loads(body)["batch"]]


def test_weave_op_rollouts_are_traced_with_their_reward_and_linked_from_the_log(
    tmp_path: Path, chat_server_url: str
) -> None:
    with recording_server(_wandb_answer) as wandb_server:
        result = run_python(
            _script(chat_server_url, tmp_path / ".art"), _env(wandb_server.url, tmp_path)
        )
        assert result.returncode == 0, result.stderr
        calls = _finished_calls(wandb_server.bodies("/calls/complete"))

    linked = {
        call_id: float(reward)
        for reward, call_id in (
            line.split()[1:] for line in result.stdout.splitlines() if line.startswith("TRAJECTORY")
        )
    }
    rollouts = {c["id"]: c for c in calls if "/op/rollout:" in c["op_name"]}
    assert set(rollouts) == set(linked)  # each trajectory names the call that made it
    for call_id, reward in linked.items():
        call = rollouts[call_id]
        assert call["project_id"] == "lab/obs"
        assert call["output"]["reward"] == reward
    # The step's Parquet log keeps the link.
    from art.core.store.model_store import ModelStore

    stored = ModelStore(tmp_path / ".art", "obs", "echo").read_trajectories("train", 0)
    assert {t.metadata["weave_call_id"] for t in stored[0].trajectories} == set(linked)


def test_weave_disabled_traces_nothing_and_art_imports_no_weave(
    tmp_path: Path, chat_server_url: str
) -> None:
    with recording_server(_wandb_answer) as wandb_server:
        env = {**_env(wandb_server.url, tmp_path), "WEAVE_DISABLED": "true"}
        result = run_python(_script(chat_server_url, tmp_path / ".art"), env)
        assert result.returncode == 0, result.stderr
        assert "TRAJECTORY 0.25 None" in result.stdout
        # Without the user's own `import weave`, asking art for Weave imports nothing.
        quiet = run_python(
            "import sys, art.utils; art.utils.init_weave_with_wandb('obs'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('weave', 'wandb')))",
            env,
        )
        assert quiet.stdout.strip() == "[]", quiet.stdout + quiet.stderr
        assert wandb_server.requests == []


def test_weave_without_a_key_a_server_or_online_mode_warns_once_and_the_rollouts_go_on(
    tmp_path: Path, chat_server_url: str
) -> None:
    for env, says in (
        ({"WANDB_API_KEY": ""}, "Weave needs W&B credentials"),
        ({"WANDB_MODE": "offline"}, "Weave has no offline mode"),
        (
            {"WANDB_BASE_URL": closed_port_url(), "WF_TRACE_SERVER_URL": closed_port_url()},
            "Weave could not start",
        ),
    ):
        result = run_python(
            _script(chat_server_url, tmp_path / ".art"),
            {**_env("http://unused", tmp_path), **env},
        )
        assert result.returncode == 0, result.stderr
        assert result.stderr.count(says) == 1, result.stderr
        assert "TRAJECTORY 0.75 None" in result.stdout
