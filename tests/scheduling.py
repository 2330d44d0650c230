"""How `make test`'s xdist workers share the suite (`--dist loadfile`, through xdist's
`pytest_xdist_make_scheduler` hook; tests/conftest.py installs it).

xdist's loadfile scheduling hands each worker whole modules, the modules with most tests
first. Two changes:

- The modules that take the same `one_at_a_time` lock (a vLLM server, a Ray cluster) are
  one unit of work, so they run one after another on one worker. Apart, each could start
  while the other worker held the lock, and its worker sat idle until it was let go (79 s
  in a run of 2026-11-27; the quick `ray_replicas` benchmark took 163-224 s in earlier
  runs, 52 s alone). The locks stay: they are what keeps two pytest runs apart.
- Units start longest first, by the seconds their tests took when they last ran on this
  machine (`TestSeconds`): a long unit that starts last keeps its worker busy after the
  other has finished. A unit with a test never timed here starts before the timed ones.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xdist.scheduler import LoadFileScheduling

from art.core.store.atomic import write_text_atomic

# Each lock's unit: the modules (or single tests) that take it. tests/test_scheduling.py
# checks that every module naming a lock is listed under it.
LOCK_UNITS: dict[str, tuple[str, ...]] = {
    "vllm": (
        "tests/runtime/test_vllm_engine.py",
        "tests/runtime/test_vllm_external.py",
        "tests/runtime/test_unsloth_trainer.py",  # its checkpoint served by vLLM
        "tests/test_benchmarks.py::test_the_quick_setting_runs_to_its_report[engines]",
    ),
    "ray": (
        "tests/backends/test_ray_backend.py",
        "tests/test_benchmarks.py::test_the_quick_setting_runs_to_its_report[ray_replicas]",
    ),
}


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its lock's, else its module's."""
    module = nodeid.split("::", 1)[0]
    for lock, members in LOCK_UNITS.items():
        if module in members or nodeid in members:
            return f"lock:{lock}"
    return module


class TestSeconds:
    """Each test's seconds (setup, call and teardown) in the last run that ran it on this
    machine, kept in a JSON file outside the checkout: ART_TEST_SECONDS, by default
    ~/.cache/art/test-seconds.json; `off` keeps none."""

    def __init__(self) -> None:
        setting = os.environ.get("ART_TEST_SECONDS") or "~/.cache/art/test-seconds.json"
        self.path = None if setting == "off" else Path(setting).expanduser()

    def load(self) -> dict[str, float]:
        if self.path is None:
            return {}
        try:
            recorded = json.loads(self.path.read_text())
        except (OSError, ValueError):  # none yet, or unreadable: no order is known
            return {}
        return {str(k): float(v) for k, v in recorded.items()} if isinstance(recorded, dict) else {}

    def update(self, seconds: Mapping[str, float]) -> None:
        """Record this run's tests, keeping those it did not run."""
        if self.path is None or not seconds:
            return
        merged = self.load() | dict(seconds)
        try:
            write_text_atomic(self.path, json.dumps(merged, indent=0, sort_keys=True))
        except OSError as error:  # a read-only home: the next run keeps xdist's order
            warnings.warn(f"test seconds not recorded in {self.path}: {error}", stacklevel=2)


class LockAwareLoadFileScheduling(LoadFileScheduling):
    """loadfile scheduling with the lock units and the longest-first order above.

    xdist's hook takes a whole scheduler and has no ordering hook of its own, so this
    overrides two methods of its LoadScopeScheduling (`_split_scope`, which LoadFileScheduling
    itself overrides, and `_assign_work_unit`), as of pytest-xdist 3.8.0, the pinned version.
    """

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self._seconds = TestSeconds().load()
        self._ordered = False

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)

    def _assign_work_unit(self, node: Any) -> None:
        # xdist fills its queue in schedule() and assigns from its front: order it once,
        # before the first unit is taken.
        if not self._ordered:
            self._ordered = True
            units = dict(self.workqueue)
            self.workqueue.clear()
            self.workqueue.update(
                (unit, units[unit]) for unit in longest_first(units, self._seconds)
            )
        super()._assign_work_unit(node)


def longest_first(
    units: Mapping[str, Mapping[str, Any]], seconds: Mapping[str, float]
) -> list[str]:
    """The units (each a mapping keyed by its tests' node ids) longest first by the
    recorded `seconds`; those with a test never recorded before all others, in their order."""

    def expected(unit: str) -> float:
        nodeids = units[unit]
        if any(nodeid not in seconds for nodeid in nodeids):
            return float("inf")
        return sum(seconds[nodeid] for nodeid in nodeids)

    return sorted(units, key=lambda unit: -expected(unit))
