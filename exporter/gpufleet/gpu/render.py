"""Turns a GPU snapshot (and the XID ledger) into exposition families, once per change."""

from __future__ import annotations

from collections.abc import Callable

from gpufleet.exposition import (
    EMPTY_PART,
    Family,
    PrecompressedPart,
    format_labels,
    render,
)
from gpufleet.gpu.attribution import NO_ATTRIBUTION, Attribution, merge_sorted
from gpufleet.gpu.sampler import GpuSampler
from gpufleet.gpu.snapshot import GpuSnapshot
from gpufleet.gpu.xid import XidLedger, XidView
from gpufleet.gpu.xid_catalogue import DCGM_MESSAGES, UNKNOWN_MESSAGE
from gpufleet.schema import gpu as cat
from gpufleet.schema.family import MetricDef
from gpufleet.schema.gpu import HPC_JOB_LABEL, MIG_INSTANCE_LABEL, MIG_PROFILE_LABEL


def _family(metric: MetricDef) -> Family:
    return Family(metric.name, metric.kind, metric.help)


Labels = tuple[tuple[str, str], ...]


class _GpuSeries:
    """How one reading's series are labelled: its base labels (identity, node, driver),
    and the attribute pairs of each copy (one copy, or one per Slurm job on the GPU)."""

    __slots__ = ("base", "copies")

    def __init__(self, base: str, copies: tuple[Labels, ...]) -> None:
        self.base = base
        self.copies = copies

    def dcgm(self, own: Labels = ()) -> list[str]:
        """dcgm-exporter's families: its own attributes sorted in with the rest."""
        return [_join(self.base, merge_sorted(attributes, own)) for attributes in self.copies]

    def ours(self, own: Labels = ()) -> list[str]:
        """gpufleet's families: the attributes, then the family's own labels."""
        return [_join(self.base, (*attributes, *own)) for attributes in self.copies]


def _join(base: str, pairs: Labels) -> str:
    return f"{base},{format_labels(pairs)}" if pairs else base


def gpu_families(
    snapshot: GpuSnapshot,
    xids: XidView | None = None,
    stale: bool = False,
    node_label: str = cat.NODE_LABEL,
    attribution: Attribution = NO_ATTRIBUTION,
) -> list[Family]:
    """Families for one snapshot. A stale snapshot yields no values, only that GPUs are down.

    Every series carries dcgm-exporter's labels, the node under ``node_label``
    (``Hostname`` as every released dcgm-exporter, or ``hostname``), and the driver
    version as ``DCGM_FI_DRIVER_VERSION``, as dcgm-exporter's stock counters do; then,
    while a pod or a Slurm job holds the GPU, ``container``, ``hpc_job``, ``namespace``
    and ``pod`` (``gpu/attribution.py``)."""
    families: list[Family] = []
    hostname = snapshot.gpus[0].identity.hostname if snapshot.gpus else ""
    driver_pair = (cat.DRIVER_LABEL, snapshot.driver_version)
    host_labels = format_labels(((node_label, hostname), driver_pair))

    def gpu_labels(pairs: Labels) -> str:
        named = tuple((node_label if key == cat.NODE_LABEL else key, value) for key, value in pairs)
        return format_labels((*named, driver_pair))

    series = {
        reading.identity.key: _GpuSeries(
            gpu_labels(reading.identity.label_pairs()),
            attribution.label_sets(reading.identity),
        )
        for reading in snapshot.gpus
    }

    if not stale:
        for metric in cat.VALUE_METRICS:
            family = _family(metric)
            for reading in snapshot.gpus:
                if reading.up and metric.name in reading.values:
                    value = reading.values[metric.name]
                    for labels in series[reading.identity.key].dcgm():
                        family.add(labels, value)
            families.append(family)

        # A flag only for the reasons in effect (value 1): nine reasons on every GPU,
        # mostly 0, were 72 of a node's series; the bitmask above holds them all.
        throttle = _family(cat.THROTTLE_ACTIVE)
        for reading in snapshot.gpus:
            if not reading.up or not reading.clock_event_reasons:
                continue
            gpu = series[reading.identity.key]
            for reason, bit in cat.THROTTLE_REASON_BITS:
                if reading.clock_event_reasons & bit:
                    for labels in gpu.ours((("reason", reason),)):
                        throttle.add(labels, 1.0)
        families.append(throttle)

    # gpu_up, gpu_info and the XID families are the GPU's: a MIG instance is not a GPU
    # (its parent's series keep them), so counting GPUs by these series stays right
    gpus = [reading for reading in snapshot.gpus if not reading.identity.is_mig]
    up = _family(cat.GPU_UP)
    for reading in gpus:
        for labels in series[reading.identity.key].ours():
            up.add(labels, 1.0 if reading.up and not stale else 0.0)
    families.append(up)

    info = _family(cat.GPU_INFO)
    versions = (
        ("driver_version", snapshot.driver_version),
        ("cuda_driver_version", snapshot.cuda_driver_version),
    )
    for reading in gpus:
        for labels in series[reading.identity.key].ours(versions):
            info.add(labels, 1.0)
    families.append(info)

    fabric = _family(cat.GPU_FABRIC_INFO)
    for reading in gpus:
        if reading.fabric is not None:
            where = reading.fabric
            own = (
                ("cluster_uuid", where.cluster_uuid),
                ("clique_id", where.clique_id),
                ("state", where.state),
            )
            for labels in series[reading.identity.key].ours(own):
                fabric.add(labels, 1.0)
    families.append(fabric)

    expected = _family(cat.GPUS_EXPECTED)
    expected.add(host_labels, float(snapshot.gpus_expected))
    families.append(expected)
    seen = _family(cat.GPUS_SEEN)
    seen.add(host_labels, 0.0 if stale else float(snapshot.gpus_seen))
    families.append(seen)

    unsupported = _family(cat.FIELDS_UNSUPPORTED)
    for name in sorted(snapshot.unsupported):
        unsupported.add(f'{host_labels},field="{name}"', float(snapshot.unsupported[name]))
    families.append(unsupported)

    if xids is not None:
        families.extend(_xid_families(snapshot, xids, series, stale))
    families.extend(allocation_families(snapshot, attribution, node_label, hostname))
    return families


def allocation_families(
    snapshot: GpuSnapshot, attribution: Attribution, node_label: str, hostname: str
) -> list[Family]:
    """The join series: which pod holds each GPU, which Slurm jobs run on it (value 1).

    Few labels, one series per allocated GPU (or instance) and pod, one per GPU and job,
    so that a rule joins them onto any GPU series ``on (Hostname, gpu, UUID)``
    without carrying pod labels itself."""
    allocations = _family(cat.ALLOCATION_INFO)
    jobs = _family(cat.JOB_INFO)
    for reading in snapshot.gpus:
        identity = reading.identity
        where: Labels = (
            (node_label, hostname),
            ("gpu", str(identity.index)),
            ("UUID", identity.uuid),
        )
        if identity.is_mig:
            instance: Labels = ((MIG_INSTANCE_LABEL, str(identity.mig_instance_id)),)
            profile: Labels = ((MIG_PROFILE_LABEL, identity.mig_profile or ""),)
        else:
            instance = profile = ()
        pod = attribution.pod_for(identity)
        if pod is not None:
            training_job = attribution.training_jobs.get((pod.namespace, pod.pod))
            allocations.add(
                format_labels(
                    (
                        *where,
                        *profile,
                        *instance,
                        ("namespace", pod.namespace),
                        ("pod", pod.pod),
                        ("container", pod.container),
                        *((("training_job", training_job),) if training_job else ()),
                    )
                ),
                1.0,
            )
        for job in attribution.jobs_for(identity):
            jobs.add(format_labels((*where, *instance, (HPC_JOB_LABEL, job))), 1.0)
    return [allocations, jobs]


def _xid_families(
    snapshot: GpuSnapshot, xids: XidView, series: dict[tuple[int, int], _GpuSeries], stale: bool
) -> list[Family]:
    last = _family(cat.XID_LAST)
    total = _family(cat.XID_TOTAL)
    when = _family(cat.XID_LAST_TIMESTAMP)
    for reading in snapshot.gpus:
        if reading.identity.is_mig:
            continue  # XIDs are the parent GPU's (NVML reports them on its handle)
        gpu = series[reading.identity.key]
        history = xids.by_uuid.get(reading.identity.uuid)
        if xids.watching and reading.up and not stale:
            code = history.last_xid if history else 0
            message = DCGM_MESSAGES.get(code, UNKNOWN_MESSAGE)
            for labels in gpu.dcgm((("err_code", str(code)), ("err_msg", message))):
                last.add(labels, float(code))
        if history is None:
            continue
        for code in sorted(history.counts):
            for labels in gpu.ours((("xid", str(code)),)):
                total.add(labels, float(history.counts[code]))
        # An XID NVML attributes to a GPU instance: the parent's series plus GPU_I_ID,
        # with the pod (or Slurm job) of that instance where one holds it, so a page
        # names the instance's tenant, not every tenant of the GPU.
        for (instance, code), count in sorted(history.instance_counts.items()):
            holder = series.get((reading.identity.index, instance), gpu)
            own = ((MIG_INSTANCE_LABEL, str(instance)), ("xid", str(code)))
            for attributes in holder.copies:
                total.add(_join(gpu.base, (*attributes, *own)), float(count))
        for labels in gpu.ours():
            when.add(labels, history.last_seen)
    return [last, total, when]


class GpuExpositionCache:
    """Renders the GPU part of /metrics only when the snapshot, XIDs, staleness or the
    attribution (who holds each GPU) change."""

    def __init__(
        self,
        sampler: GpuSampler,
        ledger: XidLedger | None,
        node_label: str = cat.NODE_LABEL,
        attribution: Callable[[], Attribution] | None = None,
    ) -> None:
        self._sampler = sampler
        self._ledger = ledger
        self._node_label = node_label
        self._attribution = attribution
        self._key: tuple[int, int, bool, tuple[int, ...]] | None = None
        self._part = EMPTY_PART
        self.renders = 0

    def part(self) -> PrecompressedPart:
        status = self._sampler.status()
        snapshot = status.snapshot
        if snapshot is None:
            return EMPTY_PART
        version = self._ledger.version if self._ledger is not None else -1
        attribution = self._attribution() if self._attribution is not None else NO_ATTRIBUTION
        key = (snapshot.seq, version, status.stale, attribution.version)
        if key != self._key:
            xids = self._ledger.view() if self._ledger is not None else None
            families = gpu_families(snapshot, xids, status.stale, self._node_label, attribution)
            self._part = PrecompressedPart.of(render(families))
            self._key = key
            self.renders += 1
        return self._part
