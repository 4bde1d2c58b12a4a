"""Who holds each GPU: the pod the kubelet allocated it to, the Slurm jobs mapped to it.

Both are read in the background (``agent/pod_resources.py``, ``agent/hpc_jobs.py``)
and reach the GPU exposition as one immutable :class:`Attribution`; this module turns
it into extra label pairs per reading, with dcgm-exporter's names and semantics
(``internal/pkg/transformation/kubernetes.go`` and ``hpc.go``):

- ``namespace``, ``pod``, ``container`` on every series of a GPU (or MIG instance) a
  pod holds. A whole GPU is matched by its UUID (``--kubernetes-gpu-id-type uid``) or
  its device name ``nvidia<minor>`` (``device-name``); a MIG instance by its MIG
  device UUID whatever the id type, as dcgm-exporter resolves MIG ids. Shared ids map
  to their GPU: ``<id>::<n>`` (the NVIDIA device plugin's time-slicing replicas) and
  ``<id>/vgpu<n>`` (GKE's shared GPUs); GKE's MIG ids ``nvidia<i>/gi<g>`` name GPU
  index ``i``, GPU instance ``g``. Where several pods share a GPU, the last one the
  kubelet lists names it, as dcgm-exporter does without ``--kubernetes-virtual-gpus``.
- ``hpc_job`` from a mapping file named after the GPU index (``0``) or, for a MIG
  instance, ``<index>.<GPU instance id>`` (``0.3``), one job id per line. A GPU with
  several jobs has each of its series once per job, as dcgm-exporter copies them.

dcgm-exporter writes these attributes after the driver-version label, sorted by name
(Go templates range over maps in key order); :func:`merge_sorted` keeps that order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from gpufleet.gpu.snapshot import GpuIdentity
from gpufleet.schema.gpu import CONTAINER_LABEL, HPC_JOB_LABEL, NAMESPACE_LABEL, POD_LABEL

GpuIdType = Literal["uid", "device-name"]
GPU_ID_TYPES: tuple[GpuIdType, ...] = ("uid", "device-name")

# dcgm-exporter's appconfig: the device plugin's resource and its MIG strategy's prefix.
NVIDIA_RESOURCE = "nvidia.com/gpu"
NVIDIA_MIG_RESOURCE_PREFIX = "nvidia.com/mig-"

_GKE_MIG_ID = re.compile(r"^nvidia([0-9]+)/gi([0-9]+)(/vgpu[0-9]+)?$")
_GKE_SHARED_SEPARATOR = "/vgpu"
_REPLICA_SEPARATOR = "::"
# dcgm-exporter's mapping file names: a GPU index, or <index>.<GPU instance id>.
MAPPING_FILE_NAME = re.compile(r"^\d+(\.\d+)?$")

_EMPTY: Mapping[str, tuple[str, ...]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class PodRef:
    """One container of one pod, as the kubelet's pod-resources API names it."""

    namespace: str
    pod: str
    container: str

    def label_pairs(self) -> tuple[tuple[str, str], ...]:
        return (
            (CONTAINER_LABEL, self.container),
            (NAMESPACE_LABEL, self.namespace),
            (POD_LABEL, self.pod),
        )


def gpu_key(device_id: str) -> str:
    """The key a device id from the kubelet is filed under: the GPU it names.

    ``GPU-…::2`` and ``MIG-…::2`` (time-slicing replicas) -> the id before ``::``;
    ``nvidia0/vgpu1`` -> ``nvidia0``; GKE's ``nvidia0/gi3[/vgpu1]`` -> ``gi:0.3``."""
    gke_mig = _GKE_MIG_ID.match(device_id)
    if gke_mig:
        return f"gi:{gke_mig.group(1)}.{gke_mig.group(2)}"
    if _GKE_SHARED_SEPARATOR in device_id:
        return device_id.split(_GKE_SHARED_SEPARATOR, 1)[0]
    if _REPLICA_SEPARATOR in device_id:
        return device_id.split(_REPLICA_SEPARATOR, 1)[0]
    return device_id


@dataclass(frozen=True, slots=True)
class PodAllocation:
    """The kubelet's answer, filed by :func:`gpu_key`: which container holds which GPU."""

    by_gpu: Mapping[str, PodRef]
    gpu_id_type: GpuIdType = "uid"

    def pod_for(self, identity: GpuIdentity) -> PodRef | None:
        if identity.is_mig:
            if identity.mig_uuid is not None and identity.mig_uuid in self.by_gpu:
                return self.by_gpu[identity.mig_uuid]
            return self.by_gpu.get(f"gi:{identity.index}.{identity.mig_instance_id}")
        key = identity.uuid if self.gpu_id_type == "uid" else identity.device
        return self.by_gpu.get(key)


def mapping_key(identity: GpuIdentity) -> str:
    """The hpc-job-mapping file that names this GPU's (or MIG instance's) jobs."""
    if identity.is_mig:
        return f"{identity.index}.{identity.mig_instance_id}"
    return str(identity.index)


@dataclass(frozen=True, slots=True)
class Attribution:
    """Everything known about who holds the node's GPUs at one moment.

    ``version`` changes whenever any part does, so a cached exposition knows to render
    again; ``pods`` is None when pod attribution is off or has nothing (known)."""

    pods: PodAllocation | None = None
    jobs: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _EMPTY)
    # (namespace, pod) -> training_job, from the training clients reporting to this agent
    training_jobs: Mapping[tuple[str, str], str] = field(default_factory=dict)
    version: tuple[int, ...] = ()

    def pod_for(self, identity: GpuIdentity) -> PodRef | None:
        return self.pods.pod_for(identity) if self.pods is not None else None

    def jobs_for(self, identity: GpuIdentity) -> tuple[str, ...]:
        return self.jobs.get(mapping_key(identity), ())

    def label_sets(self, identity: GpuIdentity) -> tuple[tuple[tuple[str, str], ...], ...]:
        """The attribute pairs of each copy of this GPU's series, sorted by name: one copy
        (maybe with no pairs), or one per Slurm job on it."""
        pod = self.pod_for(identity)
        pod_pairs = pod.label_pairs() if pod is not None else ()
        jobs = self.jobs_for(identity)
        if not jobs:
            return (pod_pairs,)
        return tuple(merge_sorted(pod_pairs, ((HPC_JOB_LABEL, job),)) for job in jobs)


NO_ATTRIBUTION = Attribution()


def merge_sorted(
    *groups: tuple[tuple[str, str], ...],
) -> tuple[tuple[str, str], ...]:
    """Label pairs of several groups in one tuple sorted by name, as dcgm-exporter's
    template writes its attributes."""
    return tuple(sorted((pair for group in groups for pair in group), key=lambda p: p[0]))
