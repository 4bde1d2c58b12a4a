"""The NVML reader against the recorded 8x H100 fixture, through the pynvml call boundary."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.gpu.fake import FakeNvml
from gpufleet.gpu.fixture import bundled_fixture
from gpufleet.gpu.nvml_call import NvmlUnavailable
from gpufleet.gpu.reader import NvmlReader
from gpufleet.gpu.snapshot import GpuSnapshot
from gpufleet.schema import gpu as cat

NVLINK5 = {
    cat.NVLINK_RECOVERY_SUCCESSFUL.name,
    cat.NVLINK_RECOVERY_FAILED.name,
    cat.NVLINK_RECOVERY_EVENTS.name,
    cat.NVLINK_SYMBOL_ERRORS.name,
    cat.NVLINK_EFFECTIVE_ERRORS.name,
}
PRE_BLACKWELL_NVLINK = {
    cat.NVLINK_CRC_FLIT.name,
    cat.NVLINK_CRC_DATA.name,
    cat.NVLINK_REPLAY.name,
    cat.NVLINK_RECOVERY.name,
}
UNSUPPORTED_ON_H100 = {
    cat.RETIRED_SBE.name,
    cat.RETIRED_DBE.name,
    cat.RETIRED_PENDING.name,
    *NVLINK5,
    cat.GPU_FABRIC_INFO.name,  # no multi-node NVLink fabric: NOT_SUPPORTED
}
ALL_LINKS = "4294967295"


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
    gpm = recorded["nvmlGpmMetricsGet"]
    # DCGM's PCIe rates: GPM's MiB/s as bytes/s, not NVML's 20 ms KiB/s sample
    assert values[cat.PCIE_TX.name] == int(gpm["20"] * mib)
    assert values[cat.PCIE_RX.name] == int(gpm["21"] * mib)
    assert values[cat.PCIE_TX.name] != recorded["nvmlDeviceGetPcieThroughput"]["0"] * 1024
    fields = recorded["nvmlDeviceGetFieldValues"]
    # DCGM publishes the perf-policy field values unconverted, in ns
    assert values[cat.POWER_VIOLATION.name] == fields["74"]["value"] == 90440948982
    assert values[cat.THERMAL_VIOLATION.name] == fields["75"]["value"]
    assert values[cat.SM_ACTIVE.name] == pytest.approx(gpm["2"] / 100)
    assert values[cat.MEMORY_TEMP.name] == fields["82"]["value"]
    assert values[cat.SM_CLOCK.name] == 1980
    assert values[cat.VGPU_LICENSE_STATUS.name] == 0  # bare metal, as DCGM reports it
    assert values[cat.CLOCKS_EVENT_REASONS.name] == values[cat.CLOCK_THROTTLE_REASONS.name]


def test_violation_falls_back_to_the_deprecated_call_in_ns(fake_nvml: FakeNvml) -> None:
    for field_id in ("74", "75"):
        fake_nvml.set_value(
            0, "nvmlDeviceGetFieldValues", {"nvml_error": "NVML_ERROR_NOT_SUPPORTED"}, field_id
        )
    fake_nvml.set_value(
        0, "nvmlDeviceGetViolationStatus", {"referenceTime": 1, "violationTime": 7_000_123}, "0"
    )
    reader = open_reader(fake_nvml)
    asked = fake_nvml.calls["nvmlDeviceGetViolationStatus"]
    values = reader.read().gpus[0].values
    assert values[cat.POWER_VIOLATION.name] == 7_000_123
    assert values[cat.THERMAL_VIOLATION.name] == 0
    # only GPU 0 lacks the fields: the deprecated call is made for it alone
    assert fake_nvml.calls["nvmlDeviceGetViolationStatus"] - asked == 2


def test_nvlink_bandwidth_is_megabytes_per_second_of_data_between_two_samples(
    fake_nvml: FakeNvml,
) -> None:
    def data(tx_kib: int, rx_kib: int, at_us: int) -> None:
        for key, kib in ((f"138@{ALL_LINKS}", tx_kib), (f"139@{ALL_LINKS}", rx_kib)):
            entry = {"type": 3, "value": kib, "timestamp": at_us}
            fake_nvml.set_value(1, "nvmlDeviceGetFieldValues", entry, key)

    refused = {"nvml_error": "NVML_ERROR_NOT_SUPPORTED"}
    for key in (f"138@{ALL_LINKS}", f"139@{ALL_LINKS}"):
        fake_nvml.set_value(1, "nvmlDeviceGetFieldValues", refused, key)
    reader = open_reader(fake_nvml)  # no sample of GPU 1's data counters at open
    data(10_000_000, 20_000_000, 1_700_000_000_000_000)
    first = reader.read()
    assert cat.NVLINK_BANDWIDTH.name not in first.gpus[1].values  # no rate from one sample
    # 2 s later: 600,000 KiB more TX and 400,000 KiB more RX of data
    data(10_600_000, 20_400_000, 1_700_000_002_000_000)
    second = reader.read().gpus[1].values
    # DCGM: (1,000,000 KiB / 2 s) / 1000 = 500 (its "MB/s")
    assert second[cat.NVLINK_BANDWIDTH.name] == 500
    # counters reset (driver reload): no negative rate, and the next interval counts again
    data(1_000, 1_000, 1_700_000_003_000_000)
    assert cat.NVLINK_BANDWIDTH.name not in reader.read().gpus[1].values
    data(1_000 + 50_000, 1_000 + 50_000, 1_700_000_004_000_000)
    assert reader.read().gpus[1].values[cat.NVLINK_BANDWIDTH.name] == 100
    assert cat.NVLINK_BANDWIDTH.name in reader.read().gpus[0].values  # every GPU, from then on


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
    assert reader.read().unsupported == dict.fromkeys(UNSUPPORTED_ON_H100, 8)
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


REMAP = (
    cat.CORRECTABLE_REMAPPED_ROWS.name,
    cat.UNCORRECTABLE_REMAPPED_ROWS.name,
    cat.ROW_REMAP_PENDING.name,
    cat.ROW_REMAP_FAILURE.name,
)


def test_remap_series_come_back_when_mig_is_disabled_without_a_restart(
    fake_nvml: FakeNvml,
) -> None:
    fake_nvml.set_mig_mode(2, True)  # MIG instances: NVML refuses the whole-GPU remap query
    reader = open_reader(fake_nvml)
    under_mig = reader.read()
    for name in (*REMAP, cat.GPU_UTIL.name):
        assert name not in under_mig.gpus[2].values, "refused must be omitted, never 0"
        assert name in under_mig.gpus[3].values
    assert under_mig.unsupported[cat.CORRECTABLE_REMAPPED_ROWS.name] == 1
    asked = fake_nvml.calls["nvmlDeviceGetRemappedRows"]
    reader.read()
    assert fake_nvml.calls["nvmlDeviceGetRemappedRows"] == asked + 7  # not GPU 2 while MIG holds
    fake_nvml.set_mig_mode(2, False)
    after = reader.read()
    for name in (*REMAP, cat.GPU_UTIL.name):
        assert name in after.gpus[2].values, name
    assert after.gpus[2].values[cat.CORRECTABLE_REMAPPED_ROWS.name] == 0
    assert cat.CORRECTABLE_REMAPPED_ROWS.name not in after.unsupported
    assert reader.errors.snapshot() == {}


def test_a_refused_mode_dependent_call_is_asked_again_after_the_reprobe_interval(
    fake_nvml: FakeNvml,
) -> None:
    fake_nvml.set_mig_mode(2, True)
    reader = open_reader(fake_nvml, reprobe_after_s=0.0)
    reader.read()
    asked = fake_nvml.calls["nvmlDeviceGetRemappedRows"]
    still = reader.read()
    assert fake_nvml.calls["nvmlDeviceGetRemappedRows"] == asked + 8  # GPU 2 asked again
    assert cat.CORRECTABLE_REMAPPED_ROWS.name not in still.gpus[2].values
    # MIG ends where NVML cannot report the mode: the timer alone brings the series back
    fake_nvml._devices[2].pop("nvmlDeviceGetMigMode")
    with fake_nvml._lock:
        fake_nvml._mig.discard(2)
    assert cat.CORRECTABLE_REMAPPED_ROWS.name in reader.read().gpus[2].values


def test_a_mode_independent_unsupported_call_is_still_never_asked_again(
    fake_nvml: FakeNvml,
) -> None:
    reader = open_reader(fake_nvml, reprobe_after_s=0.0)
    reader.read()
    asked = fake_nvml.calls["nvmlDeviceGetRetiredPages"]
    reader.read()
    assert fake_nvml.calls["nvmlDeviceGetRetiredPages"] == asked


def test_on_blackwell_the_nvlink5_counters_replace_the_pre_blackwell_ones() -> None:
    reader = open_reader(FakeNvml(bundled_fixture("b200-8gpu")))
    snapshot = two_cycles(reader)
    assert {gpu.identity.model for gpu in snapshot.gpus} == {"NVIDIA B200"}
    for reading in snapshot.gpus:
        assert set(reading.values) >= NVLINK5, reading.identity.index
        assert not PRE_BLACKWELL_NVLINK & set(reading.values), reading.identity.index
        assert cat.NVLINK_ECC_ERRORS.name in reading.values
    assert snapshot.unsupported == {
        **dict.fromkeys(PRE_BLACKWELL_NVLINK, 8),
        cat.RETIRED_SBE.name: 8,
        cat.RETIRED_DBE.name: 8,
        cat.RETIRED_PENDING.name: 8,
    }
    gpu6 = snapshot.gpus[6].values
    assert gpu6[cat.NVLINK_RECOVERY_SUCCESSFUL.name] == 2
    assert gpu6[cat.NVLINK_RECOVERY_EVENTS.name] == 2
    assert gpu6[cat.NVLINK_RECOVERY_FAILED.name] == 0
    assert snapshot.gpus[0].values[cat.NVLINK_SYMBOL_ERRORS.name] == 1843
    assert reader.errors.snapshot() == {}


def test_an_all_links_field_whose_scope_is_rejected_is_unsupported_not_an_error(
    fake_nvml: FakeNvml,
) -> None:
    rejected = {"nvml_error": "NVML_ERROR_INVALID_ARGUMENT"}
    fake_nvml.set_value(0, "nvmlDeviceGetFieldValues", rejected, f"213@{ALL_LINKS}")
    fake_nvml.set_value(1, "nvmlDeviceGetFieldValues", rejected, "82")
    reader = open_reader(fake_nvml)
    reader.read()
    assert reader.read().unsupported[cat.NVLINK_RECOVERY_SUCCESSFUL.name] == 8
    # the same error for a whole-GPU field is a failure, counted each cycle
    assert reader.errors.snapshot() == {("gpu", "nvmlDeviceGetFieldValues"): 2}


def test_gpm_after_mig_starts_from_a_fresh_sample(fake_nvml: FakeNvml) -> None:
    reader = open_reader(fake_nvml)
    reader.read()
    fake_nvml.set_mig_mode(1, True)
    assert cat.SM_ACTIVE.name not in reader.read().gpus[1].values
    fake_nvml.set_mig_mode(1, False)
    # the sample from before MIG is dropped, not used for a rate over the MIG stretch
    assert cat.SM_ACTIVE.name not in reader.read().gpus[1].values
    assert cat.SM_ACTIVE.name in reader.read().gpus[1].values


def test_gpus_without_mig_cost_no_mig_calls(fake_nvml: FakeNvml) -> None:
    reader = open_reader(fake_nvml)
    snapshot = two_cycles(reader)
    assert not any(reading.identity.is_mig for reading in snapshot.gpus)
    mig_calls = {
        call for call in fake_nvml.calls if "Mig" in call and call != "nvmlDeviceGetMigMode"
    }
    assert mig_calls == set()
