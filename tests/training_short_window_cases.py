"""promtool cases for the rules' windows under 5 minutes (the 2-minute step window, the
1-minute stretch of a step-time-only job), one scenario per behaviour written once in
counts per minute and sampled at 15 s and at 60 s:
``python tests/training_short_window_cases.py`` writes
alerts/tests/training_short_windows_{15,60}s.test.yaml;
tests/test_rules_training_short_windows.py checks they are what this makes. The cases
run on Prometheus 2.x and 3.x alike."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

TESTS_DIR = Path(__file__).resolve().parents[1] / "alerts" / "tests"
INTERVALS_S = (15, 60)
RUNBOOK = "https://github.com/gpufleet/gpufleet/blob/main/alerts/RUNBOOK.md#"


@dataclass(frozen=True, slots=True)
class Counter:
    """A counter of one node: (minutes, rise per minute) stretches, from 0."""

    name: str
    node: str
    stretches: tuple[tuple[int, float], ...]

    def series(self) -> str:
        labels = (
            f'job="gpufleet-agent",instance="{self.node}",training_job="llm",'
            f'node="{self.node}",pp_stage="0"'
        )
        return f"{self.name}{{{labels}}}"

    def values(self, interval_s: int) -> str:
        per_minute = 60 // interval_s
        parts, value = [], 0.0
        for index, (minutes, rise) in enumerate(self.stretches):
            step = round(rise / per_minute, 4)
            samples = minutes * per_minute
            if index == 0:
                parts.append(f"0+{step:g}x{samples}")
                value = step * samples
            else:
                value = round(value + step, 4)
                parts.append(f"{value:g}+{step:g}x{samples - 1}")
                value += step * (samples - 1)
        return " ".join(parts)


NODES = ("n1", "n2", "n3", "n4", "n5")


def straggler(stop_at: int | None) -> list[Counter]:
    """Five nodes; n3 computes 1.25x its peers from 10m, and stops stepping at stop_at."""
    counters = []
    for node in NODES:
        steps: tuple[tuple[int, float], ...] = ((30, 30.0),)
        compute: tuple[tuple[int, float], ...] = ((30, 43.2),)
        if node == "n3":
            tail = 30 - 10 if stop_at is None else stop_at - 10
            compute = ((10, 43.2), (tail, 54.0))
            steps = ((stop_at or 30, 30.0),)
            if stop_at is not None:
                compute = (*compute, (30 - stop_at, 0.0))
                steps = (*steps, (30 - stop_at, 0.0))
        counters.append(Counter("gpufleet_training_slowest_rank_steps_total", node, steps))
        counters.append(
            Counter("gpufleet_training_slowest_rank_compute_seconds_total", node, compute)
        )
    return counters


def step_time_only(slow_from: int | None) -> list[Counter]:
    """Four nodes of a job that times its steps only (no compute split, no data wait):
    2.17 s a step, 1.4x slower from slow_from."""
    seconds = (
        ((90, 520.8),) if slow_from is None else ((slow_from, 520.8), (90 - slow_from, 729.12))
    )
    return [
        counter
        for node in NODES[:4]
        for counter in (
            Counter("gpufleet_training_steps_total", node, ((90, 240.0),)),
            Counter("gpufleet_training_step_seconds_total", node, seconds),
        )
    ]


STRAGGLER_FIRES = {
    "eval_time": "20m",
    "alertname": "GpuFleetStragglerNode",
    "exp_alerts": [
        {
            "exp_labels": {
                "severity": "warning",
                "training_job": "llm",
                "node": "n3",
                "pp_stage": "0",
            },
            "exp_annotations": {
                "summary": "A node computes persistently slower than its peers in the same "
                "pipeline stage.",
                "description": "n3 in job llm (pipeline stage 0) computes 1.25x its stage peers "
                "(the median node, or in a stage of few nodes the fastest node's median rank), "
                "for 3m: in lock-step training it sets the pace for every rank. Check its GPUs' "
                "clocks and throttling; drain it and let the job continue without it.",
                "runbook_url": RUNBOOK + "gpufleetstragglernode",
            },
        }
    ],
}
SLOWDOWN_FIRES = {
    "eval_time": "80m",
    "alertname": "GpuFleetJobSlowdown",
    "exp_alerts": [
        {
            "exp_labels": {"severity": "warning", "training_job": "llm"},
            "exp_annotations": {
                "summary": "A training job runs slower than its recent baseline (job-wide, "
                "not one node).",
                "description": "Job llm takes 1.40x its recent step time across all nodes: a "
                "cluster-wide cause (network, storage, cooling, a communication fail-slow), not "
                "one slow node (that pages as GpuFleetStragglerNode).",
                "runbook_url": RUNBOOK + "gpufleetjobslowdown",
            },
        }
    ],
}


def cases(interval_s: int) -> list[dict[str, Any]]:
    every = f"every {interval_s} s"

    def case(
        name: str, counters: list[Counter], checks: list[dict[str, Any]], exprs: list[Any]
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": f"{name} (scraped {every})",
            "interval": f"{interval_s}s",
            "input_series": [
                {"series": counter.series(), "values": counter.values(interval_s)}
                for counter in counters
            ],
        }
        if exprs:
            body["promql_expr_test"] = exprs
        body["alert_rule_test"] = checks
        return body

    return [
        case(
            "a node computing 25% slower than its four stage peers pages after three minutes",
            straggler(None),
            [{"eval_time": "12m", "alertname": "GpuFleetStragglerNode"}, STRAGGLER_FIRES],
            [],
        ),
        case(
            # its 5-minute compute ratio still reads 1.25 three minutes after it stopped;
            # its 2-minute step rate (stepping) reads none
            "a straggler whose ranks stopped stepping three minutes ago no longer pages",
            straggler(16),
            [{"eval_time": "19m", "alertname": "GpuFleetStragglerNode"}],
            [
                {
                    "expr": 'round(node:gpufleet_training_compute_ratio:rate5m{node="n3"}, 0.01)',
                    "eval_time": "19m",
                    "exp_samples": [
                        {"labels": '{training_job="llm",node="n3",pp_stage="0"}', "value": 1.25}
                    ],
                },
                {
                    "expr": 'node:gpufleet_training_slowest_rank_steps:rate2m{node="n3"}',
                    "eval_time": "19m",
                    "exp_samples": [],
                },
            ],
        ),
        case(
            "a step-time-only job 1.4x slower from 60 minutes pages a job slowdown",
            step_time_only(60),
            [{"eval_time": "62m", "alertname": "GpuFleetJobSlowdown"}, SLOWDOWN_FIRES],
            [
                {
                    "expr": "round(job:gpufleet_training_step_seconds:rate1m, 0.01)",
                    "eval_time": "80m",
                    "exp_samples": [{"labels": '{training_job="llm"}', "value": 3.04}],
                }
            ],
        ),
        case(
            "a step-time-only job at its pace pages nothing",
            step_time_only(None),
            [{"eval_time": "80m", "alertname": "GpuFleetJobSlowdown"}],
            [
                {
                    "expr": "round(job:gpufleet_training_step_seconds_less_stalls:steady10m, 0.01)",
                    "eval_time": "80m",
                    "exp_samples": [{"labels": '{training_job="llm"}', "value": 2.17}],
                }
            ],
        ),
    ]


HEADER = (
    "# Generated by tests/training_short_window_cases.py -- do not edit by hand.\n"
    "# The rules' windows under 5 minutes, sampled every {interval} s.\n"
)
GROUPS = [
    "gpufleet-training-peers",
    "gpufleet-training-long-windows",
    "gpufleet-training-coverage",
    "gpufleet-training-trends",
    "gpufleet-training-alerts",
]


def document(interval_s: int) -> str:
    body = {
        "rule_files": ["../training.rules.yaml"],
        "evaluation_interval": "1m",
        "group_eval_order": GROUPS,
        "tests": cases(interval_s),
    }
    return HEADER.format(interval=interval_s) + yaml.safe_dump(
        body, sort_keys=False, width=100_000, allow_unicode=True
    )


def files() -> dict[Path, str]:
    return {
        TESTS_DIR / f"training_short_windows_{interval}s.test.yaml": document(interval)
        for interval in INTERVALS_S
    }


if __name__ == "__main__":
    for path, text in files().items():
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
