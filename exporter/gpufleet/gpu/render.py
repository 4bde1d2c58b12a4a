"""Turns a GPU snapshot (and the XID ledger) into exposition families, once per change."""

from __future__ import annotations

from gpufleet.exposition import (
    EMPTY_PART,
    Family,
    PrecompressedPart,
    escape_label_value,
    format_labels,
    render,
)
from gpufleet.gpu import catalogue as cat
from gpufleet.gpu.sampler import GpuSampler
from gpufleet.gpu.snapshot import GpuSnapshot
from gpufleet.gpu.xid import XidLedger, XidView


def _family(metric: cat.GpuMetric) -> Family:
    return Family(metric.name, metric.kind, metric.help)


def gpu_families(
    snapshot: GpuSnapshot,
    xids: XidView | None = None,
    stale: bool = False,
    node_label: str = cat.NODE_LABEL,
) -> list[Family]:
    """Families for one snapshot. A stale snapshot yields no values, only that GPUs are down.

    Every series carries dcgm-exporter's labels, the node under ``node_label``
    (``Hostname`` as every released dcgm-exporter, or ``hostname``), and the driver
    version as ``DCGM_FI_DRIVER_VERSION``, as dcgm-exporter's stock counters do."""
    families: list[Family] = []
    hostname = snapshot.gpus[0].identity.hostname if snapshot.gpus else ""
    driver_pair = (cat.DRIVER_LABEL, snapshot.driver_version)
    host_labels = format_labels(((node_label, hostname), driver_pair))

    def gpu_labels(pairs: tuple[tuple[str, str], ...]) -> str:
        named = tuple((node_label if key == cat.NODE_LABEL else key, value) for key, value in pairs)
        return format_labels((*named, driver_pair))

    # keyed by (index, GPU instance): a MIG instance shares its parent's index
    labels_by_index = {
        reading.identity.key: gpu_labels(reading.identity.label_pairs())
        for reading in snapshot.gpus
    }

    if not stale:
        for metric in cat.VALUE_METRICS:
            family = _family(metric)
            for reading in snapshot.gpus:
                if reading.up and metric.name in reading.values:
                    family.add(labels_by_index[reading.identity.key], reading.values[metric.name])
            families.append(family)

        throttle = _family(cat.THROTTLE_ACTIVE)
        for reading in snapshot.gpus:
            if not reading.up or reading.clock_event_reasons is None:
                continue
            base = labels_by_index[reading.identity.key]
            for reason, bit in cat.THROTTLE_REASON_BITS:
                active = 1.0 if reading.clock_event_reasons & bit else 0.0
                throttle.add(f'{base},reason="{reason}"', active)
        families.append(throttle)

    # gpu_up, gpu_info and the XIDs are the GPU's: a MIG instance is not a GPU (its
    # parent's series keep them), so counting GPUs by these series stays right
    gpus = [reading for reading in snapshot.gpus if not reading.identity.is_mig]
    up = _family(cat.GPU_UP)
    for reading in gpus:
        up.add(labels_by_index[reading.identity.key], 1.0 if reading.up and not stale else 0.0)
    families.append(up)

    info = _family(cat.GPU_INFO)
    driver = escape_label_value(snapshot.driver_version)
    cuda = escape_label_value(snapshot.cuda_driver_version)
    for reading in gpus:
        info.add(
            f'{labels_by_index[reading.identity.key]},driver_version="{driver}",'
            f'cuda_driver_version="{cuda}"',
            1.0,
        )
    families.append(info)

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
        families.extend(_xid_families(snapshot, xids, labels_by_index, stale))
    return families


def _xid_families(
    snapshot: GpuSnapshot,
    xids: XidView,
    labels_by_index: dict[tuple[int, int], str],
    stale: bool,
) -> list[Family]:
    last = _family(cat.XID_LAST)
    total = _family(cat.XID_TOTAL)
    when = _family(cat.XID_LAST_TIMESTAMP)
    for reading in snapshot.gpus:
        if reading.identity.is_mig:
            continue  # XIDs are the parent GPU's (NVML reports them on its handle)
        labels = labels_by_index[reading.identity.key]
        history = xids.by_uuid.get(reading.identity.uuid)
        if xids.watching and reading.up and not stale:
            code = history.last_xid if history else 0
            message = escape_label_value(cat.XID_MESSAGES.get(code, cat.XID_UNKNOWN_MESSAGE))
            last.add(f'{labels},err_code="{code}",err_msg="{message}"', float(code))
        if history is None:
            continue
        for code in sorted(history.counts):
            total.add(f'{labels},xid="{code}"', float(history.counts[code]))
        when.add(labels, history.last_seen)
    return [last, total, when]


class GpuExpositionCache:
    """Renders the GPU part of /metrics only when the snapshot, XIDs or staleness change."""

    def __init__(
        self, sampler: GpuSampler, ledger: XidLedger | None, node_label: str = cat.NODE_LABEL
    ) -> None:
        self._sampler = sampler
        self._ledger = ledger
        self._node_label = node_label
        self._key: tuple[int, int, bool] | None = None
        self._part = EMPTY_PART
        self.renders = 0

    def part(self) -> PrecompressedPart:
        status = self._sampler.status()
        snapshot = status.snapshot
        if snapshot is None:
            return EMPTY_PART
        version = self._ledger.version if self._ledger is not None else -1
        key = (snapshot.seq, version, status.stale)
        if key != self._key:
            xids = self._ledger.view() if self._ledger is not None else None
            families = gpu_families(snapshot, xids, status.stale, self._node_label)
            self._part = PrecompressedPart.of(render(families))
            self._key = key
            self.renders += 1
        return self._part
