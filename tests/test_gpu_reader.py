"""The NVML reader against the recorded 8x H100 fixture, through the pynvml call boundary."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.gpu import catalogue as cat
from gpufleet.gpu.fake import FakeNvml
from gpufleet.gpu.reader import NvmlReader, NvmlUnavailable
from gpufleet.gpu.snapshot import GpuSnapshot

UNSUPPORTED_ON_H100 = {
    cat.RETIRED_SBE.name,
    cat.RETIRED_DBE.name,
    cat.RETIRED_PENDING.name,
    cat.VGPU_LICENSE_STATUS.name,  # bare metal: no vGPU licensing
}


def open_reader(nvml: FakeNvml, **kwargs: Any) -> NvmlReader:
    reader = NvmlReader(nvml, "node-a", **kwargs)
    reader.open()
    return reader


def two_cycles(reader: NvmlReader) -> GpuSnapshot:
    reader.read()  # GPM values are rates between two samples
    return reader.read()


def test_every_supported_field_is_read_for_every_gpu(fake_nvml: FakeNvml) -> None:
    snapshot = two_cycles(open_reader(fake_nvml))
    assert len(snapshot.gpus) == 8
    expected = {metric.name for metric in cat.VALUE_METRICS} - UNSUPPORTED_ON_H100
    for reading in snapshot.gpus:
        assert reading.up
        assert set(reading.values) == expected, reading.identity.index


def test_identity_becomes_dcgm_labels(fake_nvml: FakeNvml, fixture_data: dict[str, Any]) -> None:
    snapshot = open_reader(fake_nvml).read()
    recorded = fixture_data["devices"][2]
    identity = snapshot.gpus[2].identity
    assert dict(identity.label_pairs()) == {
        "gpu": "2",
        "UUID": recorded["nvmlDeviceGetUUID"],
        "pci_bus_id": "00000000:3A:00.0",
        "device": "nvidia2",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "node-a",
    }
    assert snapshot.driver_version == "570.86.15"
    assert snapshot.cuda_driver_version == "12.8"


def test_units_are_converted_as_dcgm_reports_them(
    fake_nvml: FakeNvml, fixture_data: dict[str, Any]
) -> None:
    values = two_cycles(open_reader(fake_nvml)).gpus[0].values
    recorded = fixture_data["devices"][0]
    mib = 1024 * 1024
    assert values[cat.POWER_USAGE.name] == recorded["nvmlDeviceGetPowerUsage"] / 1000
    memory = recorded["nvmlDeviceGetMemoryInfo_v2"]
    assert values[cat.FB_USED.name] == memory["used"] / mib
    assert values[cat.FB_FREE.name] == memory["free"] / mib
    assert values[cat.FB_RESERVED.name] == 566
    assert values[cat.PCIE_TX.name] == recorded["nvmlDeviceGetPcieThroughput"]["0"] * 1024
    violation_ns = recorded["nvmlDeviceGetViolationStatus"]["0"]["violationTime"]
    assert values[cat.POWER_VIOLATION.name] == violation_ns / 1000
    assert values[cat.SM_ACTIVE.name] == pytest.approx(recorded["nvmlGpmMetricsGet"]["2"] / 100)
    fields = recorded["nvmlDeviceGetFieldValues"]
    links = sum(fields[f"{fid}@{link}"]["value"] for fid in (140, 141) for link in range(18))
    assert values[cat.NVLINK_BANDWIDTH.name] == links
    assert values[cat.MEMORY_TEMP.name] == fields["82"]["value"]
    assert values[cat.SM_CLOCK.name] == 1980


def test_gpm_values_are_in_the_first_snapshot_from_a_sample_taken_at_open(
    fake_nvml: FakeNvml,
) -> None:
    reader = open_reader(fake_nvml)
    assert fake_nvml.calls["nvmlGpmSampleGet"] == 8  # primed at open, one per GPU
    first = reader.read()
    assert first.gpus[0].values[cat.SM_ACTIVE.name] == 0.8937
    assert first.gpus[0].values[cat.GR_ENGINE_ACTIVE.name] == 0.9777
    assert fake_nvml.calls["nvmlGpmSampleFree"] == 8  # the priming samples, once used
    assert cat.SM_ACTIVE.name in reader.read().gpus[0].values


def test_unsupported_fields_are_omitted_and_not_asked_again(fake_nvml: FakeNvml) -> None:
    reader = open_reader(fake_nvml)
    snapshot = reader.read()
    assert snapshot.unsupported == dict.fromkeys(UNSUPPORTED_ON_H100, 8)
    for reading in snapshot.gpus:
        assert not UNSUPPORTED_ON_H100 & set(reading.values)
    asked = fake_nvml.calls["nvmlDeviceGetRetiredPages"]
    reader.read()
    reader.read()
    assert fake_nvml.calls["nvmlDeviceGetRetiredPages"] == asked
    assert reader.errors.snapshot() == {}  # unsupported is not an error


def test_one_unsupported_field_value_is_omitted_on_that_gpu_only(fake_nvml: FakeNvml) -> None:
    fake_nvml.set_value(
        2, "nvmlDeviceGetFieldValues", {"nvml_error": "NVML_ERROR_NOT_SUPPORTED"}, "38"
    )
    snapshot = open_reader(fake_nvml).read()
    assert cat.NVLINK_CRC_FLIT.name not in snapshot.gpus[2].values
    assert cat.NVLINK_CRC_FLIT.name in snapshot.gpus[3].values
    assert cat.NVLINK_CRC_DATA.name in snapshot.gpus[2].values
    assert snapshot.unsupported[cat.NVLINK_CRC_FLIT.name] == 1


def test_gpu_lost_mid_run_goes_down_while_others_keep_reporting(fake_nvml: FakeNvml) -> None:
    reader = open_reader(fake_nvml)
    assert reader.read().gpus_seen == 8
    fake_nvml.lose_gpu(3)
    snapshot = reader.read()
    assert snapshot.gpus_seen == 7
    assert snapshot.gpus_expected == 8
    lost = snapshot.gpus[3]
    assert not lost.up and lost.values == {}
    assert lost.identity.uuid  # still identified, so its series can say "down"
    assert all(reading.up and reading.values for i, reading in enumerate(snapshot.gpus) if i != 3)
    assert reader.errors.snapshot() == {}  # a lost GPU is a state, not a collector error
    fake_nvml.restore_gpu(3)
    assert reader.read().gpus[3].up


def test_a_failing_call_is_counted_and_only_its_field_is_missing(fake_nvml: FakeNvml) -> None:
    reader = open_reader(fake_nvml)
    reader.read()
    original = fake_nvml._devices[1]["nvmlDeviceGetPowerUsage"]
    fake_nvml.set_value(1, "nvmlDeviceGetPowerUsage", {"nvml_error": "NVML_ERROR_UNKNOWN"})
    snapshot = reader.read()
    assert cat.POWER_USAGE.name not in snapshot.gpus[1].values
    assert cat.GPU_TEMP.name in snapshot.gpus[1].values
    assert cat.POWER_USAGE.name in snapshot.gpus[0].values
    assert reader.errors.snapshot() == {("gpu", "nvmlDeviceGetPowerUsage"): 1}
    fake_nvml.set_value(1, "nvmlDeviceGetPowerUsage", original)
    assert cat.POWER_USAGE.name in reader.read().gpus[1].values  # transient, not unsupported


def test_old_driver_without_memory_v2_reports_no_reserved(
    fake_nvml: FakeNvml, fixture_data: dict[str, Any]
) -> None:
    for index in range(8):
        fake_nvml.set_value(
            index, "nvmlDeviceGetMemoryInfo_v2", {"nvml_error": "NVML_ERROR_FUNCTION_NOT_FOUND"}
        )
    snapshot = open_reader(fake_nvml).read()
    values = snapshot.gpus[0].values
    assert cat.FB_RESERVED.name not in values
    v1 = fixture_data["devices"][0]["nvmlDeviceGetMemoryInfo"]
    assert values[cat.FB_USED.name] == v1["used"] / (1024 * 1024)
    assert snapshot.unsupported[cat.FB_RESERVED.name] == 8


def test_clock_event_reasons_and_the_pre_r535_name(fake_nvml: FakeNvml) -> None:
    snapshot = open_reader(fake_nvml).read()
    assert snapshot.gpus[3].clock_event_reasons == 0x4
    assert snapshot.gpus[0].clock_event_reasons == 0
    fake_nvml.set_value(
        0,
        "nvmlDeviceGetCurrentClocksEventReasons",
        {"nvml_error": "NVML_ERROR_FUNCTION_NOT_FOUND"},
    )
    fake_nvml.set_value(0, "nvmlDeviceGetCurrentClocksThrottleReasons", 0x40)
    reader = open_reader(fake_nvml)
    assert reader.read().gpus[0].clock_event_reasons == 0x40


def test_configured_expected_gpus_reveal_a_gpu_missing_at_start(
    fixture_data: dict[str, Any],
) -> None:
    fixture_data["devices"] = fixture_data["devices"][:7]
    reader = open_reader(FakeNvml(fixture_data), expected_gpus=8)
    snapshot = reader.read()
    assert (snapshot.gpus_expected, snapshot.gpus_seen) == (8, 7)


@pytest.mark.parametrize(
    ("error", "remedy"),
    [
        ("NVML_ERROR_LIBRARY_NOT_FOUND", "libnvidia-ml.so.1 was not found"),
        ("NVML_ERROR_DRIVER_NOT_LOADED", "driver is not loaded"),
        ("NVML_ERROR_LIB_RM_VERSION_MISMATCH", "reboot or reload"),
    ],
)
def test_nvml_init_failure_names_cause_and_remedy(
    fixture_data: dict[str, Any], error: str, remedy: str
) -> None:
    fixture_data["init_error"] = error
    with pytest.raises(NvmlUnavailable, match=remedy):
        open_reader(FakeNvml(fixture_data))
