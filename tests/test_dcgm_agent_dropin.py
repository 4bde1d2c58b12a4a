"""gpufleet's agent as a drop-in for dcgm-exporter: every field of dcgm-exporter's stock
counters file under the same name and type, every exported DCGM name with DCGM's unit
and meaning (a table from dcgm_fields.h and default-counters.csv, and values read from
the fake NVML), its label set (driver version included), err_code / err_msg on the
last XID, the profiling families from the first snapshot, and the node label named as
the fleet's dcgm-exporter names it."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.app import Agent, AgentSettings
from gpufleet.exposition import render
from gpufleet.gpu.attribution import Attribution, PodAllocation, PodRef
from gpufleet.gpu.fake import FakeNvml
from gpufleet.gpu.fixture import bundled_fixture
from gpufleet.gpu.reader import NvmlReader
from gpufleet.gpu.render import gpu_families
from gpufleet.gpu.xid import XidLedger
from gpufleet.lab.dcgm_shape import (
    INSTANCE_FIELDS,
    XID_COUNT,
    DcgmGpu,
    DcgmInstance,
    DcgmNode,
    Pod,
    parse_counters,
)
from gpufleet.lab.dcgm_shape import render as render_dcgm
from gpufleet.lab.devstack import PrometheusServer, static_scrape_config
from gpufleet.lab.processes import http_get, wait_until
from gpufleet.schema import gpu as cat

# Where gpufleet declares another type than dcgm-exporter's stock counters file, and why.
TYPE_DEVIATIONS = {
    # default-counters.csv says counter, but DCGM's field 449 is a rate (DcgmCacheManager.cpp,
    # ReadAndCacheNvLinkBandwidth: counter deltas per second / 1000): a gauge, as
    # deploy/dcgm-exporter/gpufleet-counters.csv also declares it for dcgm-exporter.
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "gauge",
}


@dataclass(frozen=True, slots=True)
class DcgmField:
    """What DCGM says of a field: its id, its unit (as the help must state it, "(in UNIT"),
    its type, and where that is written."""

    field_id: int
    kind: str
    unit: str | None
    source: str


H = "dcgmlib/dcgm_fields.h"
CSV = "dcgm-exporter etc/default-counters.csv"
CM = "dcgmlib/src/DcgmCacheManager.cpp"
# Every DCGM name the agent exports, from NVIDIA's sources (DCGM 4.x, dcgm-exporter 4.x).
DCGM_FIELDS: dict[str, DcgmField] = {
    "DCGM_FI_DEV_SM_CLOCK": DcgmField(100, "gauge", "MHz", f"{H}; {CSV}: (in MHz)"),
    "DCGM_FI_DEV_MEM_CLOCK": DcgmField(101, "gauge", "MHz", f"{H}; {CSV}: (in MHz)"),
    "DCGM_FI_DEV_MEMORY_TEMP": DcgmField(140, "gauge", "C", f"{H}; {CSV}: (in C)"),
    "DCGM_FI_DEV_GPU_TEMP": DcgmField(150, "gauge", "C", f"{H}: degrees C"),
    "DCGM_FI_DEV_POWER_USAGE": DcgmField(155, "gauge", "W", f"{H}: in Watts"),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": DcgmField(
        156, "counter", "mJ", f"{H}: in mJ since the driver was last reloaded"
    ),
    "DCGM_FI_DEV_GPU_UTIL": DcgmField(203, "gauge", "%", f"{CSV}: (in %)"),
    "DCGM_FI_DEV_MEM_COPY_UTIL": DcgmField(204, "gauge", "%", f"{CSV}: (in %)"),
    "DCGM_FI_DEV_ENC_UTIL": DcgmField(206, "gauge", "%", f"{CSV}: (in %)"),
    "DCGM_FI_DEV_DEC_UTIL": DcgmField(207, "gauge", "%", f"{CSV}: (in %)"),
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": DcgmField(526, "gauge", None, f"{H}: 0 / 1"),
    # dcgm_fields.h says MB; DCGM divides NVML's bytes by 1024 * 1024, as dcgm-exporter says
    "DCGM_FI_DEV_FB_FREE": DcgmField(251, "gauge", "MiB", f"{CSV}: (in MiB)"),
    "DCGM_FI_DEV_FB_USED": DcgmField(252, "gauge", "MiB", f"{CSV}: (in MiB)"),
    "DCGM_FI_DEV_FB_RESERVED": DcgmField(253, "gauge", "MiB", f"{CSV}: (in MiB)"),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": DcgmField(202, "counter", None, f"{H}, {CSV}"),
    "DCGM_FI_PROF_PCIE_TX_BYTES": DcgmField(
        1009, "gauge", "bytes per second", f"{CSV}; {CM}: GPM PCIE_TX_PER_SEC MiB/s * 2^20"
    ),
    "DCGM_FI_PROF_PCIE_RX_BYTES": DcgmField(
        1010, "gauge", "bytes per second", f"{CSV}; {CM}: GPM PCIE_RX_PER_SEC MiB/s * 2^20"
    ),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": DcgmField(310, "counter", None, f"{H}, {CSV}"),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": DcgmField(311, "counter", None, f"{H}, {CSV}"),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": DcgmField(312, "counter", None, f"{H}, {CSV}"),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": DcgmField(313, "counter", None, f"{H}, {CSV}"),
    "DCGM_FI_DEV_RETIRED_SBE": DcgmField(390, "counter", None, f"{H}, {CSV}"),
    "DCGM_FI_DEV_RETIRED_DBE": DcgmField(391, "counter", None, f"{H}, {CSV}"),
    "DCGM_FI_DEV_RETIRED_PENDING": DcgmField(392, "gauge", None, f"{H}, {CSV}"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": DcgmField(393, "counter", None, f"{H}, {CSV}"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": DcgmField(394, "counter", None, f"{H}, {CSV}"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": DcgmField(395, "gauge", None, f"{H}, {CSV}"),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": DcgmField(396, "gauge", None, f"{H}"),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": DcgmField(409, "counter", None, CSV),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": DcgmField(419, "counter", None, CSV),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": DcgmField(429, "counter", None, CSV),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": DcgmField(439, "counter", None, CSV),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": DcgmField(
        449, "gauge", "MB/s", f"{CM}: THROUGHPUT_DATA TX + RX KiB deltas per second / 1000"
    ),
    "DCGM_FI_DEV_NVLINK_RECOVERY_SUCCESSFUL_TOTAL": DcgmField(1211, "counter", None, H),
    "DCGM_FI_DEV_NVLINK_RECOVERY_FAILED_TOTAL": DcgmField(1212, "counter", None, H),
    "DCGM_FI_DEV_NVLINK_RECOVERY_EVENT_TOTAL": DcgmField(1213, "counter", None, H),
    "DCGM_FI_DEV_NVLINK_RX_SYMBOL_ERROR_TOTAL": DcgmField(1214, "counter", None, H),
    "DCGM_FI_DEV_NVLINK_EFFECTIVE_ERROR_TOTAL": DcgmField(1219, "counter", None, H),
    "DCGM_FI_DEV_NVLINK_ECC_ERROR_TOTAL": DcgmField(1220, "counter", None, H),
    # the same field 112 under dcgm-exporter 3.x's and 4.x's names
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": DcgmField(112, "gauge", None, f"{H}: bitmask"),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": DcgmField(112, "gauge", None, f"{H}: bitmask"),
    "DCGM_FI_DEV_POWER_VIOLATION": DcgmField(
        240, "counter", "ns", f"{H}: Power Violation time in ns; {CSV}: (in ns)"
    ),
    "DCGM_FI_DEV_THERMAL_VIOLATION": DcgmField(
        241, "counter", "ns", f"{H}: Thermal Violation time in ns; {CSV}: (in ns)"
    ),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": DcgmField(1001, "gauge", None, f"{H}: ratio"),
    "DCGM_FI_PROF_SM_ACTIVE": DcgmField(1002, "gauge", None, f"{H}: ratio"),
    "DCGM_FI_PROF_SM_OCCUPANCY": DcgmField(1003, "gauge", None, f"{H}: ratio"),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": DcgmField(1004, "gauge", None, f"{H}: ratio"),
    "DCGM_FI_PROF_DRAM_ACTIVE": DcgmField(1005, "gauge", None, f"{H}: ratio"),
    "DCGM_FI_DEV_XID_ERRORS": DcgmField(230, "gauge", None, f"{H}: the specific XID; {CSV}"),
}
ALL_LINKS = "4294967295"
MIB = 1024 * 1024


def stock_counters() -> str:
    path = resources.files("gpufleet.gpu").joinpath("fixtures/dcgm-exporter-default-counters.csv")
    return path.read_text("utf-8")


def families(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def first_snapshot_text(nvml: FakeNvml, **kwargs: Any) -> str:
    reader = NvmlReader(nvml, "node-a")
    reader.open()
    ledger = XidLedger()
    ledger.set_watching(True)
    return render(gpu_families(reader.read(), ledger.view(), **kwargs)).decode()


def test_every_stock_dcgm_exporter_field_has_its_name_type_and_labels(
    fake_nvml: FakeNvml,
) -> None:
    ours = families(first_snapshot_text(fake_nvml))
    theirs = families(render_dcgm(DcgmNode.with_gpus("node-a"), parse_counters(stock_counters())))
    for name, family in theirs.items():
        assert name in ours, f"{name} is in dcgm-exporter's stock counters, not in the agent's"
        assert ours[name].type == TYPE_DEVIATIONS.get(name, family.type), name
        expected = set(family.samples[0].labels)
        for sample in ours[name].samples:
            assert set(sample.labels) == expected, name


def exported_dcgm_names() -> set[str]:
    return {m.name for m in (*cat.GPU_FAMILIES,) if m.name.startswith("DCGM_")}


def test_every_exported_dcgm_name_has_dcgm_s_field_unit_and_type() -> None:
    assert exported_dcgm_names() == set(DCGM_FIELDS)
    by_name = {metric.name: metric for metric in cat.GPU_FAMILIES}
    for name, field in DCGM_FIELDS.items():
        metric = by_name[name]
        assert metric.kind == field.kind, (
            f"{name}: {metric.kind}, DCGM ({field.source}): {field.kind}"
        )
        if field.unit is not None:
            assert f"(in {field.unit}" in metric.help, f"{name}: {field.unit} ({field.source})"
        for other in ("(in us", "(in KiB", "(in ns", "(in MB/s", "(in bytes per second"):
            if field.unit is None or not other.startswith(f"(in {field.unit}"):
                assert other not in metric.help, f"{name} claims {other}; DCGM: {field.unit}"


def test_the_table_agrees_with_dcgm_exporter_s_stock_counters() -> None:
    for counter in parse_counters(stock_counters()):
        if counter.kind == "label":
            continue
        field = DCGM_FIELDS[counter.name]
        assert TYPE_DEVIATIONS.get(counter.name, counter.kind) == field.kind, counter.name
        stated = re.search(r"\(in ([^)]*)\)", counter.help)
        if stated:
            assert field.unit == stated.group(1), counter.name
        elif "bytes per second" in counter.help:
            assert field.unit == "bytes per second", counter.name


def test_values_carry_dcgm_s_units(fake_nvml: FakeNvml, fixture_data: dict[str, Any]) -> None:
    def data(tx_kib: int, rx_kib: int, at_us: int) -> None:
        for key, kib in ((f"138@{ALL_LINKS}", tx_kib), (f"139@{ALL_LINKS}", rx_kib)):
            entry = {"type": 3, "value": kib, "timestamp": at_us}
            fake_nvml.set_value(0, "nvmlDeviceGetFieldValues", entry, key)

    data(5_000_000, 5_000_000, 1_764_460_000_000_000)
    reader = NvmlReader(fake_nvml, "node-a")
    reader.open()  # takes the first sample of the data counters
    # 0.5 s later, 48,828 KiB more TX and 48,828 KiB more RX of data: 97,656 KiB / 0.5 s
    data(5_048_828, 5_048_828, 1_764_460_000_500_000)
    ours = families(render(gpu_families(reader.read())).decode())

    def gpu0(name: str) -> float:
        return float(next(s.value for s in ours[name].samples if s.labels["gpu"] == "0"))

    assert gpu0("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL") == 195  # int(195,312 KiB/s / 1000)
    recorded = fixture_data["devices"][0]
    # violation time in ns, unconverted (DCGM 4.1 and later)
    assert gpu0("DCGM_FI_DEV_POWER_VIOLATION") == 90_440_948_982
    assert (
        gpu0("DCGM_FI_DEV_POWER_VIOLATION")
        == (recorded["nvmlDeviceGetViolationStatus"]["0"]["violationTime"])
    )
    # PCIe: GPM's average over the sample interval, MiB/s -> bytes/s
    assert gpu0("DCGM_FI_PROF_PCIE_TX_BYTES") == int(recorded["nvmlGpmMetricsGet"]["20"] * MIB)
    assert gpu0("DCGM_FI_PROF_PCIE_RX_BYTES") == int(recorded["nvmlGpmMetricsGet"]["21"] * MIB)
    # field 112 under both names; vGPU license 0 on bare metal, as DCGM
    assert gpu0("DCGM_FI_DEV_CLOCKS_EVENT_REASONS") == gpu0("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
    assert gpu0("DCGM_FI_DEV_VGPU_LICENSE_STATUS") == 0
    assert gpu0("DCGM_FI_DEV_FB_USED") == recorded["nvmlDeviceGetMemoryInfo_v2"]["used"] / MIB


def test_pcie_falls_back_to_nvml_s_sample_where_gpm_is_unsupported(
    fake_nvml: FakeNvml, fixture_data: dict[str, Any]
) -> None:
    fake_nvml.set_value(4, "nvmlGpmQueryDeviceSupport", {"isSupportedDevice": 0})
    ours = families(first_snapshot_text(fake_nvml))
    tx = {s.labels["gpu"]: s.value for s in ours["DCGM_FI_PROF_PCIE_TX_BYTES"].samples}
    kib_per_second = fixture_data["devices"][4]["nvmlDeviceGetPcieThroughput"]["0"]
    assert tx["4"] == kib_per_second * 1024
    assert tx["0"] == int(fixture_data["devices"][0]["nvmlGpmMetricsGet"]["20"] * MIB)


def test_the_profiling_families_are_in_the_first_snapshot(fake_nvml: FakeNvml) -> None:
    ours = families(first_snapshot_text(fake_nvml))
    for name in ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE"):
        assert len(ours[name].samples) == 8, name
    grs = {s.labels["gpu"]: s.value for s in ours["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].samples}
    assert grs["0"] == pytest.approx(0.9777)


def test_encoder_decoder_and_vgpu_license_where_nvml_has_them(fake_nvml: FakeNvml) -> None:
    vgpu = 1  # NVML_GRID_LICENSE_FEATURE_CODE_VGPU; 2 is NVIDIA RTX
    fake_nvml.set_value(
        2,
        "nvmlDeviceGetGridLicensableFeatures",
        {"isGridLicenseSupported": 1, "featureStates": [0, 1], "featureCodes": [2, vgpu]},
    )
    fake_nvml.set_value(
        5,
        "nvmlDeviceGetGridLicensableFeatures",
        {"isGridLicenseSupported": 1, "featureStates": [1, 0], "featureCodes": [2, vgpu]},
    )
    fake_nvml.set_value(
        6, "nvmlDeviceGetGridLicensableFeatures", {"nvml_error": "NVML_ERROR_NOT_SUPPORTED"}
    )
    fake_nvml.set_value(3, "nvmlDeviceGetDecoderUtilization", [37, 167000])
    ours = families(first_snapshot_text(fake_nvml))
    license_status = {s.labels["gpu"]: s.value for s in ours[cat.VGPU_LICENSE_STATUS.name].samples}
    # as DCGM: the vGPU feature's state in a guest, 0 on bare metal, nothing where refused
    assert license_status == {"0": 0, "1": 0, "2": 1, "3": 0, "4": 0, "5": 0, "7": 0}
    decoder = {s.labels["gpu"]: s.value for s in ours[cat.DEC_UTIL.name].samples}
    assert decoder["3"] == 37 and decoder["0"] == 0
    assert len(ours[cat.ENC_UTIL.name].samples) == 8


def test_the_last_xid_carries_err_code_and_err_msg(fake_nvml: FakeNvml) -> None:
    reader = NvmlReader(fake_nvml, "node-a")
    reader.open()
    snapshot = reader.read()
    ledger = XidLedger()
    ledger.set_watching(True)
    ledger.record(snapshot.gpus[4].identity.uuid, 79, 1.0)
    ledger.record(snapshot.gpus[5].identity.uuid, 999, 1.0)
    text = render(gpu_families(snapshot, ledger.view())).decode()
    last = {s.labels["gpu"]: s.labels for s in families(text)["DCGM_FI_DEV_XID_ERRORS"].samples}
    assert (last["4"]["err_code"], last["4"]["err_msg"]) == ("79", "GPU has fallen off the bus")
    assert (last["5"]["err_code"], last["5"]["err_msg"]) == ("999", "Unknown Error")
    assert (last["0"]["err_code"], last["0"]["err_msg"]) == ("0", "No Error")


def test_every_gpu_series_carries_the_driver_version_and_the_chosen_node_label(
    fake_nvml: FakeNvml,
) -> None:
    text = first_snapshot_text(fake_nvml, node_label="hostname")
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            assert sample.labels.get("DCGM_FI_DRIVER_VERSION") == "570.86.15", sample.name
            assert sample.labels.get("hostname") == "node-a", sample.name
            assert "Hostname" not in sample.labels, sample.name


@pytest.mark.integration
def test_the_agent_is_ready_with_profiling_series_and_the_configured_node_label(
    fake_nvml: FakeNvml,
    serve_asgi: Callable[..., Any],
    prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    settings = AgentSettings(node="gpu-node-07", gpu_interval=60.0, node_label="hostname")
    agent = Agent(settings, nvml=fake_nvml)
    agent.open()
    server = serve_asgi(agent.asgi())
    wait_until(lambda: http_get(f"{server.url}/readyz"), 30, what="agent ready")
    # the first scrape after ready, long before a second NVML cycle (60 s)
    first = families(http_get(f"{server.url}/metrics").decode())
    assert len(first["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].samples) == 8
    prometheus = prometheus_factory(
        scrape_configs=[static_scrape_config("gpufleet-agent", [f"127.0.0.1:{server.port}"])]
    )
    prometheus.wait_for_targets_up(1)
    series = prometheus.wait_for_series('DCGM_FI_PROF_GR_ENGINE_ACTIVE{hostname="gpu-node-07"}', 8)
    assert series[0]["metric"]["DCGM_FI_DRIVER_VERSION"] == "570.86.15"


# -- MIG --------------------------------------------------------------------------------

SERIES_LINE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)\{(?P<labels>.*)\} \S+$")


def label_layouts(text: str) -> dict[str, list[tuple[tuple[str, str], ...]]]:
    """Each series' labels in the order the text writes them, by family."""
    layouts: dict[str, list[tuple[tuple[str, str], ...]]] = {}
    for line in text.splitlines():
        match = SERIES_LINE.match(line)
        if match is None:
            continue
        pairs = re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"', match["labels"])
        layouts.setdefault(match["name"], []).append(tuple(pairs))
    return layouts


def mig_node_as_dcgm_exporter_sees_it(fixture: dict[str, Any]) -> DcgmNode:
    """The MIG fixture's node as dcgm-exporter's DCGM sees it: each GPU, or each GPU
    instance (profile, GPU instance id) of a GPU in MIG mode."""
    gpus = []
    for index, device in enumerate(fixture["devices"]):
        gpu = DcgmGpu(index, device["nvmlDeviceGetUUID"], device["nvmlDeviceGetPciInfo"]["busId"])
        for mig in device.get("mig_devices") or []:
            gpu_instance = mig["nvmlDeviceGetGpuInstanceId"]
            if any(i.gpu_instance_id == gpu_instance for i in gpu.instances):
                continue  # DCGM's entities are GPU instances, not compute instances
            profile = re.sub(r"^\d+c\.", "", mig["nvmlDeviceGetName"].rsplit("MIG ", 1)[1])
            gpu.instances.append(DcgmInstance(profile, gpu_instance))
        gpus.append(gpu)
    return DcgmNode("node-a", gpus)


def test_a_mig_node_s_instance_series_are_in_dcgm_exporter_s_label_layout() -> None:
    """Each GPU instance's series carry exactly dcgm-exporter's labels in its order
    (gpu, UUID, pci_bus_id, device, modelName, GPU_I_PROFILE, GPU_I_ID, the node, the
    driver), for the fields served per instance (memory, profiling)."""
    fixture = bundled_fixture("h100-sxm-mig")
    ours = label_layouts(first_snapshot_text(FakeNvml(fixture)))
    theirs = label_layouts(
        render_dcgm(mig_node_as_dcgm_exporter_sees_it(fixture), parse_counters(stock_counters()))
    )
    per_instance = sorted(INSTANCE_FIELDS & set(theirs))
    assert "DCGM_FI_DEV_FB_USED" in per_instance and "DCGM_FI_PROF_SM_ACTIVE" not in theirs
    per_instance.append("DCGM_FI_PROF_SM_ACTIVE")  # not in the stock file; its layout is
    for name in per_instance:
        instance_series = [labels for labels in ours[name] if ("GPU_I_ID", "7") in labels]
        assert len(instance_series) == 1, name
        assert [key for key, _ in instance_series[0]] == [
            "gpu",
            "UUID",
            "pci_bus_id",
            "device",
            "modelName",
            "GPU_I_PROFILE",
            "GPU_I_ID",
            "Hostname",
            "DCGM_FI_DRIVER_VERSION",
        ], name
    for name in sorted(INSTANCE_FIELDS & set(theirs)):
        mine, dcgm = (
            {labels for labels in text[name] if any(k == "GPU_I_ID" for k, _ in labels)}
            for text in (ours, theirs)
        )
        # the same instances, label names in the same order, same values
        assert len(mine) == 11 and mine == dcgm, name


def test_on_a_mig_gpu_the_hardware_state_stays_on_the_gpu_not_each_instance() -> None:
    """Deliberately unlike dcgm-exporter, which repeats a MIG GPU's temperature, power,
    clocks, ECC and XID on every instance's series (and has no series of the GPU): the
    agent keeps them on the GPU's own series, so one GPU's double-bit error is one
    alert and a node's power sums once. A rule written for both counts GPUs by UUID."""
    fixture = bundled_fixture("h100-sxm-mig")
    ours = label_layouts(first_snapshot_text(FakeNvml(fixture)))
    theirs = label_layouts(
        render_dcgm(mig_node_as_dcgm_exporter_sees_it(fixture), parse_counters(stock_counters()))
    )
    for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS"):
        gpu0_ours = [labels for labels in ours[name] if ("gpu", "0") in labels]
        gpu0_theirs = [labels for labels in theirs[name] if ("gpu", "0") in labels]
        assert len(gpu0_ours) == 1 and not any(k == "GPU_I_ID" for k, _ in gpu0_ours[0]), name
        assert len(gpu0_theirs) == 7, name  # one per 1g.10gb instance
    # both: no GPU utilisation for a GPU in MIG mode
    for text_layouts in (ours, theirs):
        assert not [s for s in text_layouts["DCGM_FI_DEV_GPU_UTIL"] if ("gpu", "0") in s]


# -- pod and Slurm job attribution ------------------------------------------------------


def test_a_pod_attributed_node_renders_in_dcgm_exporter_s_label_layout() -> None:
    """With pods on some GPUs and Slurm jobs on others (two jobs sharing one), every
    stock field's series are exactly dcgm-exporter's: the same series, label names in
    its order (container, hpc_job, namespace, pod sorted in after the driver version,
    err_code / err_msg among them on the last XID), the same values; a GPU nobody holds
    keeps its plain labels."""
    fixture = bundled_fixture()
    dcgm = mig_node_as_dcgm_exporter_sees_it(fixture)
    trainer = Pod("trainer-0", "team-a", "pytorch")
    notebook = Pod("notebook", "team-b", "jupyter")
    for index in (0, 1):
        dcgm.gpu(index).pod = trainer
    dcgm.gpu(2).pod = notebook
    dcgm.gpu(4).hpc_jobs = ("4711",)
    dcgm.gpu(5).hpc_jobs = ("4712", "4713")
    uuid = {gpu.index: gpu.uuid for gpu in dcgm.gpus}
    attribution = Attribution(
        pods=PodAllocation(
            {
                uuid[0]: PodRef("team-a", "trainer-0", "pytorch"),
                uuid[1]: PodRef("team-a", "trainer-0", "pytorch"),
                uuid[2]: PodRef("team-b", "notebook", "jupyter"),
            }
        ),
        jobs={"4": ("4711",), "5": ("4712", "4713")},
    )
    ours = label_layouts(first_snapshot_text(FakeNvml(fixture), attribution=attribution))
    theirs = label_layouts(render_dcgm(dcgm, parse_counters(stock_counters())))
    compared = sorted(set(theirs) - {XID_COUNT})  # a window count the agent does not have
    assert "DCGM_FI_DEV_XID_ERRORS" in compared and "DCGM_FI_DEV_GPU_TEMP" in compared
    for name in compared:
        assert sorted(ours[name]) == sorted(theirs[name]), name
    temp = {
        dict(labels)["gpu"]: [key for key, _ in labels] for labels in ours["DCGM_FI_DEV_GPU_TEMP"]
    }
    identity = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"]
    driver = "DCGM_FI_DRIVER_VERSION"
    assert temp["0"] == [*identity, driver, "container", "namespace", "pod"]
    assert temp["4"] == [*identity, driver, "hpc_job"]
    assert temp["7"] == [*identity, driver]
    assert len([s for s in ours["DCGM_FI_DEV_GPU_TEMP"] if ("gpu", "5") in s]) == 2
