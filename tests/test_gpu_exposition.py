"""What /metrics says about GPUs: names, types, labels, XIDs, staleness, gzip."""

from __future__ import annotations

import gzip
import time

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gpufleet.exposition import PrecompressedPart, render
from gpufleet.gpu.fake import FakeNvml
from gpufleet.gpu.fixture import bundled_fixture
from gpufleet.gpu.reader import NvmlReader
from gpufleet.gpu.render import gpu_families
from gpufleet.gpu.snapshot import GpuSnapshot
from gpufleet.gpu.xid import XidLedger
from gpufleet.schema import gpu as cat

NVLINK5 = (
    cat.NVLINK_RECOVERY_SUCCESSFUL.name,
    cat.NVLINK_RECOVERY_FAILED.name,
    cat.NVLINK_RECOVERY_EVENTS.name,
    cat.NVLINK_SYMBOL_ERRORS.name,
    cat.NVLINK_EFFECTIVE_ERRORS.name,
)
PRE_BLACKWELL_NVLINK = (
    cat.NVLINK_CRC_FLIT.name,
    cat.NVLINK_CRC_DATA.name,
    cat.NVLINK_REPLAY.name,
    cat.NVLINK_RECOVERY.name,
)
UNSUPPORTED_ON_H100 = {
    cat.RETIRED_SBE.name,
    cat.RETIRED_DBE.name,
    cat.RETIRED_PENDING.name,
    *NVLINK5,
    cat.GPU_FABRIC_INFO.name,  # no multi-node NVLink fabric: NOT_SUPPORTED
}


def snapshot_of(nvml: FakeNvml) -> GpuSnapshot:
    reader = NvmlReader(nvml, "node-a")
    reader.open()
    reader.read()
    return reader.read()


def parse(body: bytes) -> dict[str, list[Sample]]:
    """Samples by name. prometheus-client's parser renames a counter's samples to
    NAME_total; the bare DCGM names are checked against real Prometheus elsewhere,
    so here a counter's samples are found under its family name too."""
    samples: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
            if family.type == "counter" and sample.name == f"{family.name}_total":
                samples.setdefault(family.name, []).append(sample)
    return samples


def types_of(body: bytes) -> dict[str, str]:
    types = {}
    for line in body.decode().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
    return types


def test_every_dcgm_family_has_its_name_type_and_label_set(fake_nvml: FakeNvml) -> None:
    body = render(gpu_families(snapshot_of(fake_nvml)))
    samples = parse(body)
    types = types_of(body)
    for metric in cat.VALUE_METRICS:
        if metric.name in UNSUPPORTED_ON_H100:
            assert metric.name not in samples, "unsupported must be omitted, never 0"
            continue
        assert types[metric.name] == metric.kind, metric.name
        assert len(samples[metric.name]) == 8, metric.name
        for sample in samples[metric.name]:
            assert tuple(sample.labels) == (*cat.GPU_LABELS, cat.DRIVER_LABEL)
            assert sample.labels["Hostname"] == "node-a"
    # dcgm-exporter exposes counters under their bare names, not with _total
    assert types["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in body.decode()


def test_gpufleet_families_beyond_dcgm(fake_nvml: FakeNvml) -> None:
    samples = parse(render(gpu_families(snapshot_of(fake_nvml))))
    assert {s.labels["gpu"]: s.value for s in samples["gpufleet_gpu_up"]} == {
        str(i): 1.0 for i in range(8)
    }
    # a flag only for a reason in effect: GPU 3 at its power cap, the others unthrottled
    throttled = {
        (s.labels["gpu"], s.labels["reason"], s.value)
        for s in samples["gpufleet_gpu_clock_throttle_active"]
    }
    assert throttled == {("3", "sw_power_cap", 1.0)}
    bitmask = {s.labels["gpu"]: s.value for s in samples["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"]}
    assert bitmask["3"] == dict(cat.THROTTLE_REASON_BITS)["sw_power_cap"]
    assert {gpu: value for gpu, value in bitmask.items() if gpu != "3"} == {
        str(i): 0.0 for i in range(8) if i != 3
    }
    info = samples["gpufleet_gpu_info"][0].labels
    assert info["driver_version"] == "570.86.15"
    assert info["cuda_driver_version"] == "12.8"
    assert info["modelName"] == "NVIDIA H100 80GB HBM3"
    assert samples["gpufleet_gpus_expected"][0].value == 8
    assert samples["gpufleet_gpus_seen"][0].value == 8
    unsupported = {s.labels["field"]: s.value for s in samples["gpufleet_gpu_fields_unsupported"]}
    assert unsupported == dict.fromkeys(UNSUPPORTED_ON_H100, 8.0)
    assert {s.value for s in samples["gpufleet_gpu_recovery_action"]} == {0.0}


def test_a_lost_gpu_reports_down_and_no_values(fake_nvml: FakeNvml) -> None:
    reader = NvmlReader(fake_nvml, "node-a")
    reader.open()
    reader.read()
    fake_nvml.lose_gpu(6)
    samples = parse(render(gpu_families(reader.read())))
    up = {s.labels["gpu"]: s.value for s in samples["gpufleet_gpu_up"]}
    assert up["6"] == 0 and sum(up.values()) == 7
    assert {s.labels["gpu"] for s in samples["DCGM_FI_DEV_GPU_TEMP"]} == {
        "0",
        "1",
        "2",
        "3",
        "4",
        "5",
        "7",
    }
    assert samples["gpufleet_gpus_seen"][0].value == 7


def test_xids_are_counted_per_code_and_dcgm_keeps_the_last(fake_nvml: FakeNvml) -> None:
    snapshot = snapshot_of(fake_nvml)
    ledger = XidLedger()
    ledger.set_watching(True)
    uuid = snapshot.gpus[4].identity.uuid
    for xid in (79, 79, 48):
        ledger.record(uuid, xid, 1_764_460_000.0)
    samples = parse(render(gpu_families(snapshot, ledger.view())))
    counts = {
        (s.labels["gpu"], s.labels["xid"]): s.value
        for s in samples["gpufleet_gpu_xid_errors_total"]
    }
    assert counts == {("4", "79"): 2.0, ("4", "48"): 1.0}
    last = {s.labels["gpu"]: s.value for s in samples["DCGM_FI_DEV_XID_ERRORS"]}
    assert last["4"] == 48 and last["0"] == 0 and len(last) == 8
    (when,) = samples["gpufleet_gpu_last_xid_timestamp_seconds"]
    assert when.value == 1_764_460_000.0


def test_xid_counters_survive_the_gpu_going_down(fake_nvml: FakeNvml) -> None:
    reader = NvmlReader(fake_nvml, "node-a")
    reader.open()
    ledger = XidLedger()
    ledger.set_watching(True)
    ledger.record(reader.read().gpus[1].identity.uuid, 79, time.time())
    fake_nvml.lose_gpu(1)
    samples = parse(render(gpu_families(reader.read(), ledger.view())))
    assert [s.labels["xid"] for s in samples["gpufleet_gpu_xid_errors_total"]] == ["79"]
    assert "1" not in {s.labels["gpu"] for s in samples["DCGM_FI_DEV_XID_ERRORS"]}


def test_a_stale_snapshot_serves_no_values_and_every_gpu_down(fake_nvml: FakeNvml) -> None:
    samples = parse(render(gpu_families(snapshot_of(fake_nvml), stale=True)))
    assert not any(name.startswith("DCGM_FI_") for name in samples)
    assert {s.value for s in samples["gpufleet_gpu_up"]} == {0.0}
    assert samples["gpufleet_gpus_seen"][0].value == 0
    assert samples["gpufleet_gpus_expected"][0].value == 8


def test_label_values_are_escaped() -> None:
    from gpufleet.exposition import Family, format_labels

    family = Family("x", "gauge", "help with \\ and\nnewline")
    family.add(format_labels((("model", 'quote " back \\ nl \n'),)), 1.0)
    (parsed,) = text_string_to_metric_families(render([family]).decode())
    assert parsed.samples[0].labels["model"] == 'quote " back \\ nl \n'


@given(st.binary(max_size=5000), st.binary(max_size=5000))
def test_precompressed_prefix_plus_fresh_tail_is_one_valid_gzip(prefix: bytes, tail: bytes) -> None:
    body = PrecompressedPart.of(prefix).gzip_with(tail)
    assert gzip.decompress(body) == prefix + tail
    # one member: a strict single-stream decoder consumes it all
    import zlib

    decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
    assert decoder.decompress(body) == prefix + tail
    assert decoder.eof and decoder.unused_data == b""


def test_a_b200_node_exports_the_nvlink5_series_and_not_the_pre_blackwell_ones() -> None:
    body = render(gpu_families(snapshot_of(FakeNvml(bundled_fixture("b200-8gpu")))))
    samples = parse(body)
    types = types_of(body)
    for name in (*NVLINK5, cat.NVLINK_ECC_ERRORS.name):
        assert types[name] == "counter", name
        assert len(samples[name]) == 8, name
    for name in PRE_BLACKWELL_NVLINK:
        assert name not in samples, "unsupported must be omitted, never 0"
    unsupported = {s.labels["field"]: s.value for s in samples["gpufleet_gpu_fields_unsupported"]}
    assert {name: unsupported.get(name) for name in PRE_BLACKWELL_NVLINK} == dict.fromkeys(
        PRE_BLACKWELL_NVLINK, 8.0
    )
    recovered = {s.labels["gpu"]: s.value for s in samples[cat.NVLINK_RECOVERY_SUCCESSFUL.name]}
    assert recovered["6"] == 2 and recovered["0"] == 0


def test_series_per_h100_node(fake_nvml: FakeNvml) -> None:
    """The series budget of one 8-GPU H100 node's GPU part (XIDs aside): 398 before
    issue 34; +8 each for the 4.x clock-event name, the bare-metal vGPU license status
    and the NVLink data ECC total, and +4 gpufleet_gpu_fields_unsupported rows (the
    five NVLink5 counters in place of the vGPU license); +1 row for the NVLink fabric
    NVML has none of on this node (issue 37); the 72 throttle flags (nine reasons on
    eight GPUs) down to those in effect, one here (GPU 3 at its power cap; issue 40)."""
    body = render(gpu_families(snapshot_of(fake_nvml))).decode()
    series = [line for line in body.splitlines() if line and not line.startswith("#")]
    assert len(series) == 398 + 3 * 8 + 4 + 1 - 9 * 8 + 1
