"""The agent: owns the GPU sampler, the XID watcher and the registry; serves HTTP."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CollectorRegistry

from gpufleet import __version__
from gpufleet.agent.connections import ConnectionGuard, protocol_for
from gpufleet.agent.hpc_jobs import HpcJobMapping
from gpufleet.agent.ledger_forward import AttemptRelay, ForwardSettings, LedgerForwarder
from gpufleet.agent.limits import ConnectionLimits, IngestLimits
from gpufleet.agent.metrics_endpoint import AsgiScope, MetricsEndpoint, Receive, Send
from gpufleet.agent.pod_resources import DEFAULT_SOCKET, PodResourcesRefresher
from gpufleet.agent.selfmetrics import AgentSelfCollector, ScrapeStats
from gpufleet.agent.training_aggregate import TrainingAggregator
from gpufleet.agent.training_ingest import IngestApi
from gpufleet.agent.training_pods import PodLabelledTraining, TrainingPods
from gpufleet.gpu.attribution import Attribution, GpuIdType
from gpufleet.gpu.nvml_call import CallErrors, NvmlApi
from gpufleet.gpu.reader import NvmlReader
from gpufleet.gpu.render import GpuExpositionCache
from gpufleet.gpu.sampler import GpuSampler
from gpufleet.gpu.xid import XidLedger, XidWatcher

log = logging.getLogger(__name__)

GpuSource = Literal["nvml", "synthetic", "none"]
DEFAULT_PORT = 9405  # dcgm-exporter owns 9400; the agent runs beside it


@dataclass(frozen=True, slots=True)
class AgentSettings:
    node: str
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    gpu_source: GpuSource = "nvml"
    gpu_interval: float = 5.0
    expected_gpus: int | None = None
    stale_after: float | None = None
    nvml_call_timeout: float | None = None
    ingest_token: str | None = None
    # Without a token, only loopback clients may write unless this is set (explicitly).
    allow_unauthenticated_ingest: bool = False
    limits: IngestLimits = field(default_factory=IngestLimits)
    node_label: str = "Hostname"  # dcgm-exporter's: Hostname (releases) or hostname (main)
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    # Where the ranks' job attempt events go (None: counted as unforwarded, not sent).
    ledger: ForwardSettings | None = None
    # dcgm-exporter's Slurm job mapping directory (None: no hpc_job labels).
    hpc_job_mapping_dir: str | None = None
    hpc_job_mapping_interval: float = 5.0
    # Pod attribution from the kubelet's pod-resources API (dcgm-exporter's --kubernetes).
    kubernetes: bool = False
    pod_resources_kubelet_socket: str = DEFAULT_SOCKET
    kubernetes_gpu_id_type: GpuIdType = "uid"
    nvidia_resource_names: tuple[str, ...] = ()
    pod_resources_interval: float = 10.0
    pod_resources_timeout: float = 5.0


class Agent:
    """Everything one node runs. ``open()`` may raise NvmlUnavailable; nothing else does."""

    def __init__(
        self,
        settings: AgentSettings,
        nvml: NvmlApi | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._nvml_override = nvml
        self.errors = CallErrors()
        self.registry = CollectorRegistry(auto_describe=False)
        self.scrapes = ScrapeStats()
        self.reader: NvmlReader | None = None
        self.sampler: GpuSampler | None = None
        self.xids: XidLedger | None = None
        self._watcher: XidWatcher | None = None
        self._cache: GpuExpositionCache | None = None
        self._started = False
        self.training = TrainingAggregator(settings.node, settings.limits, clock)
        self.training_pods = TrainingPods(settings.limits.job_ttl_s, clock=clock)
        self.connections = ConnectionGuard(settings.connections)
        forwarder = LedgerForwarder(settings.ledger) if settings.ledger is not None else None
        self.attempts = AttemptRelay(forwarder)
        self.hpc_jobs = (
            HpcJobMapping(settings.hpc_job_mapping_dir, settings.hpc_job_mapping_interval)
            if settings.hpc_job_mapping_dir
            else None
        )
        self.pod_resources = (
            PodResourcesRefresher(
                settings.pod_resources_kubelet_socket,
                gpu_id_type=settings.kubernetes_gpu_id_type,
                resource_names=settings.nvidia_resource_names,
                interval=settings.pod_resources_interval,
                timeout=settings.pod_resources_timeout,
            )
            if settings.kubernetes
            else None
        )

    def attribution(self) -> Attribution:
        """Who holds the GPUs now: the pods the kubelet allocated them to (each as last
        read by its thread) and their training jobs, the Slurm jobs mapped to them."""
        jobs_version, jobs = self.hpc_jobs.current() if self.hpc_jobs is not None else (0, {})
        pods_version, pods = (
            self.pod_resources.current() if self.pod_resources is not None else (0, None)
        )
        training_version, training = self.training_pods.current()
        return Attribution(
            pods=pods,
            jobs=jobs,
            training_jobs=training,
            version=(pods_version, jobs_version, training_version),
        )

    def _nvml(self) -> NvmlApi:
        if self._nvml_override is not None:
            return self._nvml_override
        if self.settings.gpu_source == "synthetic":
            from gpufleet.gpu.synthetic import SyntheticNvml

            return SyntheticNvml(gpus=self.settings.expected_gpus or 8)
        import pynvml

        return pynvml

    def open(self) -> None:
        settings = self.settings
        if settings.gpu_source != "none":
            nvml = self._nvml()
            reader = NvmlReader(nvml, settings.node, settings.expected_gpus, self.errors)
            reader.open()
            self.reader = reader
            self.sampler = GpuSampler(
                reader,
                interval=settings.gpu_interval,
                stale_after=settings.stale_after,
                call_timeout=settings.nvml_call_timeout,
            )
            self.xids = XidLedger()
            self._watcher = XidWatcher(nvml, reader.handles, self.xids, self.errors)
            self._cache = GpuExpositionCache(
                self.sampler, self.xids, settings.node_label, self.attribution
            )
        # the training series, with the namespace and pod their clients name
        self.registry.register(PodLabelledTraining(self.training, self.training_pods))
        self.registry.register(
            AgentSelfCollector(
                settings.node,
                settings.gpu_source,
                self.errors,
                self.sampler,
                self.scrapes,
                connections=self.connections,
                attempts=self.attempts.counts,
                pod_resources=self.pod_resources,
            )
        )

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        if self.sampler is not None:
            self.sampler.start()
        if self._watcher is not None:
            self._watcher.start()
        if self.attempts.forwarder is not None:
            self.attempts.forwarder.start()
        if self.hpc_jobs is not None:
            self.hpc_jobs.start()
        if self.pod_resources is not None:
            self.pod_resources.start()
        log.info(
            "gpufleet agent %s on node %s, GPU source %s",
            __version__,
            self.settings.node,
            self.settings.gpu_source,
        )

    def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        if self.hpc_jobs is not None:
            self.hpc_jobs.stop()
        if self.pod_resources is not None:
            self.pod_resources.stop()
        if self.attempts.forwarder is not None:
            self.attempts.forwarder.stop()
        if self._watcher is not None:
            self._watcher.stop()
        if self.sampler is not None:
            self.sampler.stop()
        if self.reader is not None:
            self.reader.close()

    @property
    def ready(self) -> bool:
        return self.sampler is None or self.sampler.snapshot is not None

    def metrics_endpoint(self) -> MetricsEndpoint:
        cached = self._cache.part if self._cache is not None else None
        return MetricsEndpoint(self.registry, self.scrapes, cached)

    def api(self) -> FastAPI:
        agent = self

        @asynccontextmanager
        async def lifespan(_: FastAPI) -> AsyncIterator[None]:
            agent.start()
            try:
                yield
            finally:
                agent.stop()

        api = FastAPI(
            title="gpufleet agent",
            version=__version__,
            lifespan=lifespan,
            docs_url="/docs",
            redoc_url=None,
        )

        ingest = IngestApi(
            agent.training,
            agent.settings.ingest_token,
            allow_unauthenticated=agent.settings.allow_unauthenticated_ingest,
            attempts=agent.attempts,
            pods=agent.training_pods,
        )
        api.include_router(ingest.router())

        @api.get("/", response_class=PlainTextResponse, include_in_schema=False)
        def index() -> str:
            return (
                f"gpufleet agent {__version__} on node {agent.settings.node}\n"
                "/metrics   Prometheus metrics (DCGM-compatible GPU series, gpufleet_*)\n"
                "/healthz   liveness\n"
                "/readyz    readiness (first GPU snapshot taken)\n"
                "/v1/steps, /v1/checkpoints   training-metrics ingest (POST; see /docs)\n"
                "/v1/attempts   job attempt events, relayed to the fleet ledger (POST)\n"
            )

        @api.get("/healthz")
        async def healthz() -> dict[str, str]:  # async: answered on the loop, no thread wait
            return {"status": "ok"}

        @api.get("/readyz", response_model=None)
        def readyz() -> dict[str, str] | JSONResponse:
            if agent.ready:
                return {"status": "ready"}
            return JSONResponse({"status": "waiting for the first GPU snapshot"}, status_code=503)

        return api

    def asgi(self) -> AgentAsgi:
        return AgentAsgi(self.metrics_endpoint(), self.api())


class AgentAsgi:
    """Routes /metrics straight to the raw endpoint, everything else to FastAPI."""

    def __init__(self, metrics: MetricsEndpoint, api: FastAPI) -> None:
        self.metrics = metrics
        self.api = api

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/metrics":
            await self.metrics(scope, receive, send)
            return
        await self.api(scope, receive, send)


def agent_server_config(agent: Agent, log_level: str = "info") -> Any:
    """The uvicorn configuration of the agent: its app under its connection limits."""
    import uvicorn

    settings = agent.settings
    return uvicorn.Config(
        agent.asgi(),
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        access_log=False,
        http=protocol_for(agent.connections),
        loop="asyncio",
        lifespan="on",
        timeout_keep_alive=int(settings.connections.keep_alive_s),
        timeout_graceful_shutdown=5,
        # The client address decides whether a write without a token is allowed: it must be
        # the TCP peer, never what an X-Forwarded-For header claims.
        proxy_headers=False,
    )


def serve_agent(agent: Agent, log_level: str = "info") -> None:
    """Run the agent's server until SIGINT/SIGTERM."""
    import resource

    import uvicorn

    descriptors, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = agent.settings.connections.max_connections + 64  # + NVML, logs, the listener
    if descriptors != resource.RLIM_INFINITY and descriptors < wanted:
        log.warning(
            "ulimit -n is %d, below --max-connections %d plus the agent's own files; raise it, "
            "or a connection flood can exhaust descriptors before the cap cuts in",
            descriptors,
            agent.settings.connections.max_connections,
        )
    uvicorn.Server(agent_server_config(agent, log_level)).run()
