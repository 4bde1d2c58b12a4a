"""The demo scenario's story (``scenarios/demo.yaml``): what it does and pages, minute by
minute. ``gpufleet simulate`` prints it when it starts serving (``docker compose logs
simulator`` tells the timeline); ``gpufleet demo`` and the demo tests read it too."""

from __future__ import annotations

import re
import time

from gpufleet.schema.alerts import AlertName

# The demo scenario's story (scenarios/demo.yaml), in minutes after the simulator starts;
# docs/quickstart.md's demo timeline tells the same. tests/test_demo_story.py (five times faster,
# against a real Prometheus) and tests/containers/ (the compose stack) check that these
# pages, and only these, fire in this order within PAGES' minutes.
STORY = (
    ("0:20", "GPU 5 of node-012 turns 25% slow; the whole lock-step job waits for it"),
    ("1:20", "all 64 nodes checkpoint at once: 30 s of each 32 s write is queued for storage"),
    ("~4:30", f"page: {AlertName.STRAGGLER} for node-012 (warning)"),
    ("~7:00", f"page: {AlertName.CHECKPOINT_QUEUE_BOUND} for job sim-llm (warning)"),
    ("8:00", "GPU 3 of node-040 falls off the bus (XID 79): the job stops"),
    (
        "~8:05-9:10",
        f"pages: {AlertName.CRITICAL_XID} and {AlertName.GPU_LOST} for node-040 (critical)",
    ),
    ("9:15", "the automatic retry trains again without node-040 (exclusion and attempt in the"),
    ("", f"fleet ledger); {AlertName.JOB_HUNG} does not page: the job was down 75 s, not 2 min"),
)
# The pages, in firing order: (alert names, node or job, (earliest, latest) minute).
PAGES = (
    ((AlertName.STRAGGLER,), "node-012", (3, 6)),
    ((AlertName.CHECKPOINT_QUEUE_BOUND,), "sim-llm", (6, 8)),
    ((AlertName.CRITICAL_XID, AlertName.GPU_LOST), "node-040", (8, 10)),
)
_MINUTE = re.compile(r"(\d+):(\d\d)")


def story(scenario: str, start: float | None = None) -> str:
    """What the demo scenario will do and page, minute by minute ('' for another one);
    with ``start``, the Unix time the simulator's clock started, at what UTC time too."""
    if scenario != "demo":
        return ""
    if start is None:
        lines = "".join(f"  {minute:>10}  {what}\n" for minute, what in STORY)
        return f"What happens, minutes after the simulator started (pages: see above):\n{lines}"
    rows = []
    for minute, what in STORY:
        found = _MINUTE.search(minute)
        at = start + int(found.group(1)) * 60 + int(found.group(2)) if found else None
        clock = time.strftime("%H:%M:%S", time.gmtime(at)) if at is not None else ""
        rows.append(f"  {clock:>8}  {minute:>10}  {what}\n")
    return "What happens (UTC; minutes after the simulator started):\n" + "".join(rows)


def announce(scenario: str, nodes: int, gpus: int, start: float) -> str:
    """What ``gpufleet simulate`` prints when it starts serving: its cluster, the moment its
    scenario's clock started (UTC, and as Unix time for scripts) and, for the demo, the
    story to come, so that ``docker compose logs simulator`` tells the timeline."""
    begun = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(start))
    head = (
        f"gpufleet simulate: {nodes} nodes x {gpus} GPUs, scenario {scenario}; its clock "
        f"started at {begun} UTC (unix {start:.3f})\n"
    )
    return head + story(scenario, start)
