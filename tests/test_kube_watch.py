"""``gpufleet kube-watch``: node exclusions from Kubernetes into the ledger.

No API server can run here, so the tests meet the watcher at the API server's HTTP
boundary: a real HTTP server in the test answers ``GET /api/v1/nodes`` (paged, with
``continue``) and the watch (``?watch=1&resourceVersion=...``) with a chunked stream of
JSON lines, as the API server does, from scripted Node objects shaped like real ones
(NVSentinel's taint and conditions, GKE's ``nvidia.com/gpu=present`` taint). The story:
node-a is quarantined for XID 79 and comes back, the stream ends and resumes from its
last bookmark, node-a is cordoned again and node-b gets a GPU memory condition, then the
watch answers 410 Gone and the relist shows node-b healthy again: a release seen only by
diffing. The ledger is the real one; its answers are lost on the way back once per write,
so every write is retried with its key. Then a real Prometheus scraping that ledger fires
``GpuFleetRepeatOffenderNode`` for node-a (two exclusions) and not for node-b (one).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpufleet.cli import parse
from gpufleet.fleet.app import create_app
from gpufleet.fleet.ledger_client import LedgerClient, LedgerError
from gpufleet.fleet.models import ExclusionIn
from gpufleet.fleet.store import LedgerStore
from gpufleet.lab.devstack import PrometheusServer, static_scrape_config
from gpufleet.lab.processes import ManagedProcess, free_port, http_get, wait_until
from gpufleet.rules.config import RulesConfig
from gpufleet.sources.kube import KEY_PREFIX, NodeWatcher
from gpufleet.sources.kube_service import KubeWatchCollector
from gpufleet.sources.kube_signals import (
    DEFAULT_CONDITIONS,
    DEFAULT_IGNORED_TAINTS,
    DEFAULT_TAINTS,
    NodeRules,
    episode_reason,
)
from gpufleet.sources.kubeapi import (
    ApiAccess,
    KubeApi,
    KubeApiError,
    in_cluster_access,
    kubeconfig_access,
)
from gpufleet.sources.reasons import reason_from_key, xid_reason

TOKEN = "sa-token-for-the-test"
# What this ledger records as the source (one from before named sources takes "auto").
SOURCE = "kubernetes" if "kubernetes" in str(ExclusionIn.model_fields["source"]) else "auto"


# --- Node objects as the API server returns them ---------------------------------------

READY = {
    "type": "Ready",
    "status": "True",
    "reason": "KubeletReady",
    "message": "kubelet is posting ready status",
    "lastTransitionTime": "2026-12-01T08:00:00Z",
}
GKE_GPU_POOL = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def node(
    name: str,
    version: str,
    *,
    cordoned: bool = False,
    taints: tuple[dict[str, Any], ...] = (),
    conditions: tuple[dict[str, Any], ...] = (),
) -> dict[str, Any]:
    spec: dict[str, Any] = {"podCIDR": "10.4.0.0/24", "taints": [GKE_GPU_POOL, *taints]}
    if cordoned:
        spec["unschedulable"] = True
        # the node lifecycle controller's own taint for a cordon: not counted twice
        spec["taints"].append(
            {
                "key": "node.kubernetes.io/unschedulable",
                "effect": "NoSchedule",
                "timeAdded": "2026-12-01T09:00:00Z",
            }
        )
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": version,
            "labels": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
        },
        "spec": spec,
        "status": {"conditions": [READY, *conditions]},
    }


XID79_TAINT = {"key": "nvidia.com/syslog-xid-error", "value": "true", "effect": "NoSchedule"}
XID79_CONDITION = {
    "type": "SysLogsXIDError",
    "status": "True",
    "reason": "SysLogsXIDErrorIsNotHealthy",
    "message": "ErrorCode:79 PCI:0000:cb:00 GPU has fallen off the bus - RecommendedAction: "
    "RESTART_BM",
    "lastTransitionTime": "2026-12-01T09:00:00Z",
}
XID_HEALTHY = {
    **XID79_CONDITION,
    "status": "False",
    "reason": "SysLogsXIDErrorIsHealthy",
    "message": "No Health Failures",
}
MEMORY_CONDITION = {
    "type": "GpuMemWatch",
    "status": "True",
    "reason": "GpuMemWatchIsNotHealthy",
    "message": "[DCGM_FR_FAULTY_MEMORY] GPU memory failure on GPU 3 - RecommendedAction: "
    "RESTART_VM",
    "lastTransitionTime": "2026-12-01T10:00:00Z",
}
UNRELATED = {"key": "example.com/maintenance-window", "value": "sunday", "effect": "NoSchedule"}


def event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


def bookmark(version: str) -> dict[str, Any]:
    return event(
        "BOOKMARK", {"kind": "Node", "apiVersion": "v1", "metadata": {"resourceVersion": version}}
    )


GONE = event(
    "ERROR",
    {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": "too old resource version: 176 (290)",
        "reason": "Expired",
        "code": 410,
    },
)


# --- the API server's HTTP boundary ----------------------------------------------------


@dataclass
class Watch:
    """One watch response: its events, then the stream ends (close) or stays open (hold)."""

    events: list[dict[str, Any]]
    end: str = "close"


@dataclass
class FakeApiServer:
    """Answers the Node list and watch as the API server does, from scripted states."""

    lists: deque[tuple[str, list[dict[str, Any]]]]
    watches: deque[Watch]
    token: str = TOKEN
    tls: ssl.SSLContext | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    released: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        fake = self
        self._listing: tuple[str, list[dict[str, Any]]] | None = None

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                url = urllib.parse.urlparse(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                fake.requests.append(
                    {"path": url.path, "query": query, "auth": self.headers.get("Authorization")}
                )
                if self.headers.get("Authorization") != f"Bearer {fake.token}":
                    self._json(401, {"kind": "Status", "code": 401, "message": "Unauthorized"})
                elif url.path != "/api/v1/nodes":
                    self._json(404, {"kind": "Status", "code": 404, "message": "not found"})
                elif query.get("watch") == "1":
                    self._watch()
                else:
                    self._list(query)

            def _json(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _list(self, query: dict[str, str]) -> None:
                if "continue" not in query or fake._listing is None:
                    fake._listing = fake.lists.popleft() if len(fake.lists) > 1 else fake.lists[0]
                version, items = fake._listing
                start, limit = int(query.get("continue", "0")), int(query["limit"])
                more = start + limit < len(items)
                metadata = {
                    "resourceVersion": version,
                    **({"continue": str(start + limit)} if more else {}),
                }
                self._json(
                    200,
                    {
                        "kind": "NodeList",
                        "apiVersion": "v1",
                        "metadata": metadata,
                        "items": items[start : start + limit],
                    },
                )

            def _watch(self) -> None:
                watch = fake.watches.popleft() if fake.watches else Watch([], "hold")
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for item in watch.events:
                    line = json.dumps(item).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                if watch.end == "hold":
                    fake.released.wait(120)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.server.daemon_threads = True
        if self.tls is not None:
            self.server.socket = self.tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.server.server_port}"

    def watched_from(self) -> list[str]:
        return [r["query"]["resourceVersion"] for r in self.requests if "watch" in r["query"]]

    def stop(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


def story() -> FakeApiServer:
    """The scripted cluster of the module docstring."""
    first = [node("node-a", "90"), node("node-b", "91"), node("node-c", "92", taints=(UNRELATED,))]
    after_gone = [
        node("node-a", "280", cordoned=True),
        node("node-b", "285", conditions=(READY,)),  # GpuMemWatch cleared while unwatched
        node("node-c", "92", taints=(UNRELATED,)),
    ]
    quarantined = node(
        "node-a", "101", cordoned=True, taints=(XID79_TAINT,), conditions=(XID79_CONDITION,)
    )
    return FakeApiServer(
        lists=deque([("100", first), ("300", after_gone)]),
        watches=deque(
            [
                Watch(
                    [
                        event("MODIFIED", quarantined),
                        bookmark("150"),
                        event(
                            "MODIFIED",
                            {
                                **quarantined,
                                "metadata": {**quarantined["metadata"], "resourceVersion": "160"},
                            },
                        ),
                        event("MODIFIED", node("node-a", "170", conditions=(XID_HEALTHY,))),
                        bookmark("176"),
                    ]
                ),  # the server ends the watch (its timeoutSeconds): resume from 176
                Watch(
                    [
                        event(
                            "MODIFIED", node("node-a", "170", conditions=(XID_HEALTHY,))
                        ),  # again
                        event("MODIFIED", node("node-a", "180", cordoned=True)),
                        event("MODIFIED", node("node-b", "190", conditions=(MEMORY_CONDITION,))),
                        GONE,
                    ]
                ),
            ]
        ),
    )


class LostAnswers(LedgerClient):
    """A ledger client whose first answer to each write is lost on the way back, after
    the ledger has stored it: the watcher must retry with the same key."""

    def __init__(self, url: str) -> None:
        super().__init__(url, token="")
        self.keys_seen: set[str] = set()

    def post(
        self, path: str, payload: dict[str, Any], key: str | None = None, retries: int = 3
    ) -> Any:
        answer = super().post(path, payload, key, retries)
        if key not in self.keys_seen:
            self.keys_seen.add(key or "")
            raise LedgerError("the connection was reset before the answer arrived")
        return answer


@pytest.fixture
def ledger(tmp_path: Path, serve_asgi: Callable[..., Any]) -> Any:
    return serve_asgi(create_app(LedgerStore(tmp_path / "fleet.db")))


def start_watcher(server: FakeApiServer, client: LedgerClient) -> tuple[NodeWatcher, Any]:
    api = KubeApi(ApiAccess(server.url, token=TOKEN), timeout=10.0, page=2)
    watcher = NodeWatcher(api, client, watch_timeout_s=60, backoff=(0.05, 0.2))
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
    thread.start()
    return watcher, stop


def exclusions(url: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = LedgerClient(url, token="").get_all("/v1/exclusions")
    return sorted(rows, key=lambda row: (row["node"], row["excluded_at"], row["id"]))


def story_told(url: str) -> bool:
    rows = exclusions(url)
    return len(rows) == 3 and all(
        row["released_at"] is not None for row in rows if row["node"] == "node-b"
    )


@pytest.fixture
def told(ledger: Any) -> Iterator[tuple[FakeApiServer, NodeWatcher, Any]]:
    server = story()
    watcher, stop = start_watcher(server, LostAnswers(ledger.url))
    try:
        wait_until(
            lambda: story_told(ledger.url) and not watcher.pending(),
            60,
            interval=0.1,
            what="the story's three exclusions and node-b's release",
        )
        yield server, watcher, ledger
    finally:
        stop.set()
        server.stop()


def test_the_watch_protocol_turns_node_changes_into_exclusions_once(
    told: tuple[FakeApiServer, NodeWatcher, Any],
) -> None:
    server, watcher, ledger = told
    rows = exclusions(ledger.url)
    summary = [(r["node"], r["reason"], r["source"], r["released_at"] is None) for r in rows]
    assert summary == [
        ("node-a", "xid79", SOURCE, False),  # released at rv 170 (not open)
        ("node-a", "cordoned", SOURCE, True),  # the cordon at rv 180, still open
        ("node-b", "gpu_mem_watch", SOURCE, False),  # released by the relist's diff
    ]
    first, _, _ = rows
    assert first["released_at"] is not None and first["released_at"] >= first["excluded_at"]
    # the exclusion is dated from the condition's lastTransitionTime
    assert first["excluded_at"] == pytest.approx(1796115600.0)  # 2026-12-01T09:00:00Z
    assert first["note"].startswith("kubernetes: condition SysLogsXIDError; taint nvidia.com")
    assert all(row["idempotency_key"].startswith(KEY_PREFIX) for row in rows)
    # nothing about node-c: GKE's nvidia.com/gpu=present and an unrelated taint
    assert {row["node"] for row in rows} == {"node-a", "node-b"}

    # The protocol as the API server sees it: paged lists, watches from the list's and
    # then the last bookmark's version, bookmarks asked for, the token on every request.
    assert server.watched_from()[:3] == ["100", "176", "300"]
    watches = [r["query"] for r in server.requests if "watch" in r["query"]]
    assert all(q["allowWatchBookmarks"] == "true" and q["timeoutSeconds"] == "60" for q in watches)
    lists = [r["query"] for r in server.requests if "watch" not in r["query"]]
    assert lists == [{"limit": "2"}, {"limit": "2", "continue": "2"}] * 2
    assert {r["auth"] for r in server.requests} == {f"Bearer {TOKEN}"}

    registry = CollectorRegistry()
    registry.register(KubeWatchCollector(watcher))

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert sample("gpufleet_kube_watch_resyncs_total", reason="startup") == 1
    assert sample("gpufleet_kube_watch_resyncs_total", reason="gone") == 1
    assert sample("gpufleet_kube_watch_api_errors_total", reason="http_410") == 1
    assert sample("gpufleet_kube_watch_events_total", type="BOOKMARK") == 2
    assert sample("gpufleet_kube_watch_events_total", type="MODIFIED") == 6
    assert sample("gpufleet_kube_watch_changes_total", action="exclude") == 3
    assert sample("gpufleet_kube_watch_changes_total", action="release") == 2
    # every answer was lost once, so each of the five writes was sent twice and stored once
    assert sample("gpufleet_kube_watch_ledger_failures_total", action="exclude") == 3
    assert sample("gpufleet_kube_watch_ledger_failures_total", action="release") == 2
    assert (
        sample("gpufleet_kube_watch_ledger_writes_total", action="exclude", outcome="accepted") == 3
    )
    assert sample("gpufleet_kube_watch_ledger_pending") == 0
    assert sample("gpufleet_kube_watch_nodes") == 3
    assert sample("gpufleet_kube_watch_nodes_out_of_service") == 1


def test_a_restarted_watcher_records_nothing_twice_and_releases_its_own(
    told: tuple[FakeApiServer, NodeWatcher, Any],
) -> None:
    _, _, ledger = told
    before = exclusions(ledger.url)
    # A new watcher (a restarted pod) lists the same cluster: node-a is still cordoned and
    # already excluded, so nothing is written; then node-a is uncordoned and node-c
    # tainted by NVSentinel.
    cluster = [
        node("node-a", "400", cordoned=True),
        node("node-b", "401"),
        node("node-c", "402", taints=(UNRELATED,)),
    ]
    server = FakeApiServer(
        lists=deque([("410", cluster)]),
        watches=deque(
            [
                Watch(
                    [
                        event(
                            "ADDED", node("node-a", "400", cordoned=True)
                        ),  # a replay of the list
                        event("MODIFIED", node("node-a", "420")),
                        event("MODIFIED", node("node-c", "430", taints=(UNRELATED, XID79_TAINT))),
                        event("DELETED", node("node-c", "440", taints=(UNRELATED, XID79_TAINT))),
                    ],
                    "hold",
                )
            ]
        ),
    )
    watcher, stop = start_watcher(server, LedgerClient(ledger.url, token=""))
    try:

        def settled() -> bool:
            rows = exclusions(ledger.url)
            return len(rows) == 4 and all(r["released_at"] is not None for r in rows)

        wait_until(
            lambda: settled() and not watcher.pending(),
            60,
            interval=0.1,
            what="node-a released and node-c excluded and released",
        )
    finally:
        stop.set()
        server.stop()
    after = exclusions(ledger.url)
    assert [r["id"] for r in after[:3]] == [r["id"] for r in before]
    assert after[1]["released_at"] is not None  # node-a's cordon, released by the new one
    assert (after[3]["node"], after[3]["reason"]) == ("node-c", "syslog-xid-error")
    assert after[3]["release_note"] == "kubernetes: the Node object was deleted"


def test_an_exclusion_someone_else_opened_is_theirs_to_release(ledger: Any) -> None:
    client = LedgerClient(ledger.url, token="")
    client.exclude("node-a", "maintenance", key="operator-0001", source="manual")
    server = FakeApiServer(
        lists=deque([("10", [node("node-a", "5"), node("node-b", "6")])]),
        watches=deque(
            [
                Watch(
                    [
                        event("MODIFIED", node("node-b", "20", cordoned=True)),
                        event("MODIFIED", node("node-b", "21")),
                    ],
                    "hold",
                )
            ]
        ),
    )
    watcher, stop = start_watcher(server, client)
    try:
        wait_until(
            lambda: (
                len(exclusions(ledger.url)) == 2
                and not watcher.pending()
                and exclusions(ledger.url)[1]["released_at"]
            ),
            60,
            interval=0.1,
            what="node-b excluded and released",
        )
    finally:
        stop.set()
        server.stop()
    operators = exclusions(ledger.url)[0]
    # node-a is healthy in Kubernetes, but the operator's exclusion stays open
    assert (operators["node"], operators["released_at"]) == ("node-a", None)


# --- what counts, and how it is named ---------------------------------------------------


def test_the_watcher_exports_what_the_schema_defines() -> None:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from gpufleet.schema.kube import KUBE_WATCH_FAMILIES

    api = KubeApi(ApiAccess("https://127.0.0.1:9", token=TOKEN))
    watcher = NodeWatcher(api, LedgerClient("http://127.0.0.1:9", ""))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(KubeWatchCollector(watcher))
    declared = {f.name.removesuffix("_total") if f.kind == "counter" else f.name: f
                for f in KUBE_WATCH_FAMILIES}  # fmt: skip
    seen = set()
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        definition = declared[family.name]
        assert (family.type, family.documentation) == (definition.kind, definition.help)
        for found in family.samples:
            assert set(found.labels) == set(definition.labels), found
        seen.add(family.name)
    assert seen == set(declared)


@pytest.mark.parametrize(
    ("obj", "reasons"),
    [
        (node("n", "1"), []),  # GKE's GPU pool taint alone is no exclusion
        (node("n", "1", cordoned=True), ["cordoned"]),
        (node("n", "1", taints=(XID79_TAINT,)), ["syslog-xid-error"]),
        (
            node(
                "n",
                "1",
                taints=({"key": "nvidia.com/gpu-xid-error", "value": "79", "effect": "NoExecute"},),
            ),
            ["xid79"],
        ),
        (node("n", "1", taints=({**XID79_TAINT, "effect": "PreferNoSchedule"},)), []),
        (node("n", "1", conditions=(XID79_CONDITION,)), ["xid79"]),
        (node("n", "1", conditions=(XID_HEALTHY,)), []),
        (
            node("n", "1", conditions=(MEMORY_CONDITION,), cordoned=True),
            ["gpu_mem_watch", "cordoned"],
        ),
        (
            node(
                "n",
                "1",
                conditions=(
                    {
                        "type": "XidCriticalError",
                        "status": "True",
                        "message": "Xid (PCI:0000:3b:00): 48, DBE",
                    },
                ),
            ),
            ["xid48"],
        ),
        (
            node(
                "n",
                "1",
                conditions=(
                    {
                        "type": "SysLogsSXIDError",
                        "status": "True",
                        "message": "ErrorCode:12028 SXID",
                    },
                ),
            ),
            ["sys_logs_sxid_error"],
        ),
        (node("n", "1", conditions=({"type": "DiskPressure", "status": "True"},)), []),
    ],
)
def test_what_takes_a_node_out_of_service_and_its_reason(
    obj: dict[str, Any], reasons: list[str]
) -> None:
    assert [s.reason for s in NodeRules().signals(obj)] == reasons


def test_the_reason_prefers_an_xid_then_a_condition_then_a_taint_then_the_cordon() -> None:
    both = node(
        "n",
        "1",
        cordoned=True,
        taints=({"key": "nvidia.com/gpu-xid-error", "value": "79", "effect": "NoSchedule"},),
        conditions=(MEMORY_CONDITION,),
    )
    assert episode_reason(NodeRules().signals(both)) == "xid79"
    plain = node("n", "1", cordoned=True, taints=(XID79_TAINT,))
    assert episode_reason(NodeRules().signals(plain)) == "syslog-xid-error"
    assert NodeRules(cordon=False).signals(node("n", "1", cordoned=True)) == ()
    assert NodeRules(ignored_taints=()).signals(node("n", "1"))[0].reason == "gpu"


@pytest.mark.parametrize(
    ("text", "xid"),
    [
        ("Xid 79", "xid79"),
        ("XID: 119 GSP timeout", "xid119"),
        ("xid79", "xid79"),
        ("NVRM: Xid (PCI:0000:cb:00): 13, pid=1", "xid13"),
        ("SXID 12028", None),
        ("fixid 48", None),
        ("no number", None),
    ],
)
def test_an_xid_named_anywhere_is_kept_as_its_number(text: str, xid: str | None) -> None:
    assert xid_reason(text) == xid


def test_names_become_ledger_reasons() -> None:
    assert reason_from_key("GpuMemWatch") == "gpu_mem_watch"
    assert reason_from_key("NVSwitchFatalError") == "nv_switch_fatal_error"
    assert reason_from_key("nvidia.com/gpu-nvlink-error") == "gpu-nvlink-error"
    assert reason_from_key("example.com/" + "x" * 100) == "x" * 64


def test_the_command_line_defaults_are_the_rules_defaults() -> None:
    values = parse(["kube-watch"])
    assert values.taints == DEFAULT_TAINTS
    assert values.ignore_taints == DEFAULT_IGNORED_TAINTS
    assert values.conditions == DEFAULT_CONDITIONS
    assert values.cordon is True
    assert parse(["kube-watch", "--ignore-taints", ""]).ignore_taints == ()


# --- reaching the API server ----------------------------------------------------------


def test_a_kubeconfig_gives_the_server_and_the_credentials(tmp_path: Path) -> None:
    ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    (tmp_path / "token").write_text("from-a-file\n")
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "ops",
        "contexts": [
            {"name": "ops", "context": {"cluster": "c1", "user": "watcher"}},
            {"name": "plugin", "context": {"cluster": "c1", "user": "gcloud"}},
        ],
        "clusters": [
            {
                "name": "c1",
                "cluster": {
                    "server": "https://10.0.0.1:6443/",
                    "certificate-authority-data": base64.b64encode(ca.encode()).decode(),
                },
            }
        ],
        "users": [
            {"name": "watcher", "user": {"tokenFile": "token"}},
            {"name": "gcloud", "user": {"exec": {"command": "gke-gcloud-auth-plugin"}}},
        ],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    access = kubeconfig_access(str(path))
    assert (access.server, access.ca_data, access.bearer()) == (
        "https://10.0.0.1:6443",
        ca,
        "from-a-file",
    )
    with pytest.raises(ValueError, match="through a plugin"):
        kubeconfig_access(str(path), "plugin")
    with pytest.raises(ValueError, match="no context named 'other'"):
        kubeconfig_access(str(path), "other")


def test_in_cluster_access_reads_the_service_account(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("bound-token")
    (tmp_path / "ca.crt").write_text("")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    access = in_cluster_access(env, tmp_path)
    assert (access.server, access.bearer(), access.ca_file) == (
        "https://10.96.0.1:443",
        "bound-token",
        str(tmp_path / "ca.crt"),
    )
    with pytest.raises(ValueError, match="give --kubeconfig"):
        in_cluster_access({}, tmp_path)


def self_signed(directory: Path, name: str) -> Path:
    """A certificate for 127.0.0.1 (its own CA), made by openssl; the key beside it."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")
    cert = directory / f"{name}.crt"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(directory / f"{name}.key"),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert


def test_in_cluster_access_verifies_the_api_server_against_the_pods_ca(tmp_path: Path) -> None:
    cert = self_signed(tmp_path, "apiserver")
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, tmp_path / "apiserver.key")
    server = FakeApiServer(lists=deque([("7", [node("node-a", "7")])]), watches=deque(), tls=tls)
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(TOKEN + "\n")
    env = {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(server.server.server_port),
    }
    try:
        shutil.copy(cert, account / "ca.crt")
        items, version = KubeApi(in_cluster_access(env, account)).list_nodes()
        assert ([i["metadata"]["name"] for i in items], version) == (["node-a"], "7")
        assert server.requests[-1]["auth"] == f"Bearer {TOKEN}"
        # another CA: the connection is refused before a token is sent
        shutil.copy(self_signed(tmp_path, "other"), account / "ca.crt")
        sent = len(server.requests)
        with pytest.raises(KubeApiError, match="CERTIFICATE_VERIFY_FAILED"):
            KubeApi(in_cluster_access(env, account)).list_nodes()
        assert len(server.requests) == sent
    finally:
        server.stop()


def test_kube_watch_refuses_a_missing_kubeconfig_with_a_clear_error(tmp_path: Path) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GPUFLEET_", "KUBE"))}
    result = subprocess.run(
        [sys.executable, "-m", "gpufleet", "kube-watch", "--kubeconfig", str(tmp_path / "no")],
        capture_output=True,
        text=True,
        env=clean,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "gpufleet kube-watch: --kubeconfig" in result.stderr
    assert "Traceback" not in result.stderr


# --- the alert, from a real Prometheus scraping the real ledger ---------------------------


@pytest.mark.integration
def test_repeat_offender_fires_from_exclusions_kubernetes_recorded(
    tmp_path: Path,
    ledger: Any,
    prometheus_factory: Callable[..., PrometheusServer],
    rule_files: Callable[[RulesConfig], list[str]],
) -> None:
    server = story()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "current-context": "test",
                "contexts": [{"name": "test", "context": {"cluster": "fake", "user": "watcher"}}],
                "clusters": [{"name": "fake", "cluster": {"server": server.url}}],
                "users": [{"name": "watcher", "user": {"token": TOKEN}}],
            }
        )
    )
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    watcher = ManagedProcess(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "kube-watch",
            "--kubeconfig",
            str(kubeconfig),
            "--fleet-url",
            ledger.url,
            "--listen",
            f"127.0.0.1:{port}",
            "--log-level",
            "info",
        ],
        tmp_path / "kube-watch.log",
        clean,
    )
    watcher.start()
    try:
        wait_until(lambda: story_told(ledger.url), 60, interval=0.2, what="the story recorded")
        prometheus = prometheus_factory(
            scrape_configs=[
                static_scrape_config("gpufleet-fleet", [f"127.0.0.1:{ledger.port}"]),
                static_scrape_config("gpufleet-kube-watch", [f"127.0.0.1:{port}"]),
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
        assert [a["labels"]["node"] for a in alerts] == ["node-a"]  # node-b was excluded once
        counted = prometheus.query("node:gpufleet_fleet_exclusions:increase7d")
        assert {s["metric"]["node"]: float(s["value"][1]) for s in counted} == {
            "node-a": 2.0,
            "node-b": 1.0,
        }
        resyncs = prometheus.wait_for_series('gpufleet_kube_watch_resyncs_total{reason="gone"}')
        assert float(resyncs[0]["value"][1]) == 1
        assert b"gpufleet_kube_watch_up 1.0" in http_get(f"http://127.0.0.1:{port}/metrics")
    finally:
        watcher.stop()
        server.stop()
