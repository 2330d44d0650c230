"""The local run viewer (`art show`): pages built from real runs, opened in headless Chromium.

The two-step run is real: the default model on a LocalBackend makes forced tool calls,
one rollout per step raises in its tool (an unreachable weather service), a stand-in judge on 127.0.0.1 scores each group
through the real RULER code (which writes the explanations), and `model.train` takes two
GRPO steps. The page is opened in Debian's `chromium` (`make test` installs it where it
can); without it the browser checks skip and say why. Screenshots are kept in
`.art/screens/` at the repository root, and their paths printed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from helpers import WEATHER_TOOL, JsonHandler, sampled_choice, serving, tool_trajectory

import art
from art.cli import main
from art.core.store.model_store import ModelStore
from art.local import LocalBackend
from art.rewards import ruler_score_group
from art.viewer import write_page

pytestmark = pytest.mark.model  # loads the default model or starts a model service

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
REPO = Path(__file__).resolve().parents[2]
SCREENS = REPO / ".art" / "screens"
WEATHER = {"Paris": "sunny, 21C", "Oslo": "snow, -3C"}


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip(
            "no chromium on PATH: the viewer's browser checks need Debian's `chromium` "
            "(make test installs it with apt-get when run as root)"
        )
    return found


@pytest.fixture(scope="session")
def headless_chromium() -> str:
    """Debian's chromium, or a skip saying how to get it (before any run is built)."""
    return chromium()


def browse(page: Path, profile: Path, fragment: str = "") -> tuple[str, list[str]]:
    """The DOM after the page's script ran, without the script elements (which hold the
    whole run as JSON), and every console line the page produced."""
    result = subprocess.run(
        [
            chromium(),
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=10000",
            "--dump-dom",
            page.as_uri() + fragment,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line]
    return re.sub(r"<script\b.*?</script>", "", result.stdout, flags=re.S), console


def screenshot(page: Path, profile: Path, name: str, fragment: str = "") -> Path:
    SCREENS.mkdir(parents=True, exist_ok=True)
    target = SCREENS / name
    target.unlink(missing_ok=True)
    subprocess.run(
        [
            chromium(),
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            f"--user-data-dir={profile}",
            "--hide-scrollbars",
            "--virtual-time-budget=10000",
            f"--screenshot={target}",
            "--window-size=1400,1800",
            page.as_uri() + fragment,
        ],
        capture_output=True,
        timeout=300,
        check=True,
    )
    print(f"viewer screenshot: {target}")
    return target


def count(dom: str, css_class: str) -> int:
    """Elements whose class attribute contains `css_class` as a whole word."""
    return len(re.findall(rf'class="(?:[^"]* )?{re.escape(css_class)}(?: [^"]*)?"', dom))


# --- a real two-step run --------------------------------------------------------------------


class _StandInJudge(JsonHandler):
    """An OpenAI-compatible judge that answers RULER's prompt with valid scores.

    Longer trajectories score higher, so a group's rollouts get different rewards and
    each step has something to learn from; the explanation says so.
    """

    def do_POST(self) -> None:
        request = self.read_json()
        prompt = request["messages"][-1]["content"]
        sections = re.findall(r'<trajectory id="(\d+)">(.*?)</trajectory>', prompt, re.S)
        longest = max(len(body) for _, body in sections)
        scores = [
            {
                "trajectory_id": trajectory_id,
                "explanation": f"stand-in judge: {len(body)} characters, longer scores higher",
                "score": round(len(body) / longest, 4),
            }
            for trajectory_id, body in sections
        ]
        content = json.dumps({"scores": scores})
        self.send_json(
            {
                "id": "chatcmpl-judge",
                "object": "chat.completion",
                "created": 0,
                "model": request["model"],
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": content},
                    }
                ],
                "usage": {"prompt_tokens": 50, "completion_tokens": 30, "total_tokens": 80},
            }
        )


def weather_service(city: str, attempt: int) -> str:
    if city == "Oslo" and attempt == 0:
        raise ConnectionError(f"the weather service did not answer for {city}")
    return WEATHER[city]


async def weather_rollout(model: art.TrainableModel, city: str, attempt: int) -> art.Trajectory:
    """Ask for the weather, forcing a get_weather call, run the tool, then answer."""
    client = model.openai_client()
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": "You check the weather with the get_weather tool."},
            {"role": "user", "content": f"What is the weather in {city}?"},
        ],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        metadata={"city": city},
    )
    first = await client.chat.completions.create(
        model=model.get_inference_name(),
        messages=trajectory.messages(),
        tools=trajectory.tools,  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=48,
    )
    choice = first.choices[0]
    trajectory.messages_and_choices.append(choice)
    weather = weather_service(city, attempt)  # asked whether or not the call parsed
    for call in choice.message.tool_calls or []:
        trajectory.messages_and_choices.append(
            {"role": "tool", "tool_call_id": call.id, "content": weather}
        )
    answer = await client.chat.completions.create(
        model=model.get_inference_name(), messages=trajectory.messages(), max_tokens=12
    )
    trajectory.messages_and_choices.append(answer.choices[0])
    return trajectory


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def trained_run(
    tmp_path_factory: pytest.TempPathFactory, headless_chromium: str
) -> AsyncIterator[Path]:
    """Two GRPO steps of the default model; each step has one failed rollout."""
    path = tmp_path_factory.mktemp("viewer") / ".art"
    backend = LocalBackend(path=path, in_process=True)
    model = art.TrainableModel(name="agent", project="viewer", base_model=BASE)
    await model.register(backend)
    with serving(_StandInJudge) as judge_url:
        judge = {"api_base": judge_url, "api_key": "k"}
        for _ in range(2):
            groups = await art.gather_trajectory_groups(
                (
                    art.TrajectoryGroup(
                        (weather_rollout(model, city, attempt) for attempt in range(3)),
                        metadata={"city": city},
                    )
                    for city in ("Paris", "Oslo")
                ),
                pbar_desc=None,
                max_exceptions=2,
                after_each=lambda group: ruler_score_group(
                    group, "openai/stand-in-judge", judge, cache=False
                ),
            )
            await model.train(groups, config=art.TrainConfig(learning_rate=1e-4))
    await backend.close()
    yield path


def test_a_two_step_run_shows_curves_tool_calls_judge_and_failed_rollouts(
    trained_run: Path, tmp_path: Path
) -> None:
    store = ModelStore(trained_run, "viewer", "agent")
    assert store.step() == 2
    assert store.logged_steps("train") == [0, 1]
    page = write_page(trained_run, out=tmp_path / "page.html")

    dom, console = browse(page, tmp_path / "profile")
    assert console == [], "the page logged to the console (an uncaught error?)"
    assert 'data-rendered="1"' in dom
    assert "data-error" not in dom
    # A curve per metric of history.jsonl, rewards first, each a drawn line over two steps.
    metrics = re.findall(r'<figure class="chart[^"]*" data-metric="([^"]+)"', dom)
    points = Counter(
        key
        for row in store.read_history()
        for key in row
        if key not in ("step", "recorded_at", "training_step")
    )
    assert set(metrics) == set(points)
    assert metrics[0] == "train/reward"
    assert {"loss/train", "loss/grad_norm", "train/exception_rate"} <= set(metrics)
    assert points["loss/train"] == 2
    assert count(dom, "point") == sum(points.values())  # a circle per value
    assert count(dom, "line") == sum(1 for n in points.values() if n > 1)  # a path per curve
    assert count(dom, "group-row") == 0  # the browser is another view, not drawn yet
    screenshot(page, tmp_path / "profile", "viewer-curves.png")

    # The trajectory browser opens on the latest step: its two groups, and the best and
    # worst of the first side by side.
    dom, console = browse(page, tmp_path / "profile", "#view=trajectories")
    assert console == []
    assert count(dom, "chart") == 0
    assert "train step 1: 2 groups, 5 trajectories" in dom
    assert count(dom, "group-row") == 2
    assert count(dom, "trajectory") == 2
    assert "Judge: </b>stand-in judge:" in dom

    # The Oslo group of step 0: its failed rollout with its traceback.
    groups = store.read_trajectories("train", 0)
    oslo = next(g for g in groups if g.metadata["city"] == "Oslo")
    assert len(oslo.exceptions) == 1
    failed_view = f"#step=0&group={groups.index(oslo)}"
    dom, console = browse(page, tmp_path / "profile", failed_view)
    assert console == []
    assert "Failed rollouts (1)" in dom
    assert "builtins.ConnectionError" in dom
    assert "the weather service did not answer for Oslo" in dom
    assert "Traceback (most recent call last)" in dom
    dom, console = browse(page, tmp_path / "profile", "#step=0&failed=1")
    assert console == []
    assert count(dom, "group-row") == 1  # only the Oslo group has a failed rollout
    assert "city=Oslo" in dom
    shot = screenshot(page, tmp_path / "profile", "viewer-failed-rollout.png", failed_view)
    assert shot.stat().st_size > 50_000  # a full page of drawn content, not a blank image

    # A trajectory whose forced get_weather call parsed (sampled arguments may run past
    # max_tokens, leaving text), with the tool's answer, shown in the left pane.
    called, index = next(
        (g, i)
        for g in range(len(groups))
        for i, trajectory in enumerate(groups[g].trajectories)
        if any(m["role"] == "tool" for m in trajectory.messages())
    )
    fragment = f"#model=agent&split=train&step=0&group={called}&a={index}"
    dom, console = browse(page, tmp_path / "profile", fragment)
    assert console == []
    assert f'<article class="trajectory" data-index="{index}">' in dom
    assert "→ <b>get_weather</b>" in dom
    assert "result of get_weather" in dom
    assert WEATHER[str(groups[called].metadata["city"])] in dom
    shot = screenshot(page, tmp_path / "profile", "viewer-tool-call.png", fragment)
    assert shot.stat().st_size > 50_000  # a full page of drawn content, not a blank image


def test_thousands_of_trajectories_are_embedded_compactly_and_drawn_one_step_at_a_time(
    art_path: Path, tmp_path: Path, headless_chromium: str
) -> None:
    steps, groups_per_step, group_size = 5, 100, 10  # 5,000 trajectories
    store = ModelStore(art_path, "big", "agent")
    for step in range(steps):
        groups = []
        for g in range(groups_per_step):
            trajectories = [
                tool_trajectory(t / group_size, city=f"city-s{step}-g{g}-t{t}")
                for t in range(group_size)
            ]
            groups.append(art.TrajectoryGroup(trajectories, metadata={"scenario": g}))
        store.write_trajectories("train", step, groups)
        store.append_history(step, {"train/reward": 0.48, "loss/train": 1 / (step + 1)})
    stored = sum(p.stat().st_size for p in (store.dir / "trajectories").rglob("*.parquet"))

    page = write_page(art_path, project="big", out=tmp_path / "big.html")
    html = page.read_text(encoding="utf-8")
    # Token logprobs stay in the Parquet files; the page holds what a person reads.
    assert '"logprob"' not in html
    per_trajectory = len(html.encode()) / (steps * groups_per_step * group_size)
    assert per_trajectory < 1500, f"{per_trajectory:.0f} bytes per trajectory"
    print(f"5000 trajectories: page {len(html) / 1e6:.1f} MB, Parquet logs {stored / 1e6:.1f} MB")

    dom, console = browse(page, tmp_path / "profile", "#view=trajectories")
    assert console == []
    assert 'data-rendered="1"' in dom
    # Only the selected step's first 50 groups and one group's two panes are in the DOM.
    assert "train step 4: 100 groups, 1000 trajectories" in dom
    assert count(dom, "chart") == 0
    assert count(dom, "group-row") == 50
    assert "groups 1–50 of 100" in dom
    assert count(dom, "trajectory") == 2
    assert count(dom, "message") == 2 * 5
    assert "city-s4-g0-t9" in dom  # the best of the first group of step 4
    assert "city-s4-g0-t0" in dom  # and the worst
    assert "city-s4-g1-" not in dom
    assert "city-s0-" not in dom

    # A link to a group on the second page opens that page, with the group selected.
    dom, console = browse(page, tmp_path / "profile", "#step=2&group=70&a=3")
    assert console == []
    assert "groups 51–100 of 100" in dom
    assert re.search(r'<tr class="group-row active"><td>#70</td>', dom)
    assert "city-s2-g70-t3" in dom
    assert count(dom, "trajectory") == 2


# --- the command --------------------------------------------------------------------------


def test_art_show_writes_the_page_and_opens_it_in_the_users_browser(
    art_path: Path, tmp_path: Path
) -> None:
    store = ModelStore(art_path, "demo", "agent")
    store.write_trajectories("val", 0, [art.TrajectoryGroup([tool_trajectory(1.0)])])
    store.append_history(0, {"val/reward": 1.0})
    opened = tmp_path / "opened.txt"
    browser = tmp_path / "browser.sh"
    browser.write_text(f'#!/bin/sh\necho "$1" > {opened}\n')
    browser.chmod(0o755)

    result = subprocess.run(
        [sys.executable, "-m", "art", "show", str(art_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "BROWSER": str(browser), "PYTHONPATH": str(REPO)},
        timeout=120,
        check=True,
    )
    page = art_path / "demo" / "viewer.html"
    assert result.stdout.strip() == f"art show: wrote {page.resolve()}"
    assert "get_weather" in page.read_text(encoding="utf-8")
    for _ in range(600):  # the browser command runs detached; wait for it to have run
        if opened.exists() and opened.read_text().strip():
            break
        time.sleep(0.05)
    assert opened.read_text().strip() == page.resolve().as_uri()

    out = tmp_path / "elsewhere" / "run.html"
    assert main(["show", str(art_path / "demo"), "--out", str(out), "--no-open"]) == 0
    assert "val/reward" in out.read_text(encoding="utf-8")


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600)])
def test_art_show_writes_a_page_readable_as_the_users_umask_says(
    art_path: Path, umask: int, mode: int
) -> None:
    ModelStore(art_path, "demo", "agent").append_history(0, {"val/reward": 1.0})
    page = art_path / "demo" / "viewer.html"
    for _ in range(2):  # a new page, then one written over it
        subprocess.run(
            [sys.executable, "-m", "art", "show", str(art_path), "--no-open"],
            capture_output=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            umask=umask,
            timeout=120,
            check=True,
        )
        assert stat.S_IMODE(page.stat().st_mode) == mode


def test_art_show_names_the_path_when_there_is_no_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "nothing-here"
    empty.mkdir()
    assert main(["show", str(empty), "--no-open"]) == 2
    error = capsys.readouterr().err
    assert f"no run under {empty.resolve()}" in error
    assert "LocalBackend(path=...)" in error
    assert main(["show", str(tmp_path / "missing"), "--no-open"]) == 2
    assert f"{(tmp_path / 'missing').resolve()} is not a directory" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.html"))


def test_art_show_asks_for_a_project_when_there_are_several(
    art_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for project in ("alpha", "beta"):
        ModelStore(art_path, project, "agent").append_history(0, {"val/reward": 0.5})
    assert main(["show", str(art_path), "--no-open"]) == 2
    assert "holds several projects: alpha, beta" in capsys.readouterr().err
    assert main(["show", str(art_path), "--project", "gamma", "--no-open"]) == 2
    assert "no run of project 'gamma'" in capsys.readouterr().err
    assert main(["show", str(art_path), "--project", "beta", "--no-open"]) == 0
    assert (art_path / "beta" / "viewer.html").is_file()


def test_text_from_the_run_is_shown_as_text_never_run_as_markup(
    art_path: Path, tmp_path: Path, headless_chromium: str
) -> None:
    hostile = '</script><img src=x onerror="document.body.dataset.pwned=1"><!--'
    trajectory = art.Trajectory(
        messages_and_choices=[{"role": "user", "content": hostile}],
        metadata={"note": hostile},
        logs=[f"RULER explanation: {hostile}"],
    )
    store = ModelStore(art_path, "hostile", "agent")
    store.write_trajectories("val", 0, [art.TrajectoryGroup([trajectory], metadata={"x": hostile})])
    page = write_page(art_path, out=tmp_path / "page.html")
    html = page.read_text(encoding="utf-8")
    assert html.count("</script>") == 2  # the data's own `</script>` is escaped

    dom, console = browse(page, tmp_path / "profile", "#view=trajectories")
    assert console == []
    assert 'data-rendered="1"' in dom
    assert "pwned" not in dom.split("<body", 1)[1].split(">", 1)[0]  # no onerror ran
    assert "<img" not in dom
    # the group row and chips, the trajectory metadata, the message, the judge line
    assert dom.count("&lt;/script&gt;&lt;img src=x") == 5


def test_every_model_of_the_project_has_its_tab_even_before_anything_is_logged(
    art_path: Path, tmp_path: Path, headless_chromium: str
) -> None:
    ModelStore(art_path, "duo", "first").append_history(0, {"val/reward": 0.25})
    ModelStore(art_path, "duo", "first").append_history(1, {"val/reward": 0.75})
    ModelStore(art_path, "duo", "second").write_model({"name": "second", "project": "duo"})
    page = write_page(art_path, out=tmp_path / "duo.html")

    dom, console = browse(page, tmp_path / "profile")
    assert console == []
    assert re.findall(r'<button class="tab[^"]*">([^<]+)</button>', dom)[:2] == ["first", "second"]
    assert "val/reward at step 1: 0.75" in dom  # the point's hover text
    assert count(dom, "line") == 1

    # The pointer near a curve's right end reads out the last point, as a person hovering.
    hover = """<script>
    const svg = document.querySelector("figure.chart svg");
    const box = svg.getBoundingClientRect();
    svg.dispatchEvent(new MouseEvent("mousemove", {clientX: box.right - 2, clientY: box.top + 5}));
    </script></body>"""
    hovered = tmp_path / "hovered.html"
    hovered.write_text(page.read_text(encoding="utf-8").replace("</body>", hover))
    dom, console = browse(hovered, tmp_path / "profile")
    assert console == []
    assert re.search(r'<text [^>]*class="readout"[^>]*>step 1: 0.75</text>', dom)

    dom, console = browse(page, tmp_path / "profile", "#model=second")
    assert console == []
    assert "history.jsonl has no rows yet." in dom
    dom, console = browse(page, tmp_path / "profile", "#model=second&view=trajectories")
    assert console == []
    assert "No trajectories were logged for this model." in dom


def test_a_turn_cut_at_max_tokens_and_additional_histories_are_shown(
    art_path: Path, tmp_path: Path, headless_chromium: str
) -> None:
    cut = sampled_choice("The weather in Paris is")
    cut.finish_reason = "length"
    summarizer = art.History(
        messages_and_choices=[
            {"role": "user", "content": "Summarize: sunny, 21C"},
            sampled_choice("Sunny and mild."),
        ]
    )
    trajectory = art.Trajectory(
        messages_and_choices=[{"role": "user", "content": "Weather in Paris?"}, cut],
        additional_histories=[summarizer],
        reward=0.5,
    )
    ModelStore(art_path, "cut", "agent").write_trajectories(
        "train", 0, [art.TrajectoryGroup([trajectory])]
    )
    page = write_page(art_path, out=tmp_path / "cut.html")

    dom, console = browse(page, tmp_path / "profile", "#view=trajectories")
    assert console == []
    assert count(dom, "trajectory") == 1  # a group of one has no worst beside its best
    assert re.search(
        r"assistant<span class=\"badge\">sampled</span><span class=\"badge warn\">cut at max_tokens",
        dom,
    )
    assert "additional history 1 (2 messages)" in dom
    assert "Summarize: sunny, 21C" in dom
    assert "Sunny and mild." in dom


def test_a_long_run_draws_each_curve_as_one_line_without_a_dot_per_step(
    art_path: Path, tmp_path: Path, headless_chromium: str
) -> None:
    store = ModelStore(art_path, "long", "agent")
    for step in range(300):
        store.append_history(step, {"train/reward": step / 300, "loss/train": 1 / (step + 1)})
    page = write_page(art_path, out=tmp_path / "long.html")

    dom, console = browse(page, tmp_path / "profile")
    assert console == []
    assert count(dom, "line") == 2
    assert count(dom, "point") == 0  # 300 dots per curve would be a smudge; hover reads out
    assert "last 0.9967 at step 299" in dom


def test_sft_batches_draw_as_a_curve_between_the_steps_they_made(
    art_path: Path, tmp_path: Path, headless_chromium: str
) -> None:
    """An SFT call's rows (one per batch, all at the step the call saved) are spread
    between step 0 and step 1, each named by its batch; an RL step follows at step 2."""
    store = ModelStore(art_path, "sft", "agent")
    for batch in range(4):
        store.append_history(
            1,
            {"sft/loss/train": 2.0 / (batch + 1), "sft/gradient_step": batch + 1, "sft/batches": 4},
        )
    store.append_history(2, {"train/reward": 0.5})
    page = write_page(art_path, out=tmp_path / "sft.html")

    dom, console = browse(page, tmp_path / "profile")
    assert console == []
    assert "last 0.5 at step 1, batch 4 of 4" in dom
    assert "sft/loss/train at step 1, batch 1 of 4: 2" in dom
    assert "last 0.5 at step 2" in dom
    # the batch index places points only, and so does the step W&B plots against
    for placing in ("sft/gradient_step", "sft/batches", "training_step"):
        assert f'data-metric="{placing}"' not in dom
