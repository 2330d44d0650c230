"""What a running PipelineTrainer shows: a bar of steps and a status line.

The bar's postfix is kept current (rollouts in flight, groups waiting in the queue, the
last step's staleness, groups dropped); every `log_interval_seconds` the same is printed
as a line, so a log file shows it too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


@dataclass
class Progress:
    log_interval_seconds: float
    ewa_alpha: float
    total_scenarios: int | None
    steps_total: int | None
    initial_step: int
    in_flight: int = 0
    queue_depth: int = 0
    scenarios: int = 0
    step: int = 0
    staleness_mean: float = 0.0
    staleness_max: float = 0.0
    dropped_stale: int = 0
    dropped_no_variance: int = 0
    reward_ewa: float | None = None
    _bar: Any = None
    _last_line: float = 0.0

    def start(self) -> None:
        from tqdm.auto import tqdm

        self.step = self.initial_step
        self._bar = tqdm(total=self.steps_total, desc="pipeline steps", unit="step")
        self._last_line = time.monotonic()

    def trained(self, step: int, reward: float, staleness: dict[str, float]) -> None:
        self.step = step
        self.staleness_mean = staleness.get("staleness_mean", 0.0)
        self.staleness_max = staleness.get("staleness_max", 0.0)
        a = self.ewa_alpha
        self.reward_ewa = (
            reward if self.reward_ewa is None else a * reward + (1 - a) * self.reward_ewa
        )
        if self._bar is not None:
            self._bar.update(1)
        self.refresh()

    def fields(self) -> dict[str, str]:
        scenarios = str(self.scenarios)
        if self.total_scenarios is not None:
            scenarios += f"/{self.total_scenarios}"
        shown = {
            "step": str(self.step),
            "in_flight": str(self.in_flight),
            "queue": str(self.queue_depth),
            "staleness": f"{self.staleness_mean:.2f}/{self.staleness_max:.0f}",
            "dropped": f"{self.dropped_stale} stale, {self.dropped_no_variance} no-var",
            "scenarios": scenarios,
        }
        if self.reward_ewa is not None:
            shown["reward_ewa"] = f"{self.reward_ewa:.3f}"
        return shown

    def refresh(self) -> None:
        if self._bar is not None:
            self._bar.set_postfix(self.fields(), refresh=False)
        now = time.monotonic()
        if now - self._last_line >= self.log_interval_seconds:
            self._last_line = now
            line = " ".join(f"{key}={value}" for key, value in self.fields().items())
            (self._bar.write if self._bar is not None else print)(f"[pipeline] {line}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


__all__ = ["Progress"]
