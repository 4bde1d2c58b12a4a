"""Detection on real PyTorch jobs: 4 "nodes" launched by ``torchrun`` (one per node, a
c10d rendezvous), ``torch.distributed`` with gloo on CPU, instrumented only with
gpufleet's integration lines (plain DDP, FSDP2's ``fully_shard``, a DeepSpeed ZeRO-2
engine, Lightning's DDP and FSDP2 strategies, the Hugging Face Trainer), one agent per
node and a real Prometheus running the generated rules compressed FACTOR times in time
(``gpufleet.lab.realjob``).

A rank's GPU kernels are a sleep (``Workload``), 50 ms a step: the rest of a step is
CPU work that a loaded machine stretches on every rank alike, and the longer it is
against the GPU time, the less a slow GPU shows in the compute ratio. One node's GPU
time grows 1.3x after a healthy span longer than the compressed rate window plus the
straggler's ``for``: that node is paged, within the issue's 7 uncompressed minutes of
the slowdown, and no other node, and nothing pages before the slowdown. A node given
1.3x longer batches (tokens and device time) computes as much longer, and is not
paged: its tokens explain it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.lab.realjob import JobResult, JobSpec, compressed_rules, run_job
from gpufleet.lab.workload import Framework
from gpufleet.simulate.config import parse_duration

pytest.importorskip("torch")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

FACTOR = 15  # 5m rate window -> 20 s, 3m `for` -> 12 s
RULES = compressed_rules(FACTOR)
DEVICE_S = 0.05
STRAGGLER = "GpuFleetStragglerNode"
SLOW_NODE = 2
# the compressed rate window and the straggler's `for`: a span the rules judge whole
JUDGED_S = parse_duration(RULES.rate_window) + parse_duration(RULES.straggler_for)
PAGE_WITHIN_S = 7 * 60  # uncompressed, slowdown to page (the target)
# after the page, evaluations enough for a page of another node at the same moment
AFTER_PAGE_S = 3.0


def slow_job(framework: Framework) -> JobSpec:
    return JobSpec(
        framework=framework,
        device_s=DEVICE_S,
        slow_node=SLOW_NODE,
        slow_factor=1.3,
        slow_after_s=JUDGED_S,
        # the page is due 28 s after the slowdown; past it the test has failed anyway
        duration_s=JUDGED_S + PAGE_WITHIN_S / FACTOR + 15,
        time_factor=FACTOR,
        training_job=f"lab-{framework}",
    )


def slow_node_paged(result: JobResult) -> bool:
    page = result.first_fired(STRAGGLER, result.spec.node_name(SLOW_NODE))
    return (
        page is not None
        and page.fired_at is not None
        and (result.ended_at - page.fired_at >= AFTER_PAGE_S)
    )


def diagnosis(result: JobResult) -> str:
    start = result.slowed_at or result.first_step_at
    ratios = {
        node: round(ratio, 3)
        for node in result.spec.node_names
        if (ratio := result.mean_ratio(node, start + JUDGED_S / 2)) is not None
    }
    alerts = [
        (a.name, a.node, a.severity, round(a.active_at - result.first_step_at, 1),
         a.fired_at and round(a.fired_at - result.first_step_at, 1))
        for a in result.alerts
    ]  # fmt: skip
    started = round(result.first_step_at - result.launched_at, 1)
    slowed = result.slowed_at and round(result.slowed_at - result.first_step_at, 1)
    return (
        f"first step {started} s after the launch; slowed at {slowed} s; "
        f"compute ratios since: {ratios}; alerts (s): {alerts}"
    )


def assert_pages_the_slow_node_only(result: JobResult) -> None:
    spec = result.spec
    slow = spec.node_name(SLOW_NODE)
    why = diagnosis(result)
    assert result.slowed_at is not None, why
    assert result.slowed_at - result.first_step_at >= JUDGED_S, why
    # Nothing paged while every node was healthy.
    assert not [a for a in result.pages() if a.fired_at and a.fired_at < result.slowed_at], why
    page = result.first_fired(STRAGGLER, slow)
    assert page is not None and page.fired_at is not None, why
    assert page.active_at >= result.slowed_at, why
    to_page = spec.uncompressed(page.fired_at - result.slowed_at)
    assert to_page <= PAGE_WITHIN_S, why
    # No alert of any severity named another node.
    assert not [a for a in result.fired() if a.node is not None and a.node != slow], why
    ratio = result.mean_ratio(slow, result.slowed_at + JUDGED_S / 2)
    print(f"{spec.framework}: {slow} computes {ratio:.3f}x its peers; paged "
          f"{to_page / 60:.1f} uncompressed minutes after its slowdown; {why}")  # fmt: skip


@pytest.mark.parametrize(
    "framework", ["ddp", "fsdp", "deepspeed", "lightning", "lightning-fsdp", "hf"]
)
def test_one_slow_rank_pages_its_node_and_no_other(framework: Framework, tmp_path: Path) -> None:
    if framework.startswith("lightning"):
        pytest.importorskip("pytorch_lightning")
    elif framework == "hf":
        pytest.importorskip("transformers")
    elif framework == "deepspeed":
        pytest.importorskip("deepspeed")
    result = run_job(slow_job(framework), tmp_path, until=slow_node_paged)
    assert_pages_the_slow_node_only(result)


def test_a_node_given_longer_batches_is_not_paged_as_a_straggler(tmp_path: Path) -> None:
    imbalanced = 1
    spec = JobSpec(
        device_s=DEVICE_S,
        imbalanced_node=imbalanced,
        work_factor=1.3,
        # the straggler's whole window and `for`, and time to evaluate after them
        duration_s=JUDGED_S + 15,
        time_factor=FACTOR,
        training_job="lab-imbalanced",
    )
    result = run_job(spec, tmp_path)
    why = diagnosis(result)
    node = spec.node_name(imbalanced)
    # It computes as much longer as a straggler (the ratio alone would page) ...
    ratio = result.mean_ratio(node, result.first_step_at + JUDGED_S / 2)
    assert ratio is not None and ratio > RULES.straggler_ratio, why
    # ... and its extra tokens explain it: nothing pages.
    assert not result.fired(STRAGGLER), why
    assert not result.pages(), why
    print(f"{node} computes {ratio:.3f}x its peers on 1.3x the tokens, unpaged; {why}")
