"""Which pod holds each GPU: the kubelet's pod-resources API (gRPC v1), polled in a thread.

The kubelet serves ``v1.PodResourcesLister`` on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``); its ``List`` answers, for every pod
on the node, the device ids each container was allocated per resource name
(``k8s.io/kubelet/pkg/apis/podresources/v1/api.proto``). dcgm-exporter asks it on
every scrape; the agent asks every ``interval`` seconds in its own thread, with a
deadline per call, so a missing, dead or hung kubelet never slows ``/metrics``.

The few messages read are decoded here from the protobuf wire format (fields by
number, unknown ones skipped), so the agent needs grpcio but no generated code;
``tests/test_pod_attribution.py`` serves the published proto through grpcio-tools'
generated code to check this decoder against the protobuf library.

When a refresh fails, the last answer is kept for ``keep_for`` seconds (by default
three intervals, at least 30 s): a kubelet restart takes seconds, and dropping the
labels meanwhile would end and restart every series of every allocated GPU. Past
that the labels are dropped, since pods may have come and gone unseen and a wrong
pod is worse than none; ``gpufleet_agent_pod_resources_refreshes_total`` counts
each failure and ``..._last_success_timestamp_seconds`` says since when.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from gpufleet.gpu.attribution import (
    NVIDIA_MIG_RESOURCE_PREFIX,
    NVIDIA_RESOURCE,
    GpuIdType,
    PodAllocation,
    PodRef,
    gpu_key,
)

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
Outcome = Literal["ok", "error", "timeout"]
OUTCOMES: tuple[Outcome, ...] = ("ok", "error", "timeout")
MAX_RESPONSE_BYTES = 16 * 1024 * 1024  # beyond gRPC's 4 MiB default: a node of many pods


# -- the protobuf wire format, for the messages List returns ----------------------------


class WireError(ValueError):
    """Bytes that are not a valid protobuf encoding of the expected message."""


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...]


@dataclass(frozen=True, slots=True)
class PodResources:
    name: str
    namespace: str
    containers: tuple[ContainerResources, ...]


def _varint(data: bytes, at: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise WireError("truncated or overlong varint")
        byte = data[at]
        at += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, at
        shift += 7


def _fields(data: bytes) -> Iterable[tuple[int, int | bytes]]:
    """(field number, value) of each field: an int for varints and fixed-width fields,
    the bytes of length-delimited ones. Groups (wire types 3, 4) are not proto3."""
    at = 0
    while at < len(data):
        tag, at = _varint(data, at)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise WireError("field number 0")
        if wire == 0:
            value, at = _varint(data, at)
            yield number, value
        elif wire == 2:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise WireError("length-delimited field runs past the message")
            yield number, data[at : at + size]
            at += size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if at + width > len(data):
                raise WireError("fixed-width field runs past the message")
            yield number, int.from_bytes(data[at : at + width], "little")
            at += width
        else:
            raise WireError(f"wire type {wire} is not proto3")


def _text(value: int | bytes) -> str:
    if not isinstance(value, bytes):
        raise WireError("a string field is not length-delimited")
    return value.decode("utf-8", errors="replace")


def _message(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise WireError("a message field is not length-delimited")
    return value


def decode_container_devices(data: bytes) -> ContainerDevices:
    resource, ids = "", []
    for number, value in _fields(data):
        if number == 1:
            resource = _text(value)
        elif number == 2:
            ids.append(_text(value))
    return ContainerDevices(resource, tuple(ids))


def decode_container_resources(data: bytes) -> ContainerResources:
    name, devices = "", []
    for number, value in _fields(data):
        if number == 1:
            name = _text(value)
        elif number == 2:
            devices.append(decode_container_devices(_message(value)))
    return ContainerResources(name, tuple(devices))


def decode_pod_resources(data: bytes) -> PodResources:
    name, namespace, containers = "", "", []
    for number, value in _fields(data):
        if number == 1:
            name = _text(value)
        elif number == 2:
            namespace = _text(value)
        elif number == 3:
            containers.append(decode_container_resources(_message(value)))
    return PodResources(name, namespace, tuple(containers))


def decode_list_response(data: bytes) -> tuple[PodResources, ...]:
    """``ListPodResourcesResponse``: field 1, ``repeated PodResources pod_resources``."""
    return tuple(
        decode_pod_resources(_message(value)) for number, value in _fields(data) if number == 1
    )


def encode_list_request(_: object) -> bytes:
    """``ListPodResourcesRequest`` has no fields: its encoding is empty."""
    return b""


# -- from the kubelet's answer to the GPUs' pods -----------------------------------------


def is_gpu_resource(resource_name: str, extra: Iterable[str] = ()) -> bool:
    """dcgm-exporter's filter: nvidia.com/gpu, the names given, and nvidia.com/mig-*."""
    return (
        resource_name == NVIDIA_RESOURCE
        or resource_name in extra
        or resource_name.startswith(NVIDIA_MIG_RESOURCE_PREFIX)
    )


def allocation_of(
    pods: Iterable[PodResources], gpu_id_type: GpuIdType = "uid", extra: Iterable[str] = ()
) -> PodAllocation:
    """Which container holds each GPU; on a shared GPU the last one listed, as
    dcgm-exporter without --kubernetes-virtual-gpus."""
    names = frozenset(extra)
    by_gpu: dict[str, PodRef] = {}
    for pod in pods:
        for container in pod.containers:
            ref = PodRef(pod.namespace, pod.name, container.name)
            for devices in container.devices:
                if not is_gpu_resource(devices.resource_name, names):
                    continue
                for device_id in devices.device_ids:
                    by_gpu[gpu_key(device_id)] = ref
    return PodAllocation(MappingProxyType(by_gpu), gpu_id_type)


# -- the client and the refresher ---------------------------------------------------------


class PodResourcesUnavailable(Exception):
    """One List call failed; ``outcome`` says whether it timed out."""

    def __init__(self, outcome: Outcome, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


def list_pod_resources(socket_path: str, timeout: float) -> tuple[PodResources, ...]:
    """One ``List`` call on a fresh channel (as dcgm-exporter connects per call): a
    kubelet that restarted is reached at once, not after a reconnect backoff."""
    import grpc

    if not os.path.exists(socket_path):
        raise PodResourcesUnavailable("error", f"{socket_path} does not exist")
    target = "unix://" + os.path.abspath(socket_path)
    options = [("grpc.max_receive_message_length", MAX_RESPONSE_BYTES)]
    with grpc.insecure_channel(target, options=options) as channel:
        call: Callable[..., tuple[PodResources, ...]] = channel.unary_unary(
            LIST_METHOD,
            request_serializer=encode_list_request,
            response_deserializer=decode_list_response,
        )
        try:
            return call(None, timeout=timeout)
        except grpc.RpcError as error:
            code: Any = error.code() if hasattr(error, "code") else None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise PodResourcesUnavailable(
                    "timeout", f"List on {socket_path} took over {timeout:g} s"
                ) from None
            details = error.details() if hasattr(error, "details") else str(error)
            raise PodResourcesUnavailable(
                "error", f"List on {socket_path} failed: {code}: {details}"
            ) from None


class PodResourcesRefresher:
    """The current pod allocation, refreshed by a thread; ``version`` counts changes."""

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        *,
        gpu_id_type: GpuIdType = "uid",
        resource_names: Iterable[str] = (),
        interval: float = 10.0,
        timeout: float = 5.0,
        keep_for: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.socket_path = socket_path
        self.gpu_id_type = gpu_id_type
        self.resource_names = tuple(resource_names)
        self.interval = interval
        self.timeout = timeout
        self.keep_for = max(3 * interval, 30.0) if keep_for is None else keep_for
        self._clock = clock
        self._lock = threading.Lock()
        self._allocation: PodAllocation | None = None
        self.version = 0
        self._outcomes: dict[Outcome, int] = dict.fromkeys(OUTCOMES, 0)
        self.last_success: float | None = None
        self._last_failure: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def current(self) -> tuple[int, PodAllocation | None]:
        with self._lock:
            return self.version, self._allocation

    def outcomes(self) -> dict[Outcome, int]:
        with self._lock:
            return dict(self._outcomes)

    def refresh(self) -> Outcome:
        """One List call; the allocation (and version) changes only if the answer differs."""
        try:
            pods = list_pod_resources(self.socket_path, self.timeout)
            allocation: PodAllocation | None = allocation_of(
                pods, self.gpu_id_type, self.resource_names
            )
        except PodResourcesUnavailable as failure:
            return self._failed(failure.outcome, str(failure))
        except ValueError as error:  # a malformed answer: the same as no answer
            return self._failed("error", f"List on {self.socket_path}: {error}")
        with self._lock:
            self._outcomes["ok"] += 1
            self.last_success = self._clock()
            self._replace(allocation)
        if self._last_failure is not None:
            log.info("pod-resources: %s answers again", self.socket_path)
            self._last_failure = None
        return "ok"

    def _failed(self, outcome: Outcome, message: str) -> Outcome:
        with self._lock:
            self._outcomes[outcome] += 1
            since = self.last_success
            if self._allocation is not None and (
                since is None or self._clock() - since > self.keep_for
            ):
                self._replace(None)
                message += f"; pod labels dropped after {self.keep_for:g} s without an answer"
        if message != self._last_failure:  # log a new failure once, not every interval
            log.warning("pod-resources: %s", message)
            self._last_failure = message
        return outcome

    def _replace(self, allocation: PodAllocation | None) -> None:
        if allocation != self._allocation:
            self._allocation = allocation
            self.version += 1

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._loop, name="gpufleet-pod-resources", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _loop(self) -> None:
        while True:
            try:
                self.refresh()
            except Exception:  # never let the thread die: the labels would freeze
                log.exception("pod-resources refresh failed")
            if self._stop.wait(self.interval):
                return
