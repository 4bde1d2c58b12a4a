"""Slurm job attribution: dcgm-exporter's hpc-job-mapping directory (one file per GPU
index, or <index>.<GPU instance id> for MIG, one job id per line) becomes ``hpc_job`` on
every series of the GPU and ``gpufleet_gpu_job_info``, and follows the files as a
prolog / epilog writes and removes them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gpufleet.agent.app import Agent, AgentSettings
from gpufleet.agent.hpc_jobs import HpcJobMapping, read_mapping
from gpufleet.cli import AGENT_OPTIONS, build_parser
from gpufleet.gpu.fake import FakeNvml
from gpufleet.schema import gpu as cat

DEADLINE_S = 20.0  # generous: the directory is read every 0.05 s here


def samples_of(text: str) -> list[Sample]:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def poll(fetch: Callable[[], str], done: Callable[[str], bool]) -> str:
    """fetch() until done(text) holds, or fail with the last text after the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        text = fetch()
        if done(text):
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {DEADLINE_S} s:\n{text[:3000]}")
        time.sleep(0.05)


def jobs_by_gpu(text: str, name: str = "DCGM_FI_DEV_GPU_TEMP") -> dict[str, list[str]]:
    jobs: dict[str, list[str]] = {}
    for sample in samples_of(text):
        if sample.name == name:
            jobs.setdefault(sample.labels["gpu"], []).append(sample.labels.get("hpc_job", ""))
    return {gpu: sorted(found) for gpu, found in jobs.items()}


@pytest.fixture
def mapping_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "hpc-jobs"
    directory.mkdir()
    return directory


@pytest.fixture
def served(fake_nvml: FakeNvml, mapping_dir: Path) -> Iterator[Callable[[], str]]:
    settings = AgentSettings(
        node="node-a",
        gpu_interval=60,
        hpc_job_mapping_dir=str(mapping_dir),
        hpc_job_mapping_interval=0.05,
    )
    agent = Agent(settings, nvml=fake_nvml)
    agent.open()
    with TestClient(agent.asgi()) as client:
        fetch = lambda: client.get("/metrics").text  # noqa: E731
        poll(fetch, lambda text: "DCGM_FI_DEV_GPU_TEMP{" in text)  # the first snapshot
        yield fetch


def test_the_directory_format_is_dcgm_exporter_s(mapping_dir: Path) -> None:
    (mapping_dir / "0").write_text("4711\n")
    (mapping_dir / "1").write_text("4712\n4713\n")
    (mapping_dir / "2.3").write_text("4714\n")  # MIG: GPU 2, GPU instance 3
    (mapping_dir / "3").write_text(" 4715 \r\n\n")  # whitespace and blank lines skipped
    (mapping_dir / "4").write_text("")  # an empty file is no job
    (mapping_dir / "README").write_text("not a GPU\n")
    (mapping_dir / "5.tmp").write_text("half-written\n")
    (mapping_dir / "6").mkdir()
    assert read_mapping(mapping_dir) == {
        "0": ("4711",),
        "1": ("4712", "4713"),
        "2.3": ("4714",),
        "3": ("4715",),
    }


def test_a_missing_directory_means_no_jobs_and_its_creation_is_noticed(tmp_path: Path) -> None:
    mapping = HpcJobMapping(tmp_path / "not-yet")
    mapping.refresh()
    assert mapping.current() == (0, {})
    (tmp_path / "not-yet").mkdir()
    (tmp_path / "not-yet" / "0").write_text("99\n")
    mapping.refresh()
    version, jobs = mapping.current()
    assert (version, dict(jobs)) == (1, {"0": ("99",)})
    mapping.refresh()  # unchanged: the version stays, so the exposition is not re-rendered
    assert mapping.current()[0] == 1


def test_hpc_job_follows_the_files(served: Callable[[], str], mapping_dir: Path) -> None:
    text = served()
    assert "hpc_job" not in text
    assert jobs_by_gpu(text)["0"] == [""]

    (mapping_dir / "0").write_text("4711\n")
    text = poll(served, lambda t: jobs_by_gpu(t)["0"] == ["4711"])
    assert all(jobs == [""] for gpu, jobs in jobs_by_gpu(text).items() if gpu != "0")
    # every per-GPU series of GPU 0, dcgm-exporter's and gpufleet's, carries the job
    for sample in samples_of(text):
        if sample.labels.get("gpu") == "0" and sample.name != cat.ALLOCATION_INFO.name:
            assert sample.labels.get("hpc_job") == "4711", sample
    job_info = [s for s in samples_of(text) if s.name == cat.JOB_INFO.name]
    assert [(s.labels, s.value) for s in job_info] == [
        ({"Hostname": "node-a", "gpu": "0", "UUID": uuid_of(text, "0"), "hpc_job": "4711"}, 1.0)
    ]

    # two jobs share GPU 0: each series once per job, as dcgm-exporter copies them
    (mapping_dir / "0").write_text("4711\n4720\n")
    text = poll(served, lambda t: jobs_by_gpu(t)["0"] == ["4711", "4720"])
    assert sorted(s.labels["hpc_job"] for s in samples_of(text) if s.name == cat.JOB_INFO.name) == [
        "4711",
        "4720",
    ]

    # the epilog removes the file: the GPU's series are unlabelled again
    (mapping_dir / "0").unlink()
    text = poll(served, lambda t: jobs_by_gpu(t)["0"] == [""])
    assert "hpc_job" not in text


def test_dcgm_exporter_s_label_order_with_a_job(
    served: Callable[[], str], mapping_dir: Path
) -> None:
    (mapping_dir / "1").write_text("88\n")
    text = poll(served, lambda t: 'hpc_job="88"' in t)
    line = next(
        line for line in text.splitlines() if line.startswith('DCGM_FI_DEV_XID_ERRORS{gpu="1"')
    )
    names = [pair.split("=", 1)[0] for pair in line.split("{", 1)[1].split("}")[0].split(",")]
    # attributes sorted by name after the driver version, as dcgm-exporter's template
    assert names[-4:] == ["DCGM_FI_DRIVER_VERSION", "err_code", "err_msg", "hpc_job"]


def uuid_of(text: str, gpu: str) -> str:
    return next(
        s.labels["UUID"]
        for s in samples_of(text)
        if s.name == "DCGM_FI_DEV_GPU_TEMP" and s.labels["gpu"] == gpu
    )


def test_the_flag_and_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for option in AGENT_OPTIONS:
        monkeypatch.delenv(option.env or "", raising=False)
    monkeypatch.setenv("GPUFLEET_HPC_JOB_MAPPING_DIR", "/run/gpufleet/hpc-jobs")
    namespace = build_parser().parse_args(["agent"])
    values = {option.dest: option.resolve(namespace) for option in AGENT_OPTIONS}
    assert values["hpc_job_mapping_dir"] == "/run/gpufleet/hpc-jobs"
    assert values["hpc_job_mapping_interval"] == 5.0
    namespace = build_parser().parse_args(["agent", "--hpc-job-mapping-dir", "/var/run/jobs"])
    assert {o.dest: o.resolve(namespace) for o in AGENT_OPTIONS}["hpc_job_mapping_dir"] == (
        "/var/run/jobs"
    )
