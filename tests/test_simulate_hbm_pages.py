"""One HBM error pages once: the simulator's XID burst (48, 94, 63, 154) on one GPU, the
generated rules on a real Prometheus, and a real Alertmanager under the shipped routing
(deploy/alertmanager/alertmanager.yml: grouped by alertname, node and training job, a
critical alert of a node inhibiting its warnings), only the webhook's address changed.

What the rules make of each XID is read from the XID catalogue in alerts/gpu.rules.yaml,
so the test follows the rules as they are regenerated. What must hold whatever they say:
every page is for the failing node (or for its job, hung while the incident stopped it),
each alert name pages in one notification group that never fires again once resolved, and
the critical XIDs that page are those the catalogue calls critical. Time is compressed as
in the demo test (``FACTOR``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.lab.devstack import AlertmanagerServer, PrometheusServer, file_sd_scrape_config
from gpufleet.lab.processes import wait_until
from gpufleet.lab.realjob import compressed_rules
from gpufleet.rules.config import RulesConfig
from gpufleet.simulate.cluster import Cluster
from gpufleet.simulate.config import (
    ClusterSpec,
    Confounders,
    FaultRates,
    Scenario,
)
from gpufleet.simulate.faults import Kind
from gpufleet.simulate.serve import SimulatorServer

# It watches (ONSET_S + WATCH_S) / FACTOR = 228 s of wall time by design: the default
# 300 s left a loaded machine about a minute to start the simulator and the servers.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[1]
FACTOR = 5
NODE, GPU = 5, 2
ONSET_S = 240.0  # uncompressed: four minutes of healthy training first
# Until the 10-minute XID and ECC windows have closed (their alerts resolved, which lifts
# the inhibition of the node's warnings), plus a margin: uncompressed seconds.
WATCH_S = 15 * 60
XID_SET = re.compile(r'"xid", "(\d+)"')


def the_incident() -> Scenario:
    """A quiet 16-node job and one HBM error: contained (XID 94), its row remapped (63)."""
    return Scenario(
        name="hbm-incident",
        cluster=ClusterSpec(nodes=16),
        rates=FaultRates(
            fail_stop_per_1000_node_days=0.0,
            fail_slow_compute_per_node_day=0.0,
            fail_slow_comm_per_node_day=0.0,
            auto_retry_success=1.0,
            hbm_remap_failure_share=0.0,
        ),
        confounders=Confounders(
            data_loader_stalls_per_hour=0.0,
            gc_pauses_per_node_hour=0.0,
            cluster_slowdowns_per_day=0.0,
            workload_imbalances_per_day=0.0,
            checkpoints=False,
            evals=False,
        ),
        episodes=[
            {"kind": "fail_stop", "cause": "hbm", "node": NODE, "gpu": GPU, "xid": 94,
             "start": ONSET_S, "duration": 4 * 3600.0}
        ],
    ).compressed(FACTOR)  # fmt: skip


def shipped_routing(webhook_url: str, path: Path) -> Path:
    """deploy/alertmanager/alertmanager.yml with its webhook pointed at the test's receiver."""
    config = yaml.safe_load((ROOT / "deploy/alertmanager/alertmanager.yml").read_text())
    [pages] = [r for r in config["receivers"] if r.get("webhook_configs")]
    for webhook in pages["webhook_configs"]:
        webhook["url"] = webhook_url
    path.write_text(yaml.safe_dump(config))
    return path


def xid_classes() -> dict[str, str]:
    """The XID catalogue of the generated rules: code -> class (act_now, maintenance, ...),
    from records of one code each (an ``xid`` label) or of a class each (``xid`` set by
    label_replace in the expression)."""
    rules = yaml.safe_load((ROOT / "alerts/gpu.rules.yaml").read_text())
    classes = {}
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("record") != "gpufleet:xid_catalogue:info":
                continue
            labels = rule["labels"]
            codes = [labels["xid"]] if "xid" in labels else XID_SET.findall(rule["expr"])
            classes |= dict.fromkeys(codes, labels["class"])
    assert classes.get("48") == "act_now", "no XID catalogue found in alerts/gpu.rules.yaml"
    return classes


def alert_severities() -> dict[str, str]:
    return {
        rule["alert"]: rule["labels"]["severity"]
        for path in sorted((ROOT / "alerts").glob("*.rules.yaml"))
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def fired_at(alert: dict[str, Any]) -> float:
    """Prometheus's firing time of an alert, from its RFC 3339 ``startsAt``."""
    return datetime.fromisoformat(alert["startsAt"].replace("Z", "+00:00")).timestamp()


def test_one_hbm_error_pages_once_per_alert_for_its_node_only(
    tmp_path: Path,
    serve_asgi: Callable[..., Any],
    prometheus_factory: Callable[..., PrometheusServer],
    alertmanager_factory: Callable[..., AlertmanagerServer],
    rule_files: Callable[[RulesConfig], list[str]],
    webhook_receiver: Any,
) -> None:
    manager = alertmanager_factory(
        config_file=shipped_routing(webhook_receiver.url, tmp_path / "alertmanager.yml")
    )
    targets = tmp_path / "targets.json"
    targets.write_text("[]")
    prometheus = prometheus_factory(
        scrape_configs=[file_sd_scrape_config("gpufleet-agent", targets)],
        rule_files=rule_files(compressed_rules(FACTOR)),
        alertmanager_urls=[manager.url],
    )
    cluster = Cluster(the_incident(), 0, time.time(), 86400.0)
    [incident] = [e for e in cluster.timeline.episodes if e.kind == Kind.FAIL_STOP]
    burst = [str(code) for _, code in incident.details["xid_burst"]]
    assert burst == ["48", "94", "63", "154"]
    node = cluster.node_names[NODE]
    simulator = SimulatorServer(cluster, tick_s=0.5)
    simulator.start()
    firing: dict[tuple[str, str], set[str]] = {}  # (alert, node or job) -> XIDs
    try:
        server = serve_asgi(simulator)
        simulator.write_targets(targets, f"127.0.0.1:{server.port}")
        prometheus.wait_for_targets_up(16, timeout=60)

        def watch() -> bool:
            for alert in prometheus.firing_alerts():
                labels = alert["labels"]
                where = labels.get("node") or labels.get("training_job", "-")
                xids = firing.setdefault((labels["alertname"], where), set())
                xids.update({labels["xid"]} if "xid" in labels else set())
            return time.time() >= incident.start + WATCH_S / FACTOR

        wait_until(watch, ONSET_S / FACTOR + WATCH_S / FACTOR + 60, interval=1.0,
                   what="the incident's alerts to fire and resolve")  # fmt: skip
    finally:
        simulator.stop()

    notes = [n for n in webhook_receiver.notifications if n["receiver"] == "pages"]
    groups: dict[str, list[dict[str, Any]]] = {}
    for note in notes:
        groups.setdefault(note["groupKey"], []).append(note)
    pages = sorted(
        (n[0]["groupLabels"]["alertname"], n[0]["groupLabels"].get("node", "-"))
        for n in groups.values()
    )
    print(f"firing in Prometheus: {sorted((k, sorted(v)) for k, v in firing.items())}")
    print(f"notification groups: {pages}")

    # Every page is the failing node's, or the job's while the incident stopped it (it
    # restarts without the node after the automatic retry's delay); one group per alert.
    severities = alert_severities()
    assert pages, "the incident paged nothing"
    node_pages = [alert for alert, where in pages if where != "-"]
    job_pages = [alert for alert, where in pages if where == "-"]
    assert {where for _, where in pages} <= {node, "-"}, pages
    assert len(set(node_pages)) == len(node_pages), pages
    assert {alert for alert, _ in pages} <= set(severities)
    assert set(job_pages) <= {"GpuFleetJobHung"}, pages
    restarted = float(incident.details["restarted_at"])  # type: ignore[arg-type]
    for alert in (a for note in notes for a in note["alerts"] if "node" not in a["labels"]):
        assert alert["labels"]["training_job"] == cluster.spec.job
        assert incident.start < fired_at(alert) < restarted, (alert, incident.start, restarted)
    # No group pages again once it resolved (a flapping alert would be a second page).
    for key, sent in groups.items():
        statuses = [note["status"] for note in sent]
        refired = "resolved" in statuses and "firing" in statuses[statuses.index("resolved") :]
        assert not refired, (key, statuses)
    # The critical XIDs that page are the burst's codes the catalogue calls act_now; the
    # others page at most as warnings, which the node's critical alerts inhibit.
    classes = xid_classes()
    critical_xids = {
        alert["labels"]["xid"]
        for note in notes
        for alert in note["alerts"]
        if alert["labels"]["alertname"] == "GpuFleetCriticalXid"
    }
    assert critical_xids == {code for code in burst if classes.get(code) == "act_now"}
    assert ("GpuFleetEccUncorrectable", node) in pages
