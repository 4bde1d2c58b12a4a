"""MIG: an H100 node with GPUs in MIG mode, read through NVML's MIG calls at the pynvml
boundary (the fake replays h100-sxm-mig.json). Each GPU instance is one reading with
dcgm-exporter's GPU_I_PROFILE / GPU_I_ID labels and what NVML serves per instance; the
parent GPU keeps its hardware state (ECC, temperature, power, NVLink, XIDs); instances
are not GPUs."""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.app import Agent, AgentSettings
from gpufleet.exposition import render
from gpufleet.gpu.attribution import Attribution, PodAllocation, PodRef, gpu_key
from gpufleet.gpu.fake import FakeNvml
from gpufleet.gpu.fixture import bundled_fixture
from gpufleet.gpu.mig import mig_memory_gb
from gpufleet.gpu.nvml_call import CallErrors
from gpufleet.gpu.reader import NvmlReader
from gpufleet.gpu.render import gpu_families
from gpufleet.gpu.snapshot import GpuReading, GpuSnapshot
from gpufleet.gpu.xid import XidLedger, XidWatcher
from gpufleet.lab.devstack import PrometheusServer, static_scrape_config
from gpufleet.lab.processes import find_binary, http_get, wait_until
from gpufleet.schema import gpu as cat

MIB = 1024 * 1024
# What NVML serves on a MIG device handle / per GPU instance (see fixtures/README.md)
PER_INSTANCE = {
    cat.FB_FREE.name,
    cat.FB_USED.name,
    cat.FB_RESERVED.name,
    cat.GR_ENGINE_ACTIVE.name,
    cat.SM_ACTIVE.name,
    cat.SM_OCCUPANCY.name,
    cat.PIPE_TENSOR_ACTIVE.name,
    cat.DRAM_ACTIVE.name,
}
# The parent's hardware state, which stays on the parent's series
HARDWARE = {
    cat.GPU_TEMP.name,
    cat.MEMORY_TEMP.name,
    cat.POWER_USAGE.name,
    cat.TOTAL_ENERGY.name,
    cat.SM_CLOCK.name,
    cat.ECC_SBE_VOL.name,
    cat.ECC_DBE_VOL.name,
    cat.ECC_SBE_AGG.name,
    cat.ECC_DBE_AGG.name,
    cat.PCIE_REPLAY.name,
    cat.NVLINK_CRC_FLIT.name,
    cat.NVLINK_ECC_ERRORS.name,
    cat.POWER_VIOLATION.name,
    cat.CLOCKS_EVENT_REASONS.name,
}


@pytest.fixture
def mig_fixture() -> dict[str, Any]:
    return bundled_fixture("h100-sxm-mig")


@pytest.fixture
def mig_nvml(mig_fixture: dict[str, Any]) -> FakeNvml:
    return FakeNvml(mig_fixture)


def read_once(nvml: FakeNvml) -> tuple[NvmlReader, GpuSnapshot]:
    reader = NvmlReader(nvml, "node-a")
    reader.open()
    return reader, reader.read()


def instances(snapshot: GpuSnapshot, index: int | None = None) -> list[GpuReading]:
    return [
        reading
        for reading in snapshot.gpus
        if reading.identity.is_mig and (index is None or reading.identity.index == index)
    ]


def parent(snapshot: GpuSnapshot, index: int) -> GpuReading:
    return next(r for r in snapshot.gpus if r.identity.index == index and not r.identity.is_mig)


def test_each_gpu_instance_is_one_reading_after_its_parent(mig_nvml: FakeNvml) -> None:
    reader, snapshot = read_once(mig_nvml)
    assert [(r.identity.index, r.identity.mig_instance_id) for r in snapshot.gpus] == [
        (0, None),
        *((0, gi) for gi in range(7, 14)),
        (1, None),
        (1, 2),
        (1, 3),
        (1, 5),
        (2, None),
        (2, 0),
        *((index, None) for index in range(3, 8)),
    ]
    profiles = {(r.identity.index, r.identity.mig_profile) for r in instances(snapshot)}
    assert profiles == {(0, "1g.10gb"), (1, "3g.40gb"), (1, "2g.20gb"), (2, "7g.80gb")}
    # instances are not GPUs: 8 GPUs seen and expected, and only the parents' handles
    # go to the XID watcher
    assert (snapshot.gpus_seen, snapshot.gpus_expected) == (8, 8)
    assert [identity.mig_instance_id for _, identity in reader.handles] == [None] * 8
    assert reader.errors.snapshot() == {}


def test_an_instance_has_its_parent_s_labels_then_dcgm_exporter_s_mig_labels(
    mig_nvml: FakeNvml, mig_fixture: dict[str, Any]
) -> None:
    _, snapshot = read_once(mig_nvml)
    recorded = mig_fixture["devices"][0]
    first = instances(snapshot, 0)[0]
    # dcgm-exporter's template (rendermetrics/render_metrics.go): the MIG labels come
    # after modelName and before the node label
    assert first.identity.label_pairs() == (
        ("gpu", "0"),
        ("UUID", recorded["nvmlDeviceGetUUID"]),
        ("pci_bus_id", recorded["nvmlDeviceGetPciInfo"]["busId"]),
        ("device", "nvidia0"),
        ("modelName", "NVIDIA H100 80GB HBM3"),
        ("GPU_I_PROFILE", "1g.10gb"),
        ("GPU_I_ID", "7"),
        ("Hostname", "node-a"),
    )
    assert first.identity.mig_uuid == recorded["mig_devices"][0]["nvmlDeviceGetUUID"]
    assert (first.identity.mig_uuid or "").startswith("MIG-")
    assert first.identity.mig_compute_instance_id == 0
    # a whole GPU's labels are unchanged
    assert [key for key, _ in parent(snapshot, 0).identity.label_pairs()] == list(cat.GPU_LABELS)


def test_an_instance_holds_what_nvml_serves_per_instance(
    mig_nvml: FakeNvml, mig_fixture: dict[str, Any]
) -> None:
    reader, snapshot = read_once(mig_nvml)  # GPM primed at open(): rates at once
    recorded = mig_fixture["devices"][0]
    for reading, mig in zip(instances(snapshot, 0), recorded["mig_devices"], strict=True):
        assert reading.up
        assert set(reading.values) == PER_INSTANCE, reading.identity
        memory = mig["nvmlDeviceGetMemoryInfo_v2"]
        assert reading.values[cat.FB_USED.name] == memory["used"] / MIB
        assert reading.values[cat.FB_FREE.name] == memory["free"] / MIB
        gpm = recorded["nvmlGpmMigMetricsGet"][str(reading.identity.mig_instance_id)]
        assert reading.values[cat.SM_ACTIVE.name] == pytest.approx(gpm["2"] / 100)
    idle = next(r for r in instances(snapshot, 0) if r.identity.mig_instance_id == 11)
    assert idle.values[cat.FB_USED.name] == 0 and idle.values[cat.SM_ACTIVE.name] == 0
    # and every cycle after: each GPU instance's GPM rate from its own two samples
    following = reader.read()
    assert all(set(r.values) == PER_INSTANCE for r in instances(following))


def test_the_parent_keeps_its_hardware_state_and_loses_what_mig_refuses(
    mig_nvml: FakeNvml,
) -> None:
    _, snapshot = read_once(mig_nvml)
    for index in (0, 1, 2):
        whole = parent(snapshot, index)
        assert set(whole.values) >= HARDWARE, index
        # nvml.h: utilisation is not supported on MIG-enabled GPUs; no whole-GPU GPM
        assert cat.GPU_UTIL.name not in whole.values
        assert cat.SM_ACTIVE.name not in whole.values
        # memory is the instances' (as dcgm-exporter serves it): a sum counts it once
        assert not {cat.FB_USED.name, cat.FB_FREE.name, cat.FB_RESERVED.name} & set(whole.values)
        for reading in instances(snapshot, index):
            assert not HARDWARE & set(reading.values), reading.identity
    assert cat.GPU_UTIL.name in parent(snapshot, 3).values
    assert snapshot.unsupported[cat.GPU_UTIL.name] == 3  # GPUs, not instances


def test_compute_instances_of_one_gpu_instance_are_one_reading(
    mig_nvml: FakeNvml, mig_fixture: dict[str, Any]
) -> None:
    _, snapshot = read_once(mig_nvml)
    split = [r for r in instances(snapshot, 1) if r.identity.mig_instance_id == 2]
    assert len(split) == 1  # dcgm-exporter serves GPU instances
    first_ci = mig_fixture["devices"][1]["mig_devices"][0]
    assert first_ci["nvmlDeviceGetName"].endswith("MIG 2c.3g.40gb")
    assert split[0].identity.mig_profile == "3g.40gb"
    assert split[0].identity.mig_uuid == first_ci["nvmlDeviceGetUUID"]
    assert split[0].identity.mig_compute_instance_id == 0


def test_the_profile_follows_nvidia_s_naming_where_nvml_gives_no_name(
    mig_nvml: FakeNvml, mig_fixture: dict[str, Any]
) -> None:
    # every profile in the fixture agrees with the k8s-device-plugin's naming rule
    total = mig_fixture["devices"][0]["nvmlDeviceGetMemoryInfo"]["total"]
    for device in mig_fixture["devices"][:3]:
        for mig in device["mig_devices"]:
            attributes = mig["nvmlDeviceGetAttributes"]
            name = f"{attributes['gpuInstanceSliceCount']}g."
            name += f"{mig_memory_gb(attributes['memorySizeMB'], total)}gb"
            assert mig["nvmlDeviceGetName"].endswith(name), mig["nvmlDeviceGetName"]
    for mig_index in range(4):
        mig_nvml.set_value(
            1, "nvmlDeviceGetName", {"nvml_error": "NVML_ERROR_UNKNOWN"}, mig=mig_index
        )
    _, snapshot = read_once(mig_nvml)
    assert [r.identity.mig_profile for r in instances(snapshot, 1)] == [
        "3g.40gb",
        "2g.20gb",
        "2g.20gb",
    ]


def test_instances_follow_mig_mode_and_reconfiguration_without_a_restart(
    mig_fixture: dict[str, Any],
) -> None:
    nvml = FakeNvml(bundled_fixture())  # MIG disabled everywhere
    reader = NvmlReader(nvml, "node-a")
    reader.open()
    assert not instances(reader.read())
    nvml.set_mig_mode(4, True)  # enabling MIG mode creates no instance
    enabled = reader.read()
    assert not instances(enabled)
    assert cat.GPU_UTIL.name not in parent(enabled, 4).values
    layout = copy.deepcopy(mig_fixture["devices"][1]["mig_devices"])
    nvml.set_mig_devices(4, layout)
    created = reader.read()
    assert [r.identity.mig_instance_id for r in instances(created, 4)] == [2, 3, 5]
    assert all(cat.FB_USED.name in r.values for r in instances(created, 4))
    nvml.set_mig_devices(4, [layout[0], layout[1], None, None])  # the 2g.20gb are destroyed
    assert [r.identity.mig_instance_id for r in instances(reader.read(), 4)] == [2]
    nvml.set_mig_mode(4, False)
    whole = reader.read()
    assert not instances(whole)
    assert cat.GPU_UTIL.name in parent(whole, 4).values  # asked again on the mode change
    assert reader.errors.snapshot() == {}


def test_a_lost_parent_takes_its_instances_with_it(mig_nvml: FakeNvml) -> None:
    reader, _ = read_once(mig_nvml)
    mig_nvml.lose_gpu(0)
    lost = reader.read()
    assert not parent(lost, 0).up
    assert not instances(lost, 0)
    assert lost.gpus_seen == 7
    mig_nvml.restore_gpu(0)
    assert len(instances(reader.read(), 0)) == 7


def exposition(snapshot: GpuSnapshot, ledger: XidLedger | None = None) -> dict[str, Any]:
    view = ledger.view() if ledger is not None else None
    text = render(gpu_families(snapshot, view)).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_rendered_instances_are_series_of_their_own_and_gpu_counts_stay_gpus(
    mig_nvml: FakeNvml,
) -> None:
    _, snapshot = read_once(mig_nvml)
    ledger = XidLedger()
    ledger.set_watching(True)
    ledger.record(parent(snapshot, 0).identity.uuid, 31, 1.0)
    families = exposition(snapshot, ledger)
    used = families[cat.FB_USED.name].samples
    assert len(used) == 5 + 11  # every whole GPU and every GPU instance
    gpu0 = {s.labels.get("GPU_I_ID"): s.value for s in used if s.labels["gpu"] == "0"}
    assert set(gpu0) == {str(gi) for gi in range(7, 14)}
    sm = families[cat.SM_ACTIVE.name].samples
    assert {s.labels["GPU_I_PROFILE"] for s in sm if "GPU_I_ID" in s.labels} == {
        "1g.10gb",
        "3g.40gb",
        "2g.20gb",
        "7g.80gb",
    }
    # hardware state, up, info and the last XID: once per GPU, never on an instance
    for name in (
        cat.GPU_TEMP.name,
        cat.ECC_DBE_VOL.name,
        cat.GPU_UP.name,
        cat.GPU_INFO.name,
        cat.XID_LAST.name,
    ):
        samples = families[name].samples
        assert not any("GPU_I_ID" in s.labels for s in samples), name
        assert sorted(int(s.labels["gpu"]) for s in samples) == list(range(8)), name
    assert len(families[cat.GPU_UP.name].samples) == 8
    xid_total = [
        sample
        for family in families.values()
        for sample in family.samples
        if sample.name == cat.XID_TOTAL.name
    ]
    assert [(s.labels["gpu"], s.labels["xid"], s.value) for s in xid_total] == [("0", "31", 1)]
    assert families[cat.GPUS_SEEN.name].samples[0].value == 8
    assert families[cat.GPUS_EXPECTED.name].samples[0].value == 8


def test_a_gpu_lost_while_its_instances_are_found_costs_only_its_instances(
    mig_nvml: FakeNvml,
) -> None:
    reader, _ = read_once(mig_nvml)
    lost = {"nvml_error": "NVML_ERROR_GPU_IS_LOST"}
    mig_nvml.set_value(0, "nvmlDeviceGetMaxMigDeviceCount", lost)
    mig_nvml.set_value(1, "nvmlDeviceGetMemoryInfo_v2", lost, mig=3)  # GPU instance 5
    snapshot = reader.read()  # the cycle completes
    assert not instances(snapshot, 0)
    assert [(r.identity.mig_instance_id, r.up) for r in instances(snapshot, 1)] == [
        (2, True),
        (3, True),
        (5, False),
    ]
    assert len(instances(snapshot, 2)) == 1


def test_a_rank_on_a_mig_instance_is_attributed_to_the_instance_not_the_gpu(
    mig_nvml: FakeNvml, mig_fixture: dict[str, Any]
) -> None:
    """A training pod on a MIG slice: the kubelet names its device by the MIG device UUID
    NVML gives (time-sliced: ``MIG-…::2``), a Slurm job by ``<gpu>.<GPU instance id>``.
    The pod, its training job and the Slurm job go on that instance's series only; the
    parent GPU and the other instances carry none of them."""
    _, snapshot = read_once(mig_nvml)
    gi7 = mig_fixture["devices"][0]["mig_devices"][0]["nvmlDeviceGetUUID"]
    gi8 = mig_fixture["devices"][0]["mig_devices"][1]["nvmlDeviceGetUUID"]
    pods = PodAllocation(
        {
            gpu_key(gi7): PodRef("ml", "train-0", "trainer"),
            gpu_key(f"{gi8}::2"): PodRef("ml", "notebook-1", "jupyter"),
        }
    )
    attribution = Attribution(
        pods=pods, jobs={"1.3": ("4714",)}, training_jobs={("ml", "train-0"): "llm-7b"}
    )
    text = render(gpu_families(snapshot, attribution=attribution)).decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}

    def holders(name: str) -> dict[tuple[str, str | None], str]:
        return {
            (s.labels["gpu"], s.labels.get("GPU_I_ID")): s.labels.get("pod", "")
            for s in families[name].samples
        }

    used = holders(cat.FB_USED.name)
    assert used[("0", "7")] == "train-0" and used[("0", "8")] == "notebook-1"
    assert {key for key, pod in used.items() if pod} == {("0", "7"), ("0", "8")}
    # the parent's own series (its hardware state): no pod
    assert not any(holders(cat.GPU_TEMP.name).values())
    allocation = [s.labels for s in families[cat.ALLOCATION_INFO.name].samples]
    train = next(labels for labels in allocation if labels["pod"] == "train-0")
    assert train == {
        "Hostname": "node-a",
        "gpu": "0",
        "UUID": mig_fixture["devices"][0]["nvmlDeviceGetUUID"],
        "GPU_I_PROFILE": "1g.10gb",
        "GPU_I_ID": "7",
        "namespace": "ml",
        "pod": "train-0",
        "container": "trainer",
        "training_job": "llm-7b",
    }
    hpc = {
        (s.labels["gpu"], s.labels.get("GPU_I_ID")): s.labels["hpc_job"]
        for s in families[cat.FB_USED.name].samples
        if "hpc_job" in s.labels
    }
    assert hpc == {("1", "3"): "4714"}
    jobs = [s.labels for s in families[cat.JOB_INFO.name].samples]
    assert [(j["gpu"], j["GPU_I_ID"], j["hpc_job"]) for j in jobs] == [("1", "3", "4714")]


@pytest.mark.integration
def test_the_agent_serves_a_mig_node_from_its_first_scrape(
    mig_nvml: FakeNvml,
    serve_asgi: Callable[..., Any],
    prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    """The whole path (sampler, XID watcher, exposition cache, HTTP) and a real Prometheus:
    instance series with their profiling values from the first scrape after ready; an
    XID NVML attributes to GPU instance 8 scraped with its GPU_I_ID."""
    agent = Agent(AgentSettings(node="mig-node", gpu_interval=60.0), nvml=mig_nvml)
    agent.open()
    try:
        prometheus = check_served_mig_node(agent, serve_asgi, prometheus_factory)
        wait_until(lambda: agent.xids is not None and agent.xids.watching, 10, what="XIDs")
        mig_nvml.inject_xid(0, 43, gpu_instance=8, compute_instance=0)
        (xid,) = prometheus.wait_for_series("gpufleet_gpu_xid_errors_total", 1)
        assert (xid["metric"]["gpu"], xid["metric"]["GPU_I_ID"], xid["metric"]["xid"]) == (
            "0",
            "8",
            "43",
        )
    finally:
        agent.stop()


def check_served_mig_node(
    agent: Agent,
    serve_asgi: Callable[..., Any],
    prometheus_factory: Callable[..., PrometheusServer],
) -> PrometheusServer:
    server = serve_asgi(agent.asgi())
    wait_until(lambda: http_get(f"{server.url}/readyz"), 30, what="agent ready")
    text = http_get(f"{server.url}/metrics").decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    sm = [s for s in families[cat.SM_ACTIVE.name].samples if "GPU_I_ID" in s.labels]
    assert len(sm) == 11
    assert len(families[cat.GPU_UP.name].samples) == 8
    prometheus = prometheus_factory(
        scrape_configs=[static_scrape_config("gpufleet-agent", [f"127.0.0.1:{server.port}"])]
    )
    prometheus.wait_for_targets_up(1)
    series = prometheus.wait_for_series('DCGM_FI_DEV_FB_USED{GPU_I_PROFILE="1g.10gb"}', 7)
    assert {s["metric"]["GPU_I_ID"] for s in series} == {str(gi) for gi in range(7, 14)}
    assert prometheus.wait_for_series('gpufleet_gpus_seen{Hostname="mig-node"}', 1)
    return prometheus


def test_an_instance_whose_identity_failed_is_read_again_next_cycle(
    mig_nvml: FakeNvml,
) -> None:
    failing = {"nvml_error": "NVML_ERROR_UNKNOWN"}
    mig_nvml.set_value(2, "nvmlDeviceGetGpuInstanceId", failing, mig=0)
    reader, first = read_once(mig_nvml)
    assert not instances(first, 2)
    assert reader.errors.snapshot() == {("gpu", "nvmlDeviceGetGpuInstanceId"): 2}  # open, read
    mig_nvml.set_value(2, "nvmlDeviceGetGpuInstanceId", 0, mig=0)
    assert [r.identity.mig_profile for r in instances(reader.read(), 2)] == ["7g.80gb"]


def test_an_xid_nvml_attributes_to_an_instance_names_it_and_its_pod(
    mig_nvml: FakeNvml, mig_fixture: dict[str, Any]
) -> None:
    """NVML's XID event names the GPU instance it is attributable to (nvmlEventData_t's
    gpuInstanceId; 0xFFFFFFFF for none): the counter keeps the parent GPU's labels and
    adds GPU_I_ID, with that instance's pod only; the last XID stays the GPU's."""
    errors = CallErrors()
    reader = NvmlReader(mig_nvml, "node-a", errors=errors)
    reader.open()
    snapshot = reader.read()
    ledger = XidLedger()
    watcher = XidWatcher(mig_nvml, reader.handles, ledger, errors, poll_ms=50)
    watcher.start()
    try:
        wait_until(lambda: ledger.view().watching, 5, what="watcher registered")
        mig_nvml.inject_xid(0, 43, gpu_instance=8, compute_instance=0)
        mig_nvml.inject_xid(0, 79)
        wait_until(lambda: ledger.version >= 3, 5, what="two XIDs recorded")
    finally:
        watcher.stop()
    history = ledger.view().by_uuid[parent(snapshot, 0).identity.uuid]
    assert history.counts == {79: 1} and history.instance_counts == {(8, 43): 1}
    assert history.last_xid == 79  # the GPU's last XID, whichever instance
    gi7 = mig_fixture["devices"][0]["mig_devices"][0]["nvmlDeviceGetUUID"]
    gi8 = mig_fixture["devices"][0]["mig_devices"][1]["nvmlDeviceGetUUID"]
    pods = PodAllocation(
        {
            gpu_key(gi7): PodRef("team-a", "a-0", "main"),
            gpu_key(gi8): PodRef("team-b", "b-0", "main"),
        }
    )
    text = render(
        gpu_families(snapshot, ledger.view(), attribution=Attribution(pods=pods))
    ).decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    total = [
        sample
        for family in families.values()
        for sample in family.samples
        if sample.name == cat.XID_TOTAL.name
    ]
    xids = {(s.labels["xid"], s.labels.get("GPU_I_ID"), s.labels.get("pod")) for s in total}
    assert xids == {("79", None, None), ("43", "8", "b-0")}
    (instance,) = [s for s in total if "GPU_I_ID" in s.labels]
    assert "GPU_I_PROFILE" not in instance.labels  # the GPU's counter, not an instance series
    assert instance.labels["UUID"] == parent(snapshot, 0).identity.uuid


REPO = Path(__file__).resolve().parents[1]


def overview_exprs(title: str, namespace: str) -> list[str]:
    """A panel's queries of the overview as Grafana sends them, the tenant chosen."""
    overview = json.loads((REPO / "dashboards" / "overview.json").read_text())
    panel = next(p for p in overview["panels"] if p.get("title") == title)
    return [
        target["expr"].replace("$cluster", ".*").replace("$namespace", namespace)
        for target in panel["targets"]
    ]


def split_gpu_series() -> list[dict[str, str]]:
    """GPU 0 split into three MIG instances (two of team-a's pods, one of team-b's), GPU 1
    team-a's whole, GPU 2 nobody's; an XID 43 NVML attributed to team-b's instance 3."""
    where = 'job="gpufleet-agent",instance="n1",Hostname="n1"'
    pods = [("0", "1", "team-a", "a-0"), ("0", "2", "team-a", "a-1"), ("0", "3", "team-b", "b-0")]
    series = [
        {
            "series": f'gpufleet_gpu_allocation_info{{{where},gpu="{gpu}",UUID="GPU-{gpu}",'
            f'GPU_I_PROFILE="2g.20gb",GPU_I_ID="{gi}",namespace="{ns}",pod="{pod}",'
            'container="main"}',
            "values": "1x10",
        }
        for gpu, gi, ns, pod in pods
    ]
    series.append(
        {
            "series": f'gpufleet_gpu_allocation_info{{{where},gpu="1",UUID="GPU-1",'
            'namespace="team-a",pod="a-2",container="main"}',
            "values": "1x10",
        }
    )
    series += [
        {"series": f'gpufleet_gpu_up{{{where},gpu="{gpu}",UUID="GPU-{gpu}"}}', "values": "1x10"}
        for gpu in "012"
    ]
    series.append(
        {
            "series": f'gpufleet_gpu_xid_errors_total{{{where},gpu="0",UUID="GPU-0",'
            'namespace="team-b",pod="b-0",container="main",GPU_I_ID="3",xid="43"}',
            "values": "_x2 1x8",
        }
    )
    return series


def promtool_expects(tmp_path: Path, cases: list[tuple[str, dict[str, float]]]) -> None:
    """Each query, at 5m over split_gpu_series() and the real GPU and dashboard rules,
    returns exactly the rows given (labels -> value)."""
    document = {
        "rule_files": [
            str(REPO / "alerts" / "gpu.rules.yaml"),
            str(REPO / "alerts" / "dashboards.rules.yaml"),
        ],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": split_gpu_series(),
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": "5m",
                        "exp_samples": [
                            {"labels": labels, "value": value} for labels, value in rows.items()
                        ],
                    }
                    for expr, rows in cases
                ],
            }
        ],
    }
    path = tmp_path / "tenants.test.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    result = subprocess.run(
        [find_binary("promtool"), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_gpus_by_tenant_counts_a_mig_gpu_once_per_tenant_and_its_instances_apart(
    tmp_path: Path,
) -> None:
    """The overview's "GPUs by tenant" queries under All, through promtool and the real
    rules: team-a holds 2 GPUs and 2 instances, team-b 1 GPU (the split one) and 1
    instance, one GPU is unallocated."""
    exprs = overview_exprs("GPUs by tenant", ".*")
    a, b, unallocated = '{namespace="team-a"}', '{namespace="team-b"}', "{}"
    expected: list[dict[str, float]] = [  # allocated GPUs, failing, excluded, MIG instances
        {a: 2, b: 1, unallocated: 1},
        {a: 0, b: 0, unallocated: 0},
        {a: 0, b: 0, unallocated: 0},
        {a: 2, b: 1, unallocated: 0},
    ]
    assert len(exprs) == len(expected)
    promtool_expects(tmp_path, list(zip(exprs, expected, strict=True)))


def test_an_xid_on_a_tenant_s_mig_instance_shows_for_that_tenant_only(tmp_path: Path) -> None:
    """The overview's XID panel: XID 43 on team-b's instance of the GPU team-a shares is
    team-b's (and All's), not team-a's."""
    ((team_a,), (team_b,), (every,)) = (
        overview_exprs("XID events by code", namespace) for namespace in ("team-a", "team-b", ".*")
    )
    xid = '{xid="43"}'
    promtool_expects(tmp_path, [(team_a, {}), (team_b, {xid: 1}), (every, {xid: 1})])
