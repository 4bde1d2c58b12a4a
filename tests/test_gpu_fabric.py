"""The GPU's NVLink fabric (nvmlDeviceGetGpuFabricInfoV) as gpufleet_gpu_fabric_info."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.exposition import render
from gpufleet.gpu.fake import FakeNvml
from gpufleet.gpu.fixture import bundled_fixture, load_fixture
from gpufleet.gpu.reader import NvmlReader
from gpufleet.gpu.record import RecordingNvml
from gpufleet.gpu.render import gpu_families
from gpufleet.gpu.snapshot import GpuFabric, GpuSnapshot
from gpufleet.schema import gpu as cat
from test_schema import check_against_schema

B200_CLUSTER = "5d0c7a3e-91b4-4f2a-8e6d-2b7f1c9a4e10"


def read_twice(nvml: Any) -> GpuSnapshot:
    reader = NvmlReader(nvml, "node-a")
    reader.open()
    reader.read()
    snapshot = reader.read()
    reader.close()
    return snapshot


def fabric_samples(snapshot: GpuSnapshot) -> list[dict[str, str]]:
    text = render(gpu_families(snapshot)).decode()
    for family in text_string_to_metric_families(text):
        if family.name == cat.GPU_FABRIC_INFO.name:
            return [sample.labels for sample in family.samples]
    return []


def test_a_gpu_in_an_nvlink_fabric_names_its_cluster_and_clique() -> None:
    snapshot = read_twice(FakeNvml(bundled_fixture("b200-8gpu")))
    samples = fabric_samples(snapshot)
    assert len(samples) == 8
    for labels in samples:
        assert (labels["cluster_uuid"], labels["clique_id"], labels["state"]) == (
            B200_CLUSTER,
            "32766",
            "completed",
        )
        assert labels["Hostname"] == "node-a" and labels["UUID"].startswith("GPU-")
    assert cat.GPU_FABRIC_INFO.name not in snapshot.unsupported
    # type, help and labels as the schema declares them
    assert cat.GPU_FABRIC_INFO.name in check_against_schema(render(gpu_families(snapshot)).decode())


def test_a_gpu_without_a_fabric_has_no_series_and_is_counted_unsupported_once(
    fake_nvml: FakeNvml,
) -> None:
    reader = NvmlReader(fake_nvml, "node-a")
    reader.open()
    reader.read()
    asked = fake_nvml.calls["nvmlDeviceGetGpuFabricInfoV"]
    snapshot = reader.read()
    assert fabric_samples(snapshot) == []
    assert snapshot.unsupported[cat.GPU_FABRIC_INFO.name] == 8
    # NOT_SUPPORTED is final: the v2 call and the v1 fallback once per GPU, never again
    assert asked == 8 and fake_nvml.calls["nvmlDeviceGetGpuFabricInfoV"] == 8
    assert fake_nvml.calls["nvmlDeviceGetGpuFabricInfo"] == 8


def _with_fabric(**fields: Any) -> dict[str, Any]:
    fixture = copy.deepcopy(bundled_fixture("b200-8gpu"))
    for device in fixture["devices"]:
        device["nvmlDeviceGetGpuFabricInfoV"].update(fields)
    return fixture


def test_a_registration_in_progress_or_failed_names_no_domain() -> None:
    pending = read_twice(FakeNvml(_with_fabric(state=2)))
    assert {reading.fabric for reading in pending.gpus} == {GpuFabric("in_progress")}
    labels = fabric_samples(pending)[0]
    assert (labels["state"], labels["cluster_uuid"], labels["clique_id"]) == ("in_progress", "", "")
    failed = read_twice(FakeNvml(_with_fabric(status=3)))
    assert {reading.fabric for reading in failed.gpus} == {GpuFabric("failed")}
    # the state NOT_SUPPORTED from a call that succeeded: no fabric, as NOT_SUPPORTED
    none = read_twice(FakeNvml(_with_fabric(state=0)))
    assert fabric_samples(none) == [] and none.unsupported[cat.GPU_FABRIC_INFO.name] == 8


@pytest.mark.parametrize(
    "refusal", ["NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_ARGUMENT_VERSION_MISMATCH"]
)
def test_a_driver_without_the_versioned_call_is_read_through_v1(refusal: str) -> None:
    fixture = copy.deepcopy(bundled_fixture("b200-8gpu"))
    for device in fixture["devices"]:
        v2 = device.pop("nvmlDeviceGetGpuFabricInfoV")
        device["nvmlDeviceGetGpuFabricInfoV"] = {"nvml_error": refusal}
        device["nvmlDeviceGetGpuFabricInfo"] = {k: v for k, v in v2.items() if k != "healthMask"}
    nvml = FakeNvml(fixture)
    snapshot = read_twice(nvml)
    assert {reading.fabric for reading in snapshot.gpus} == {
        GpuFabric("completed", B200_CLUSTER, "32766")
    }
    # the versioned call is not asked again (nor counted as an error each cycle)
    assert nvml.calls["nvmlDeviceGetGpuFabricInfoV"] == 8
    assert nvml.calls["nvmlDeviceGetGpuFabricInfo"] == 16


def test_nvml_record_records_the_fabric_and_the_fixture_replays_it(tmp_path: Path) -> None:
    recorder = RecordingNvml(FakeNvml(bundled_fixture("b200-8gpu")))
    original = read_twice(recorder)
    fixture = recorder.fixture()
    assert fixture["devices"][3]["nvmlDeviceGetGpuFabricInfoV"] == {
        "clusterUuid": B200_CLUSTER,
        "status": 0,
        "cliqueId": 32766,
        "state": 3,
    }
    path = tmp_path / "recorded.json"
    path.write_text(json.dumps(fixture))
    replayed = read_twice(FakeNvml(load_fixture(path)))
    assert [r.fabric for r in replayed.gpus] == [r.fabric for r in original.gpus]
    assert original.gpus[0].fabric == GpuFabric("completed", B200_CLUSTER, "32766")
