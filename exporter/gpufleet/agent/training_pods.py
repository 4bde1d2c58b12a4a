"""Which training job runs in which pod, as the training clients on this node say.

A client that knows its pod (the downward API; ``gpufleet/reporter/pod.py``) sends it
with each request in two headers. The agent keeps (namespace, pod) -> training_job for
as long as the job keeps reporting (the ingest's job TTL), so that
``gpufleet_gpu_allocation_info`` can name the training job on a pod's GPUs, and the
job's training series carry ``namespace`` and ``pod`` (:class:`PodLabelledTraining`).
Bounded: at most ``max_pods`` pods, the least recently heard from dropped first.

A job's series on a node are per stage, not per rank, so they can name one pod only
when one pod runs the job here: with several (single-GPU pods, say) its series carry
the namespace they share and no ``pod``, rather than one pod picked among them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpufleet.reporter.pod import NAMESPACE_HEADER, NAMESPACE_NAME, POD_HEADER, POD_NAME

MAX_PODS = 256  # a node runs a few dozen pods at most


class TrainingPods:
    """Thread-safe; ``note`` runs on the ingest path, ``current`` on renders."""

    def __init__(
        self,
        ttl_s: float = 900.0,
        max_pods: int = MAX_PODS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._ttl_s = ttl_s
        self._max_pods = max_pods
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[tuple[str, str], tuple[str, float]] = {}  # -> (job, last heard)
        self._view: Mapping[tuple[str, str], str] = MappingProxyType({})
        self.version = 0

    def note(self, headers: Mapping[str, str], events: Iterable[object]) -> None:
        """The pod in the request's headers runs the events' training job (the last
        one named, in the rare batch that names several)."""
        namespace = headers.get(NAMESPACE_HEADER)
        pod = headers.get(POD_HEADER)
        if not namespace or not pod:
            return
        if not NAMESPACE_NAME.match(namespace) or not POD_NAME.match(pod):
            return
        job = None
        for event in events:
            job = getattr(event, "training_job", None) or job
        if not isinstance(job, str):
            return
        now = self._clock()
        with self._lock:
            key = (namespace, pod)
            known = self._jobs.pop(key, None)
            self._jobs[key] = (job, now)  # re-inserted: the most recent last
            if len(self._jobs) > self._max_pods:
                del self._jobs[next(iter(self._jobs))]
                self._changed()
            elif known is None or known[0] != job:
                self._changed()

    def current(self) -> tuple[int, Mapping[tuple[str, str], str]]:
        """(version, (namespace, pod) -> training_job) of the pods heard within the TTL."""
        now = self._clock()
        with self._lock:
            expired = [key for key, (_, heard) in self._jobs.items() if now - heard > self._ttl_s]
            for key in expired:
                del self._jobs[key]
            if expired:
                self._changed()
            return self.version, self._view

    def _changed(self) -> None:
        self._view = MappingProxyType({key: job for key, (job, _) in self._jobs.items()})
        self.version += 1

    def labels_by_job(self) -> dict[str, tuple[tuple[str, str], ...]]:
        """training_job -> the pod labels its series carry: the namespace its pods share,
        and the pod when one pod runs it here."""
        _, pods = self.current()
        by_job: dict[str, set[tuple[str, str]]] = {}
        for key, job in pods.items():
            by_job.setdefault(job, set()).add(key)
        labels: dict[str, tuple[tuple[str, str], ...]] = {}
        for job, keys in by_job.items():
            namespaces = {namespace for namespace, _ in keys}
            if len(namespaces) != 1:
                continue  # one job in two namespaces: say neither
            (namespace,) = namespaces
            if len(keys) == 1:
                ((_, pod),) = keys
                labels[job] = (("namespace", namespace), ("pod", pod))
            else:
                labels[job] = (("namespace", namespace),)
        return labels


class PodLabelledTraining(Collector):
    """A training collector's families, each series of a job whose pod is known carrying
    ``namespace`` (and ``pod``); the rest unchanged."""

    def __init__(self, training: Collector, pods: TrainingPods) -> None:
        self._training = training
        self._pods = pods

    def collect(self) -> Iterator[Metric]:
        labels = self._pods.labels_by_job()
        for metric in self._training.collect():
            if labels:
                metric.samples = [
                    sample._replace(labels={**sample.labels, **dict(extra)})
                    if (extra := labels.get(sample.labels.get("training_job", "")))
                    else sample
                    for sample in metric.samples
                ]
            yield metric
