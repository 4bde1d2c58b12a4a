"""Recording NVML into a fixture and replaying it gives the same readings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.gpu import record
from gpufleet.gpu.fake import FakeNvml
from gpufleet.gpu.fixture import bundled_fixture, load_fixture
from gpufleet.gpu.reader import NvmlReader
from gpufleet.gpu.record import RecordingNvml


def read_twice(nvml: Any) -> Any:
    reader = NvmlReader(nvml, "node-a")
    reader.open()
    reader.read()
    snapshot = reader.read()
    reader.close()
    return snapshot


def test_record_then_replay_reproduces_every_reading(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    recorder = RecordingNvml(fake_nvml)
    original = read_twice(recorder)
    path = tmp_path / "recorded.json"
    path.write_text(json.dumps(recorder.fixture()))
    replayed = read_twice(FakeNvml(load_fixture(path)))
    assert replayed.driver_version == original.driver_version
    assert replayed.unsupported == original.unsupported
    for before, after in zip(original.gpus, replayed.gpus, strict=True):
        assert after.identity == before.identity
        assert after.values == before.values
        assert after.clock_event_reasons == before.clock_event_reasons


def test_recorded_errors_are_kept_by_name(fake_nvml: FakeNvml) -> None:
    recorder = RecordingNvml(fake_nvml)
    read_twice(recorder)
    device = recorder.fixture()["devices"][0]
    assert device["nvmlDeviceGetRetiredPages"]["0"] == {"nvml_error": "NVML_ERROR_NOT_SUPPORTED"}
    assert device["nvmlDeviceGetFieldValues"]["138@4294967295"]["type"] == 3
    assert device["nvmlDeviceGetFieldValues"]["213@4294967295"] == {
        "nvml_error": "NVML_ERROR_NOT_SUPPORTED"
    }
    assert device["nvmlDeviceGetMigMode"] == [0, 0]


def test_a_mig_node_records_and_replays_its_instances(tmp_path: Path) -> None:
    recorder = RecordingNvml(FakeNvml(bundled_fixture("h100-sxm-mig")))
    original = read_twice(recorder)
    fixture = recorder.fixture()
    path = tmp_path / "recorded.json"
    path.write_text(json.dumps(fixture))
    replayed = read_twice(FakeNvml(load_fixture(path)))
    assert len(original.gpus) == 8 + 11
    for before, after in zip(original.gpus, replayed.gpus, strict=True):
        assert after.identity == before.identity
        assert after.values == before.values
    gpu1 = fixture["devices"][1]
    assert gpu1["nvmlDeviceGetMaxMigDeviceCount"] == 7
    # the three free indices answered NOT_FOUND: no entry, so the replay answers the same
    assert [mig is None for mig in gpu1["mig_devices"]] == [False] * 4
    assert gpu1["mig_devices"][0]["nvmlDeviceGetName"] == "NVIDIA H100 80GB HBM3 MIG 2c.3g.40gb"
    assert set(gpu1["nvmlGpmMigMetricsGet"]) == {"2", "3", "5"}
    assert "nvmlDeviceGetTemperature" not in gpu1["mig_devices"][0]  # never asked on it


def test_nvml_record_writes_a_replayable_fixture_and_counts_gpus_and_instances(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `gpufleet nvml-record` on a MIG node, its NVML being the MIG fixture's
    monkeypatch.setattr(record, "pynvml", FakeNvml(bundled_fixture("h100-sxm-mig")))
    out, metrics = tmp_path / "node.json", tmp_path / "node.prom"
    summary = record.record_fixture("mig-node", str(out), str(metrics))
    assert summary.startswith(f"recorded 8 GPUs and 11 MIG instances into {out}; errors: none")
    replayed = read_twice(FakeNvml(load_fixture(out)))
    assert sum(1 for reading in replayed.gpus if reading.identity.is_mig) == 11
    assert 'GPU_I_PROFILE="7g.80gb",GPU_I_ID="0",Hostname="mig-node"' in metrics.read_text()
