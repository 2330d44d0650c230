"""tests/scheduling.py: the lock units name every module that takes a shared lock, and
units start longest first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from scheduling import LOCK_UNITS, TestSeconds, longest_first, unit_of
from test_benchmarks import LOCKS, RUNS

TESTS = Path(__file__).resolve().parent


def lock_takers() -> dict[str, set[str]]:
    """Each lock's takers: the modules naming it in `one_at_a_time("...")` or using the
    `ray_cluster` fixture (which holds "ray"), and the benchmark runs of `LOCKS`."""
    takers: dict[str, set[str]] = {}
    for path in TESTS.rglob("test_*.py"):
        if path == Path(__file__).resolve():
            continue
        module = path.relative_to(TESTS.parent).as_posix()
        source = path.read_text()
        for lock in re.findall(r'one_at_a_time\(\s*"([^"]+)"', source):
            takers.setdefault(lock, set()).add(module)
        if re.search(r"\bray_cluster\b", source):
            takers.setdefault("ray", set()).add(module)
    for script, lock in LOCKS.items():
        takers.setdefault(lock, set()).add(
            f"tests/test_benchmarks.py::test_the_quick_setting_runs_to_its_report[{script}]"
        )
    return takers


def test_every_module_taking_a_shared_lock_is_in_its_unit() -> None:
    shared = {lock: takers for lock, takers in lock_takers().items() if len(takers) > 1}
    assert set(shared) <= set(LOCK_UNITS), f"locks taken in several places: {shared}"
    for lock, takers in shared.items():
        assert takers == set(LOCK_UNITS[lock]), lock
    # Every listed benchmark run is one test_benchmarks.py runs.
    ids = {param.id for param in RUNS}
    for members in LOCK_UNITS.values():
        for member in members:
            module, _, test = member.partition("::")
            assert (TESTS.parent / module).is_file(), member
            if test:
                assert re.fullmatch(r"test_the_quick_setting_runs_to_its_report\[(.+)\]", test)
                assert test.split("[")[1].rstrip("]") in ids, member


def test_a_units_tests_run_together_and_the_longest_units_start_first() -> None:
    assert unit_of("tests/runtime/test_vllm_engine.py::test_x") == "lock:vllm"
    assert (
        unit_of("tests/test_benchmarks.py::test_the_quick_setting_runs_to_its_report[engines]")
        == "lock:vllm"
    )
    assert (
        unit_of("tests/test_benchmarks.py::test_the_quick_setting_runs_to_its_report[sft]")
        == "tests/test_benchmarks.py"
    )
    units = {
        "a.py": {"a.py::1": False, "a.py::2": False},  # 3 s
        "b.py": {"b.py::1": False},  # 5 s
        "c.py": {"c.py::1": False, "c.py::new": False},  # a test never timed
        "d.py": {"d.py::1": False},  # 1 s
    }
    seconds = {"a.py::1": 1.0, "a.py::2": 2.0, "b.py::1": 5.0, "c.py::1": 0.1, "d.py::1": 1.0}
    assert longest_first(units, seconds) == ["c.py", "b.py", "a.py", "d.py"]
    assert longest_first(units, {}) == list(units)  # nothing recorded: xdist's order


def test_recorded_seconds_merge_with_the_earlier_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "seconds.json"
    monkeypatch.setenv("ART_TEST_SECONDS", str(record))
    assert TestSeconds().load() == {}
    TestSeconds().update({"a.py::1": 1.0, "b.py::1": 2.0})
    TestSeconds().update({"a.py::1": 3.0})
    assert TestSeconds().load() == {"a.py::1": 3.0, "b.py::1": 2.0}
    record.write_text("not json")
    assert TestSeconds().load() == {}  # an unreadable record orders nothing
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("ART_TEST_SECONDS", str(blocked / "seconds.json"))
    with pytest.warns(UserWarning, match="test seconds not recorded"):
        TestSeconds().update({"a.py::1": 1.0})  # the run goes on
    monkeypatch.setenv("ART_TEST_SECONDS", "off")
    TestSeconds().update({"a.py::1": 1.0})
    assert TestSeconds().load() == {}
