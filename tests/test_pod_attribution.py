"""Kubernetes pod attribution: the agent asks the kubelet's pod-resources API (a real
gRPC server generated from the published v1 proto, on a unix socket) which container
holds each GPU, and every series of an allocated GPU carries namespace, pod and
container as dcgm-exporter writes them; a missing, dead or hung kubelet never slows
/metrics and is counted."""

from __future__ import annotations

import re
import shutil
import socket
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gpufleet.agent import pod_resources
from gpufleet.agent.app import Agent, AgentSettings
from gpufleet.agent.pod_resources import (
    ContainerDevices,
    ContainerResources,
    PodResources,
    PodResourcesRefresher,
    WireError,
    allocation_of,
    decode_list_response,
)
from gpufleet.cli import AGENT_OPTIONS, build_parser
from gpufleet.cli import agent as agent_cli
from gpufleet.gpu import attribution
from gpufleet.gpu.fake import FakeNvml
from gpufleet.gpu.fixture import bundled_fixture
from gpufleet.lab.processes import free_port
from gpufleet.schema import gpu as cat
from kubelet_podresources import Allocation, KubeletPodResources, compile_proto

DEADLINE_S = 30.0  # generous: the kubelet is asked every 0.1 s here
POD_LABELS = ("container", "namespace", "pod")


@pytest.fixture(scope="module")
def proto(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, ModuleType]:
    return compile_proto(tmp_path_factory.mktemp("podresources-proto"))


@pytest.fixture
def kubelet(proto: tuple[ModuleType, ModuleType]) -> Iterator[KubeletPodResources]:
    server = KubeletPodResources(*proto).start()
    yield server
    server.stop()


def samples_of(text: str) -> list[Sample]:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def poll(fetch: Callable[[], str], done: Callable[[str], bool]) -> str:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        text = fetch()
        if done(text):
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {DEADLINE_S} s:\n{text[:4000]}")
        time.sleep(0.05)


def pods_by_gpu(text: str, name: str = "DCGM_FI_DEV_GPU_TEMP") -> dict[str, tuple[str, ...]]:
    """gpu -> (container, namespace, pod) of its series (empty strings: none)."""
    return {
        s.labels["gpu"]: tuple(s.labels.get(label, "") for label in POD_LABELS)
        for s in samples_of(text)
        if s.name == name
    }


def uuids(_: FakeNvml) -> list[str]:
    """The fixture's GPU UUIDs, by index, read through NVML's API as the agent reads them
    (from a second fake over the same recording: the agent's keeps its own state)."""
    fake_nvml = FakeNvml(bundled_fixture())
    fake_nvml.nvmlInit()
    try:
        count = fake_nvml.nvmlDeviceGetCount()
        return [
            fake_nvml.nvmlDeviceGetUUID(fake_nvml.nvmlDeviceGetHandleByIndex(index))
            for index in range(count)
        ]
    finally:
        fake_nvml.nvmlShutdown()


def serve(
    fake_nvml: FakeNvml, socket: str, **settings: Any
) -> Iterator[tuple[Callable[[], str], Agent]]:
    agent = Agent(
        AgentSettings(
            node="node-a",
            gpu_interval=60,
            kubernetes=True,
            pod_resources_kubelet_socket=socket,
            pod_resources_interval=0.1,
            pod_resources_timeout=0.5,
            **settings,
        ),
        nvml=fake_nvml,
    )
    agent.open()
    with TestClient(agent.asgi()) as client:
        fetch = lambda: client.get("/metrics").text  # noqa: E731
        poll(fetch, lambda text: "DCGM_FI_DEV_GPU_TEMP{" in text)
        yield fetch, agent


@pytest.fixture
def served(
    fake_nvml: FakeNvml, kubelet: KubeletPodResources
) -> Iterator[tuple[Callable[[], str], Agent]]:
    yield from serve(fake_nvml, kubelet.socket)


# -- the wire format, against the protobuf library ---------------------------------------


def test_the_decoder_reads_what_the_protobuf_library_writes(
    proto: tuple[ModuleType, ModuleType],
) -> None:
    pb, _ = proto
    response = pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(
                name="trainer-0",
                namespace="team-a",
                cpu_ids=[4, 5],  # fields the agent does not read are skipped
                memory=[pb.ContainerMemory(memory_type="memory", size=2**40)],
                containers=[
                    pb.ContainerResources(
                        name="pytorch",
                        devices=[
                            pb.ContainerDevices(
                                resource_name="nvidia.com/gpu",
                                device_ids=["GPU-a", "GPU-b::3"],
                                topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=-1)]),
                            ),
                            pb.ContainerDevices(resource_name="example.com/nic", device_ids=["x"]),
                        ],
                        cpu_ids=[1, 2, 3],
                        dynamic_resources=[
                            pb.DynamicResource(
                                claim_name="c",
                                claim_resources=[
                                    pb.ClaimResource(driver_name="gpu.nvidia.com", share_id="s")
                                ],
                            )
                        ],
                    ),
                    pb.ContainerResources(name="sidecar"),
                ],
            ),
            pb.PodResources(name="ünïcode-pod", namespace="ns"),
        ]
    )
    assert decode_list_response(response.SerializeToString()) == (
        PodResources(
            "trainer-0",
            "team-a",
            (
                ContainerResources(
                    "pytorch",
                    (
                        ContainerDevices("nvidia.com/gpu", ("GPU-a", "GPU-b::3")),
                        ContainerDevices("example.com/nic", ("x",)),
                    ),
                ),
                ContainerResources("sidecar", ()),
            ),
        ),
        PodResources("ünïcode-pod", "ns", ()),
    )
    assert decode_list_response(pb.ListPodResourcesResponse().SerializeToString()) == ()


@pytest.mark.parametrize(
    "data",
    [b"\x0a\x05ab", b"\x0a", b"\x0b", b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"],
    ids=["runs-past", "no-length", "group", "overlong-varint"],
)
def test_a_broken_answer_is_refused(data: bytes) -> None:
    with pytest.raises(WireError):
        decode_list_response(data)


def test_only_gpu_resources_count_and_shared_ids_name_their_gpu() -> None:
    def pod(name: str, resource: str, *ids: str) -> PodResources:
        return PodResources(
            name, "ns", (ContainerResources("c", ((ContainerDevices(resource, ids)),)),)
        )

    allocation = allocation_of(
        [
            pod("whole", "nvidia.com/gpu", "GPU-0"),
            pod("sliced", "nvidia.com/gpu", "GPU-1::0", "GPU-1::1"),
            pod("gke-shared", "nvidia.com/gpu", "nvidia2/vgpu0"),
            pod("mig", "nvidia.com/mig-1g.10gb", "MIG-aaaa"),
            pod("mig-sliced", "nvidia.com/mig-2g.20gb", "MIG-bbbb::2"),
            pod("gke-mig", "nvidia.com/gpu", "nvidia3/gi5/vgpu1"),
            pod("renamed", "nvidia.com/a100", "GPU-4"),
            pod("renamed-not-asked", "nvidia.com/h100", "GPU-5"),
            pod("nic", "example.com/nic", "GPU-6"),
        ],
        extra=("nvidia.com/a100",),
    )
    assert {key: ref.pod for key, ref in allocation.by_gpu.items()} == {
        "GPU-0": "whole",
        "GPU-1": "sliced",
        "nvidia2": "gke-shared",
        "MIG-aaaa": "mig",
        "MIG-bbbb": "mig-sliced",
        "gi:3.5": "gke-mig",
        "GPU-4": "renamed",
    }


# -- /metrics, from a real kubelet socket ------------------------------------------------


def test_every_series_of_an_allocated_gpu_names_its_pod(
    served: tuple[Callable[[], str], Agent], kubelet: KubeletPodResources, fake_nvml: FakeNvml
) -> None:
    fetch, _ = served
    gpu = uuids(fake_nvml)
    assert set(pods_by_gpu(fetch()).values()) == {("", "", "")}
    kubelet.allocate(
        Allocation("team-a", "trainer-0", "pytorch", (gpu[0], gpu[1])),
        # time-slicing: the device plugin's replica ids name the GPU
        Allocation("team-b", "notebook", "jupyter", (f"{gpu[2]}::1",)),
        Allocation("team-c", "nic-user", "app", ("0000:3b:00.0",), "example.com/nic"),
    )
    text = poll(fetch, lambda t: pods_by_gpu(t)["2"] != ("", "", ""))
    expected = {
        "0": ("pytorch", "team-a", "trainer-0"),
        "1": ("pytorch", "team-a", "trainer-0"),
        "2": ("jupyter", "team-b", "notebook"),
    }
    for sample in samples_of(text):
        if "gpu" not in sample.labels or sample.name == cat.ALLOCATION_INFO.name:
            continue
        want = expected.get(sample.labels["gpu"], ("", "", ""))
        assert tuple(sample.labels.get(label, "") for label in POD_LABELS) == want, sample

    allocations = sorted(
        (s.labels["gpu"], s.labels) for s in samples_of(text) if s.name == cat.ALLOCATION_INFO.name
    )
    assert [labels for _, labels in allocations] == [
        {
            "Hostname": "node-a",
            "gpu": index,
            "UUID": gpu[int(index)],
            "namespace": namespace,
            "pod": pod,
            "container": container,
        }
        for index, (container, namespace, pod) in sorted(expected.items())
    ]


def test_labels_follow_a_reallocation_and_a_release(
    served: tuple[Callable[[], str], Agent], kubelet: KubeletPodResources, fake_nvml: FakeNvml
) -> None:
    fetch, agent = served
    gpu = uuids(fake_nvml)
    kubelet.allocate(Allocation("team-a", "first", "main", (gpu[5],)))
    poll(fetch, lambda t: pods_by_gpu(t)["5"] == ("main", "team-a", "first"))
    renders = agent._cache.renders if agent._cache else 0
    kubelet.allocate(Allocation("team-b", "second", "main", (gpu[5],)))
    text = poll(fetch, lambda t: pods_by_gpu(t)["5"] == ("main", "team-b", "second"))
    assert 'pod="first"' not in text
    assert agent._cache is not None and agent._cache.renders > renders  # re-rendered
    kubelet.allocate()
    text = poll(fetch, lambda t: pods_by_gpu(t)["5"] == ("", "", ""))
    assert 'pod="' not in text


def test_an_unchanged_allocation_does_not_re_render(
    served: tuple[Callable[[], str], Agent], kubelet: KubeletPodResources, fake_nvml: FakeNvml
) -> None:
    fetch, agent = served
    kubelet.allocate(Allocation("team-a", "steady", "main", (uuids(fake_nvml)[0],)))
    poll(fetch, lambda t: 'pod="steady"' in t)
    assert agent._cache is not None and agent.pod_resources is not None
    renders, calls = agent._cache.renders, kubelet.calls
    poll(fetch, lambda _: kubelet.calls >= calls + 3)  # three more identical answers
    assert agent._cache.renders == renders


def test_device_names_with_kubernetes_gpu_id_type_device_name(
    fake_nvml: FakeNvml, kubelet: KubeletPodResources
) -> None:
    kubelet.allocate(
        Allocation("team-a", "by-name", "main", ("nvidia3",)),
        Allocation("team-b", "gke-shared", "main", ("nvidia4/vgpu2",)),
        Allocation("team-c", "by-uuid", "main", (uuids(fake_nvml)[6],)),  # not how it names
    )
    for fetch, _ in serve(fake_nvml, kubelet.socket, kubernetes_gpu_id_type="device-name"):
        text = poll(fetch, lambda t: pods_by_gpu(t)["4"] != ("", "", ""))
        found = pods_by_gpu(text)
        assert found["3"] == ("main", "team-a", "by-name")
        assert found["4"] == ("main", "team-b", "gke-shared")
        assert found["6"] == ("", "", "")


def test_dcgm_exporter_s_label_order_on_an_allocated_gpu(
    served: tuple[Callable[[], str], Agent], kubelet: KubeletPodResources, fake_nvml: FakeNvml
) -> None:
    fetch, _ = served
    kubelet.allocate(Allocation("team-a", "trainer-0", "pytorch", (uuids(fake_nvml)[0],)))
    text = poll(fetch, lambda t: 'pod="trainer-0"' in t)

    def names(prefix: str) -> list[str]:
        line = next(line for line in text.splitlines() if line.startswith(prefix))
        return re.findall(r'([A-Za-z_]+)="', line.split("{", 1)[1])

    identity = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"]
    pod = ["container", "namespace", "pod"]
    # attributes sorted by name after the driver version, as dcgm-exporter's template
    assert names('DCGM_FI_DEV_GPU_TEMP{gpu="0"') == [*identity, "DCGM_FI_DRIVER_VERSION", *pod]
    assert names('DCGM_FI_DEV_XID_ERRORS{gpu="0"') == [
        *identity,
        "DCGM_FI_DRIVER_VERSION",
        "container",
        "err_code",
        "err_msg",
        "namespace",
        "pod",
    ]
    temp = next(
        line for line in text.splitlines() if line.startswith('DCGM_FI_DEV_GPU_TEMP{gpu="0"')
    )
    assert ',container="pytorch",namespace="team-a",pod="trainer-0"}' in temp
    xid = next(
        line for line in text.splitlines() if line.startswith('DCGM_FI_DEV_XID_ERRORS{gpu="0"')
    )
    assert (
        ',container="pytorch",err_code="0",err_msg="No Error",namespace="team-a",pod="trainer-0"}'
        in xid
    )


# -- a kubelet that is missing, dead or hung ---------------------------------------------


def scrape_seconds(fetch: Callable[[], str]) -> float:
    started = time.perf_counter()
    fetch()
    return time.perf_counter() - started


def refreshes(text: str) -> dict[str, float]:
    return {
        s.labels["outcome"]: s.value
        for s in samples_of(text)
        if s.name == "gpufleet_agent_pod_resources_refreshes_total"
    }


def test_a_missing_socket_is_counted_and_scrapes_stay_fast(
    fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    for fetch, _ in serve(fake_nvml, str(tmp_path / "no-kubelet.sock")):
        text = poll(fetch, lambda t: refreshes(t).get("error", 0) >= 3)
        assert refreshes(text)["ok"] == 0
        assert "gpufleet_agent_pod_resources_last_success_timestamp_seconds" not in text
        assert 'pod="' not in text
        assert max(scrape_seconds(fetch) for _ in range(5)) < 2.0


def test_a_hung_kubelet_times_out_and_never_holds_a_scrape(
    served: tuple[Callable[[], str], Agent], kubelet: KubeletPodResources, fake_nvml: FakeNvml
) -> None:
    fetch, _ = served
    kubelet.allocate(Allocation("team-a", "before-hang", "main", (uuids(fake_nvml)[0],)))
    text = poll(fetch, lambda t: 'pod="before-hang"' in t)
    assert "gpufleet_agent_pod_resources_last_success_timestamp_seconds" in text
    kubelet.hang()  # each List now blocks for 30 s; the client gives up after 0.5 s
    text = poll(fetch, lambda t: refreshes(t).get("timeout", 0) >= 2)
    # while List calls hang, every scrape answers at once (a generous bound, not a benchmark)
    assert max(scrape_seconds(fetch) for _ in range(5)) < 2.0
    # the last answer is kept for a while (a kubelet restart is no reason to drop labels)
    assert 'pod="before-hang"' in text


def test_labels_are_kept_for_a_bounded_time_then_dropped(
    kubelet: KubeletPodResources, fake_nvml: FakeNvml
) -> None:
    now = [1000.0]
    refresher = PodResourcesRefresher(
        kubelet.socket, interval=10, timeout=1, keep_for=30, clock=lambda: now[0]
    )
    kubelet.allocate(Allocation("team-a", "p", "c", (uuids(fake_nvml)[0],)))
    assert refresher.refresh() == "ok"
    version, allocation = refresher.current()
    assert allocation is not None and "p" in {ref.pod for ref in allocation.by_gpu.values()}
    assert refresher.last_success == 1000.0
    kubelet.stop()  # the kubelet goes away
    now[0] += 20
    assert refresher.refresh() == "error"
    assert refresher.current() == (version, allocation)  # kept: within keep_for
    now[0] += 20
    assert refresher.refresh() == "error"
    assert refresher.current() == (version + 1, None)  # dropped: 40 s without an answer
    assert refresher.outcomes() == {"ok": 1, "error": 2, "timeout": 0}
    assert refresher.keep_for == 30
    assert PodResourcesRefresher(interval=5).keep_for == 30.0  # at least 30 s
    assert PodResourcesRefresher(interval=60).keep_for == 180.0  # three intervals


# -- configuration ---------------------------------------------------------------------


def test_the_flags_and_their_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for option in AGENT_OPTIONS:
        monkeypatch.delenv(option.env or "", raising=False)

    def values(*argv: str) -> dict[str, object]:
        namespace = build_parser().parse_args(["agent", *argv])
        return {option.dest: option.resolve(namespace) for option in AGENT_OPTIONS}

    defaults = values()
    assert defaults["kubernetes"] is False  # off unless asked, as dcgm-exporter
    assert defaults["pod_resources_kubelet_socket"] == pod_resources.DEFAULT_SOCKET
    assert defaults["kubernetes_gpu_id_type"] == "uid"
    assert defaults["nvidia_resource_names"] == ()
    assert (defaults["pod_resources_interval"], defaults["pod_resources_timeout"]) == (10.0, 5.0)
    monkeypatch.setenv("GPUFLEET_KUBERNETES", "true")
    monkeypatch.setenv("GPUFLEET_POD_RESOURCES_KUBELET_SOCKET", "/run/kubelet/pr.sock")
    monkeypatch.setenv("GPUFLEET_KUBERNETES_GPU_ID_TYPE", "device-name")
    monkeypatch.setenv("GPUFLEET_NVIDIA_RESOURCE_NAMES", "nvidia.com/a100, nvidia.com/h100")
    configured = values()
    assert configured["kubernetes"] is True
    assert configured["pod_resources_kubelet_socket"] == "/run/kubelet/pr.sock"
    assert configured["kubernetes_gpu_id_type"] == "device-name"
    assert configured["nvidia_resource_names"] == ("nvidia.com/a100", "nvidia.com/h100")
    # the CLI restates these to import nothing beyond the standard library
    assert agent_cli.DEFAULT_SOCKET == pod_resources.DEFAULT_SOCKET
    assert agent_cli.GPU_ID_TYPES == attribution.GPU_ID_TYPES


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GPUFLEET_KUBERNETES_GPU_ID_TYPE": "index"}, "'index' is not one of: uid, device-name"),
        ({"GPUFLEET_NVIDIA_RESOURCE_NAMES": "a100"}, "'a100' is not an extended resource name"),
    ],
)
def test_bad_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    from gpufleet.cli import ConfigError

    for option in AGENT_OPTIONS:
        monkeypatch.delenv(option.env or "", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    namespace = build_parser().parse_args(["agent"])
    with pytest.raises(ConfigError, match=message):
        for option in AGENT_OPTIONS:
            option.resolve(namespace)


# -- the training client names its pod; the agent names the pod's training job ----------


def test_a_training_client_s_pod_puts_its_job_on_the_pod_s_gpus(
    fake_nvml: FakeNvml,
    kubelet: KubeletPodResources,
    serve_agent: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpufleet.client import Reporter

    gpu = uuids(fake_nvml)
    kubelet.allocate(
        Allocation("team-a", "llm-7b-worker-0", "pytorch", (gpu[0], gpu[1])),
        Allocation("team-b", "notebook", "jupyter", (gpu[2],)),
    )
    agent = Agent(
        AgentSettings(
            node="node-a",
            port=free_port(),
            gpu_interval=60,
            kubernetes=True,
            pod_resources_kubelet_socket=kubelet.socket,
            pod_resources_interval=0.1,
            pod_resources_timeout=0.5,
            allow_unauthenticated_ingest=True,
        ),
        nvml=fake_nvml,
    )
    agent.open()
    server = serve_agent(agent)
    url = f"http://127.0.0.1:{server.port}"

    def fetch() -> str:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
            return str(response.read().decode())

    def allocations(text: str) -> dict[str, dict[str, str]]:
        return {
            s.labels["pod"]: s.labels
            for s in samples_of(text)
            if s.name == cat.ALLOCATION_INFO.name
        }

    poll(fetch, lambda t: set(allocations(t)) == {"llm-7b-worker-0", "notebook"})
    # the downward API's variables, as docs/kubernetes.md's snippet sets them
    monkeypatch.setenv("GPUFLEET_NAMESPACE", "team-a")
    monkeypatch.setenv("GPUFLEET_POD", "llm-7b-worker-0")
    reporter = Reporter(url, training_job="llm-7b", rank=0)
    try:
        reporter.record_step(duration_s=1.0, tokens=10)
        assert reporter.flush(10)
        text = poll(fetch, lambda t: "training_job" in allocations(t)["llm-7b-worker-0"])
    finally:
        reporter.close()
    worker = allocations(text)["llm-7b-worker-0"]
    assert worker["training_job"] == "llm-7b"
    assert "training_job" not in allocations(text)["notebook"]  # no client said it
    # the job's training series carry its namespace and pod too
    steps = [s for s in samples_of(text) if s.name == "gpufleet_training_steps_total"]
    assert [(s.labels["namespace"], s.labels["pod"]) for s in steps] == [
        ("team-a", "llm-7b-worker-0")
    ]
    training = [s for s in samples_of(text) if s.labels.get("training_job") == "llm-7b"]
    assert training and all(s.labels.get("pod") == "llm-7b-worker-0" for s in training)


def test_a_job_s_series_name_its_pod_only_when_one_pod_runs_it_here() -> None:
    from gpufleet.agent.training_pods import TrainingPods

    now = [0.0]
    pods = TrainingPods(ttl_s=60, clock=lambda: now[0])

    class Event:
        def __init__(self, job: str) -> None:
            self.training_job = job

    def heard(namespace: str, pod: str, job: str) -> None:
        headers = {"X-Gpufleet-Namespace": namespace, "X-Gpufleet-Pod": pod}
        pods.note(headers, [Event(job)])

    heard("team-a", "solo-0", "solo")
    heard("team-a", "wide-0", "wide")  # eight single-GPU pods of one job on this node
    heard("team-a", "wide-1", "wide")
    heard("team-a", "odd-0", "odd")
    heard("team-b", "odd-1", "odd")  # one job name in two namespaces: neither is said
    pods.note({"X-Gpufleet-Namespace": "Bad_NS", "X-Gpufleet-Pod": "p"}, [Event("bad")])
    pods.note({}, [Event("off-kubernetes")])
    assert pods.labels_by_job() == {
        "solo": (("namespace", "team-a"), ("pod", "solo-0")),
        "wide": (("namespace", "team-a"),),
    }
    version, by_pod = pods.current()
    assert by_pod[("team-a", "solo-0")] == "solo"
    now[0] = 61.0  # the job TTL passes without a word from any of them
    assert pods.current() == (version + 1, {})
    assert pods.labels_by_job() == {}


def test_the_client_reads_its_pod_from_the_downward_api(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpufleet.client import pod_from_environment
    from gpufleet.reporter.pod import pod_headers

    for name in ("GPUFLEET_NAMESPACE", "GPUFLEET_POD", "POD_NAMESPACE", "POD_NAME"):
        monkeypatch.delenv(name, raising=False)
    assert pod_from_environment() is None and pod_headers() == {}
    monkeypatch.setenv("POD_NAMESPACE", "ml")
    monkeypatch.setenv("POD_NAME", "trainer-3")
    assert pod_from_environment() == ("ml", "trainer-3")
    monkeypatch.setenv("GPUFLEET_NAMESPACE", "team-a")
    monkeypatch.setenv("GPUFLEET_POD", "llm-0")
    assert pod_headers() == {"X-Gpufleet-Namespace": "team-a", "X-Gpufleet-Pod": "llm-0"}
    monkeypatch.setenv("GPUFLEET_POD", "Not_A_Pod")  # not a Kubernetes name: not sent
    assert pod_from_environment() is None


def test_an_attributed_agent_exports_what_the_schema_defines(
    served: tuple[Callable[[], str], Agent], kubelet: KubeletPodResources, fake_nvml: FakeNvml
) -> None:
    """Every family is the schema's (type, help, labels), pod labels aside: those are
    the catalogue's ATTRIBUTION_LABELS, on GPU families only, on every series of the
    allocated GPU and none other."""
    from gpufleet.schema.index import BY_NAME

    fetch, _ = served
    kubelet.allocate(Allocation("team-a", "trainer-0", "pytorch", (uuids(fake_nvml)[0],)))
    text = poll(fetch, lambda t: 'pod="trainer-0"' in t)
    gpu_families = {metric.name for metric in cat.GPU_FAMILIES}
    optional = set(cat.ATTRIBUTION_LABELS)
    seen = set()
    for family in text_string_to_metric_families(text):
        entry = BY_NAME.get(f"{family.name}_total") or BY_NAME.get(family.name)
        assert entry is not None, family.name
        assert (family.type, family.documentation) == (entry.kind, entry.help), entry.name
        for sample in family.samples:
            labels = set(sample.labels) - {"le", "quantile"}
            if entry.name in gpu_families and entry.name != cat.ALLOCATION_INFO.name:
                attributed = labels & optional
                assert attributed == (
                    {"container", "namespace", "pod"} if sample.labels.get("gpu") == "0" else set()
                ), sample
                labels -= attributed
            assert labels == set(entry.labels), sample
        seen.add(entry.name)
    assert {
        cat.ALLOCATION_INFO.name,
        "gpufleet_agent_pod_resources_refreshes_total",
        "gpufleet_agent_pod_resources_last_success_timestamp_seconds",
    } <= seen


def test_a_socket_that_accepts_and_never_answers_times_out(fake_nvml: FakeNvml) -> None:
    """Below gRPC: a listener that takes the connection and says nothing (a wedged
    kubelet). Each List is cut at the deadline; scrapes never wait for it."""
    directory = Path(tempfile.mkdtemp(prefix="mute-"))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(directory / "kubelet.sock"))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        for fetch, _ in serve(fake_nvml, str(directory / "kubelet.sock")):
            text = poll(fetch, lambda t: refreshes(t).get("timeout", 0) >= 2)
            assert refreshes(text)["ok"] == 0
            assert max(scrape_seconds(fetch) for _ in range(5)) < 2.0
    finally:
        stop.set()
        thread.join(5)
        for connection in held:
            connection.close()
        listener.close()
        shutil.rmtree(directory, ignore_errors=True)
