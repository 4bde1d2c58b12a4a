"""``gpufleet slurm-watch``: node drains and job requeues from a real slurmctld into the ledger.

The cluster is real (``slurm_cluster``: Debian's munged, slurmctld and a slurmd for this
host, plus three nodes with no slurmd); ``scontrol`` drains, resumes and requeues as an
admin would. The ledger is the real one. The watcher is driven one poll at a time where
the test needs to know what it saw, and run as ``gpufleet slurm-watch`` where a real
Prometheus scrapes it and the ledger and ``GpuFleetRepeatOffenderNode`` must fire.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpufleet.cli import parse
from gpufleet.fleet.app import create_app
from gpufleet.fleet.ledger_client import LedgerClient
from gpufleet.fleet.store import LedgerStore
from gpufleet.lab.devstack import PrometheusServer, static_scrape_config
from gpufleet.lab.processes import ManagedProcess, free_port, http_get, wait_until
from gpufleet.rules.config import RulesConfig
from gpufleet.schema.slurm import SLURM_WATCH_FAMILIES
from gpufleet.sources.reasons import reason_from_text
from gpufleet.sources.slurm import SlurmWatcher, event_key
from gpufleet.sources.slurm_service import SlurmWatchCollector
from gpufleet.sources.slurmstate import (
    SlurmCommands,
    SlurmJob,
    SlurmNode,
    expand_hostlist,
    parse_nodes,
)
from slurm_cluster import CLUSTER, SlurmCluster, require_slurm

TOKEN = "ledger-write-token"

# --- reasons, states, host lists (no Slurm needed) ----------------------------------------


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("XID 79 fallen off the bus", "xid79"),
        ("GPU fell off the bus: Xid (PCI:0000:cb:00): 79, pid=1234", "xid79"),
        ("xid=48 DBE", "xid48"),
        ("Kill task failed", "kill_task_failed"),
        ("Not responding", "not_responding"),
        ("NHC: GPU check failed", "nhc_gpu_check_failed"),
        ("RMA ticket #45123 opened 2026-12-01", "rma_ticket_opened"),
        ("batch job complete failure [root@2026-12-04T18:57:44]", "batch_job_complete_failure"),
        ("", "drain"),
        ("!!!", "drain"),
        ("word " * 30, "_".join(["word"] * 13)),  # 64 characters
    ],
)
def test_a_slurm_reason_becomes_a_ledger_reason(text: str, reason: str) -> None:
    assert reason_from_text(text, "drain") == reason
    assert len(reason) <= 64


def test_sinfo_json_of_22_05_and_of_later_releases_reads_the_same() -> None:
    old = {"name": "n1", "state": "idle", "state_flags": ["DRAIN"], "reason": "XID 79",
           "reason_changed_at": 1_800_000_000}  # fmt: skip
    changed_at = {"set": True, "infinite": False, "number": 1_800_000_000}
    new = {"name": "n1", "state": ["IDLE", "DRAIN"], "reason": "XID 79",
           "reason_changed_at": changed_at}  # fmt: skip
    assert SlurmNode.from_json(old) == SlurmNode.from_json(new)
    node = SlurmNode.from_json(new)
    assert node.out_of_service and node.ledger_reason == "xid79"
    assert node.reason_changed_at == 1_800_000_000


@pytest.mark.parametrize(
    ("state", "flags", "out"),
    [
        ("idle", [], False),
        ("mixed", ["DRAIN"], True),  # draining
        ("idle", ["DRAIN"], True),  # drained
        ("down", ["NOT_RESPONDING"], True),
        ("allocated", ["FAIL"], True),
        ("idle", ["NOT_RESPONDING"], False),  # not yet down
        ("unknown", [], False),
        ("idle", ["POWERED_DOWN"], False),  # power saving is no exclusion
    ],
)
def test_what_takes_a_node_out_of_service(state: str, flags: list[str], out: bool) -> None:
    node = SlurmNode.from_json({"name": "n", "state": state, "state_flags": flags})
    assert node.out_of_service is out
    if out and state == "down":
        assert node.ledger_reason == "down"


def test_a_node_listed_in_two_partitions_is_one_node() -> None:
    nodes = parse_nodes({"nodes": [{"name": "a", "state": "idle"}, {"name": "a"}, {"name": ""}]})
    assert [node.name for node in nodes] == ["a"]


def test_a_job_of_either_release_reads_the_same() -> None:
    old = {"job_id": 7, "job_state": "RUNNING", "restart_cnt": 2, "start_time": 1_800_000_100,
           "submit_time": 1_800_000_000, "end_time": 0, "nodes": "gpu[01-02]"}  # fmt: skip
    new = {**old, "job_state": ["RUNNING"], "restart_cnt": {"set": True, "number": 2}}
    assert SlurmJob.from_json(old) == SlurmJob.from_json(new)
    job = SlurmJob.from_json(old)
    assert job.running and job.restarts == 2 and job.ended_at is None and job.outcome is None


def test_host_lists_expand() -> None:
    assert expand_hostlist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07",
                                                       "login1"]  # fmt: skip
    assert expand_hostlist("vm") == ["vm"]
    assert expand_hostlist("") == []


def test_keys_come_from_slurm_and_fit_the_ledger() -> None:
    assert event_key("c", "gpu01", "exclude", 1_800_000_000) == "slurm:c:gpu01:exclude:1800000000"
    long = event_key("c", "n" * 200, "exclude", 1_800_000_000)
    assert len(long) <= 128 and long.endswith(":exclude:1800000000")


def test_the_command_line_defaults() -> None:
    values = parse(["slurm-watch"])
    assert values.listen == ("0.0.0.0", 9408)
    assert values.interval == 15.0 and values.attempts == "requeued"
    assert values.cluster is None and values.max_event_age == 6 * 86400
    assert values.state_file == "/var/lib/gpufleet/slurm-watch.json"


def test_the_systemd_unit_sets_only_variables_the_command_reads() -> None:
    from gpufleet.cli.slurm import SLURM_WATCH_OPTIONS

    unit = Path(__file__).parents[1] / "deploy" / "slurm" / "gpufleet-slurm-watch.service"
    text = unit.read_text()
    variables = {line.split("=", 2)[1] for line in text.splitlines()
                 if line.startswith("Environment=")}  # fmt: skip
    assert variables <= {option.env for option in SLURM_WATCH_OPTIONS}
    assert "ExecStart=/opt/gpufleet/bin/gpufleet slurm-watch\n" in text


def test_the_watcher_exports_what_the_schema_defines() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    watcher = SlurmWatcher(SlurmCommands(), LedgerClient("http://127.0.0.1:9", ""), "c")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SlurmWatchCollector(watcher))
    text = generate_latest(registry).decode()
    declared = {f.name.removesuffix("_total") if f.kind == "counter" else f.name: f
                for f in SLURM_WATCH_FAMILIES}  # fmt: skip
    seen = set()
    for family in text_string_to_metric_families(text):
        definition = declared[family.name]
        assert (family.type, family.documentation) == (definition.kind, definition.help)
        for found in family.samples:
            assert set(found.labels) == set(definition.labels), found
        seen.add(family.name)
    assert seen == set(declared)


# --- against a real slurmctld ---------------------------------------------------------------


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    require_slurm()
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        previous = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = str(cluster.conf)  # the in-process watcher's sinfo / squeue
        yield cluster
    finally:
        cluster.stop()
        if "previous" in locals():
            if previous is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = previous


@pytest.fixture
def ledger(tmp_path: Path, serve_asgi: Callable[..., Any]) -> Any:
    return serve_asgi(create_app(LedgerStore(tmp_path / "fleet.db"), token=TOKEN))


def watcher_for(ledger: Any, state: Path | None, attempts: str = "requeued") -> SlurmWatcher:
    return SlurmWatcher(
        SlurmCommands(), LedgerClient(ledger.url, TOKEN), CLUSTER, state_file=state,
        attempts=attempts,
    )  # fmt: skip


def rows(ledger: Any, path: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = LedgerClient(ledger.url, TOKEN).get_all(path)
    return found


def sample(watcher: SlurmWatcher, name: str, **labels: str) -> float | None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SlurmWatchCollector(watcher))
    return registry.get_sample_value(name, labels)


def written(watcher: SlurmWatcher, action: str, outcome: str) -> float | None:
    return sample(watcher, "gpufleet_slurm_watch_ledger_writes_total", action=action,
                  outcome=outcome)  # fmt: skip


@pytest.mark.integration
def test_a_drain_is_one_exclusion_and_its_resume_one_release_however_often_seen(
    slurm: SlurmCluster, ledger: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "slurm-watch.json"
    watcher = watcher_for(ledger, state)
    assert watcher.poll()
    assert rows(ledger, "/v1/exclusions") == []
    slurm.drain("gpu01", "XID 79 fallen off the bus")
    drained_at = slurm.node("gpu01")["reason_changed_at"]
    assert watcher.poll() and watcher.poll()  # a duplicate poll
    (exclusion,) = rows(ledger, "/v1/exclusions")
    assert (exclusion["node"], exclusion["reason"], exclusion["source"]) == ("gpu01", "xid79",
                                                                             "slurm")  # fmt: skip
    assert exclusion["excluded_at"] == drained_at
    assert exclusion["idempotency_key"] == f"slurm:{CLUSTER}:gpu01:exclude:{drained_at}"
    assert "XID 79 fallen off the bus" in exclusion["note"]
    assert sample(watcher, "gpufleet_slurm_watch_nodes_out_of_service") == 1
    assert sample(watcher, "gpufleet_slurm_watch_nodes") == 4

    # The same drain sent again by a watcher that lost its state and could not read the
    # ledger first: the ledger answers with its first answer and stores nothing.
    replaying = watcher_for(ledger, None)
    monkeypatch.setattr(replaying, "_refresh_open_exclusions", lambda: None)
    assert replaying.poll()
    assert written(replaying, "exclude", "replayed") == 1
    # A restarted watcher, with its state and without it: nothing at all.
    for restarted in (watcher_for(ledger, state), watcher_for(ledger, None)):
        assert restarted.poll()
        assert sample(restarted, "gpufleet_slurm_watch_changes_total", action="exclude") == 0
    assert len(rows(ledger, "/v1/exclusions")) == 1

    slurm.resume("gpu01")
    assert watcher.poll() and watcher.poll()
    (exclusion,) = rows(ledger, "/v1/exclusions")
    assert exclusion["released_at"] is not None and exclusion["release_source"] == "slurm"
    assert written(watcher, "exclude", "stored") == 1
    assert written(watcher, "release", "stored") == 1
    assert sample(watcher, "gpufleet_slurm_watch_changes_total", action="exclude") == 1
    assert sample(watcher, "gpufleet_slurm_watch_ledger_pending") == 0
    restarted = watcher_for(ledger, state)
    assert restarted.poll()
    assert sum(restarted.stats.changes.values()) == 0
    (exclusion,) = rows(ledger, "/v1/exclusions")
    assert exclusion["released_at"] is not None


@pytest.mark.integration
def test_a_drain_older_than_the_ledger_keeps_keys_is_skipped_not_sent(
    slurm: SlurmCluster, ledger: Any
) -> None:
    slurm.drain("gpu01", "Kill task failed")
    try:
        # Seen a week later by a watcher with no state: its key may have expired in the
        # ledger, so sending it could count it twice.
        later = SlurmWatcher(SlurmCommands(), LedgerClient(ledger.url, TOKEN), CLUSTER,
                             clock=lambda: time.time() + 7 * 86400)  # fmt: skip
        assert later.poll() and later.poll()
        assert rows(ledger, "/v1/exclusions") == []
        assert sample(later, "gpufleet_slurm_watch_skipped_total", action="exclude") == 1
        assert sample(later, "gpufleet_slurm_watch_changes_total", action="exclude") == 0
    finally:
        slurm.resume("gpu01")


@pytest.mark.integration
def test_an_exclusion_someone_else_opened_is_a_conflict_and_theirs_to_release(
    slurm: SlurmCluster, ledger: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    watcher = watcher_for(ledger, None)
    assert watcher.poll()  # it read the ledger's open exclusions: none
    LedgerClient(ledger.url, TOKEN).exclude("gpu03", "rma", key="operator-gpu03-1")
    monkeypatch.setattr(watcher, "_refresh_open_exclusions", lambda: None)
    slurm.drain("gpu03", "Not responding")
    assert watcher.poll()
    assert written(watcher, "exclude", "conflict") == 1  # 409: already excluded
    monkeypatch.undo()
    slurm.resume("gpu03")
    assert watcher.poll()
    (exclusion,) = rows(ledger, "/v1/exclusions")
    assert exclusion["reason"] == "rma" and exclusion["released_at"] is None
    assert sample(watcher, "gpufleet_slurm_watch_changes_total", action="release") == 0


@pytest.mark.integration
def test_a_requeue_ends_the_attempt_and_starts_the_next(slurm: SlurmCluster, ledger: Any) -> None:
    watcher = watcher_for(ledger, None)
    job = slurm.submit("--requeue", "-w", slurm.host, "--wrap", "sleep 300")

    def running(restarts: int) -> bool:
        seen = slurm.job(job)
        # Polled after Slurm said so: the watcher has seen the run too.
        return seen["job_state"] == "RUNNING" and seen["restart_cnt"] == restarts and watcher.poll()

    def start_now() -> None:
        # A requeued job waits 120 s (Slurm's credential lifetime) unless told to start; the
        # requeue sets that begin time once the job is PENDING again.
        wait_until(lambda: slurm.job(job)["job_state"] == "PENDING", 30, interval=0.1,
                   what=f"job {job} pending again")  # fmt: skip
        slurm.scontrol("update", f"JobId={job}", "StartTime=now")

    try:
        wait_until(lambda: running(0), 30, interval=0.2, what=f"job {job} running")
        assert rows(ledger, "/v1/attempts") == []  # not requeued yet: not recorded
        first_start = slurm.job(job)["start_time"]

        # A person requeues it.
        slurm.scontrol("requeue", job)
        start_now()
        wait_until(lambda: running(1), 30, interval=0.2, what=f"job {job} running again")
        recorded = sorted(rows(ledger, "/v1/attempts"), key=lambda a: a["attempt"])
        assert len(recorded) == 2, recorded
        first, second = recorded
        assert (first["attempt"], first["trigger"], first["outcome"], first["cause"]) == (
            1, "initial", "failed", "requeued")  # fmt: skip
        assert first["started_at"] == first_start and first["source"] == "slurm"
        assert (second["attempt"], second["trigger"], second["outcome"]) == (2, "manual", None)

        # Its node fails: Slurm requeues it by itself.
        slurm.scontrol("update", f"NodeName={slurm.host}", "State=DOWN", "Reason=Kill task failed")
        wait_until(lambda: slurm.job(job)["restart_cnt"] == 2, 30, interval=0.2,
                   what="Slurm requeueing the job")  # fmt: skip
        assert watcher.poll()
        slurm.resume(slurm.host)
        start_now()
        wait_until(lambda: running(2), 30, interval=0.2, what=f"job {job} running a third time")
        attempts = sorted(rows(ledger, "/v1/attempts"), key=lambda a: a["attempt"])
        assert [(a["attempt"], a["trigger"]) for a in attempts] == [
            (1, "initial"), (2, "manual"), (3, "auto")]  # fmt: skip
        assert (attempts[1]["outcome"], attempts[1]["cause"]) == ("failed", "kill_task_failed")
        host = [e for e in rows(ledger, "/v1/exclusions") if e["node"] == slurm.host]
        assert [(e["reason"], e["released_at"] is not None) for e in host] == [
            ("kill_task_failed", True)]  # fmt: skip

        # Replays: a new watcher (no state) and duplicate polls add nothing.
        again = watcher_for(ledger, None)
        assert again.poll() and again.poll()
        assert len(rows(ledger, "/v1/attempts")) == 3
        assert written(again, "started", "stored") == 0
    finally:
        slurm.run("scancel", job, check=False)
    wait_until(lambda: slurm.job(job)["job_state"] == "CANCELLED", 30, interval=0.2,
               what="the job cancelled")  # fmt: skip
    assert watcher.poll()
    last = max(rows(ledger, "/v1/attempts"), key=lambda a: a["attempt"])
    assert (last["attempt"], last["outcome"]) == (3, "cancelled")


@pytest.mark.integration
def test_repeat_offender_fires_from_drains_slurm_recorded(
    slurm: SlurmCluster,
    ledger: Any,
    tmp_path: Path,
    prometheus_factory: Callable[..., PrometheusServer],
    rule_files: Callable[[RulesConfig], list[str]],
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    port = free_port()
    argv = [sys.executable, "-m", "gpufleet", "slurm-watch", "--fleet-url", ledger.url,
            "--fleet-token-file", str(token_file), "--listen", f"127.0.0.1:{port}",
            "--interval", "1", "--state-file", str(tmp_path / "state.json")]  # fmt: skip
    metrics = f"http://127.0.0.1:{port}/metrics"
    watcher = ManagedProcess(argv, tmp_path / "slurm-watch.log", slurm.env)
    watcher.start()

    def exclusions(node: str) -> list[dict[str, Any]]:
        return [e for e in rows(ledger, "/v1/exclusions") if e["node"] == node]

    try:
        wait_until(lambda: b"gpufleet_slurm_watch_up 1.0" in http_get(metrics), 30,
                   what="the watcher polling")  # fmt: skip
        slurm.drain("gpu02", "XID 79 fallen off the bus")
        slurm.drain("gpu03", "XID 48 DBE")
        wait_until(lambda: exclusions("gpu02"), 30, interval=0.2, what="gpu02 excluded")
        first = slurm.node("gpu02")["reason_changed_at"]
        slurm.resume("gpu02")
        wait_until(lambda: exclusions("gpu02")[0]["released_at"], 30, interval=0.2,
                   what="gpu02 released")  # fmt: skip
        # Slurm's reason time has whole seconds: the second drain must be a later one.
        wait_until(lambda: time.time() >= first + 1.05, 2, interval=0.05, what="a new second")
        slurm.drain("gpu02", "XID 79 fallen off the bus")
        wait_until(lambda: len(exclusions("gpu02")) == 2, 30, interval=0.2,
                   what="gpu02 excluded again")  # fmt: skip

        # A restarted watcher records nothing twice.
        watcher.stop()
        watcher.start()
        wait_until(lambda: b"gpufleet_slurm_watch_polls_total 2.0" in http_get(metrics), 30,
                   what="the restarted watcher polling")  # fmt: skip
        assert len(exclusions("gpu02")) == 2 and len(exclusions("gpu03")) == 1

        prometheus = prometheus_factory(
            scrape_configs=[
                static_scrape_config("gpufleet-fleet", [f"127.0.0.1:{ledger.port}"]),
                static_scrape_config("gpufleet-slurm-watch", [f"127.0.0.1:{port}"]),
            ],
            rule_files=rule_files(RulesConfig()),
        )

        def firing() -> list[dict[str, Any]]:
            return [
                a
                for a in prometheus.firing_alerts()
                if a["labels"]["alertname"] == "GpuFleetRepeatOffenderNode"
            ]

        alerts = wait_until(firing, 60, interval=0.5, what="GpuFleetRepeatOffenderNode firing")
        assert [a["labels"]["node"] for a in alerts] == ["gpu02"]  # gpu03 was drained once
        counted = prometheus.query('node:gpufleet_fleet_exclusions:increase7d{node=~"gpu0[23]"}')
        assert {s["metric"]["node"]: float(s["value"][1]) for s in counted} == {
            "gpu02": 2.0,
            "gpu03": 1.0,
        }
        sent = prometheus.wait_for_series(
            'gpufleet_slurm_watch_ledger_writes_total{action="exclude",outcome="stored"}'
        )
        assert float(sent[0]["value"][1]) == 0  # the restarted watcher stored nothing
    finally:
        watcher.stop()
        slurm.resume("gpu02")
        slurm.resume("gpu03")
