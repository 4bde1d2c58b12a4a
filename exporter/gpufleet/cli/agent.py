"""``gpufleet agent`` (the per-node agent) and ``gpufleet nvml-record``."""

from __future__ import annotations

import argparse
import socket
import sys
from typing import TYPE_CHECKING

from gpufleet.agent.limits import ConnectionLimits, IngestLimits
from gpufleet.cli import kinds, resolve
from gpufleet.cli.options import Command, ConfigError, Option, env, log_level_option, variables

if TYPE_CHECKING:
    from gpufleet.agent.ledger_forward import ForwardSettings

# The CLI imports only the standard library: these restate agent/pod_resources.py's and
# gpu/attribution.py's (a test checks they agree).
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
GPU_ID_TYPES = ("uid", "device-name")
_INGEST = IngestLimits()
_CONNECTIONS = ConnectionLimits()


def _flag_default(value: float) -> str:
    """A limit's default as its flag takes it (900.0 as 900)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def resource_names(value: str) -> tuple[str, ...]:
    """A comma-separated list of extended resource names (``vendor/name``)."""
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    for name in names:
        if "/" not in name:
            raise ValueError(f"{name!r} is not an extended resource name like nvidia.com/a100")
    return names


# fmt: off
AGENT_OPTIONS = variables("GPUFLEET_", (
    Option("--listen", kinds.listen, "0.0.0.0:9405", "HOST:PORT to serve on"),
    Option("--gpu-source", kinds.choice("nvml", "synthetic", "none"), "nvml",
           "where GPU metrics come from: nvml (the driver), synthetic (demo data for 8 H100s) "
           "or none (training-metrics ingest only)"),
    Option("--gpu-interval", kinds.positive_seconds, "5", "seconds between NVML collection cycles"),
    Option("--node", kinds.text, None,
           "node name on every series (default: $NODE_NAME, else the hostname)"),
    Option("--node-label", kinds.label_name, "Hostname",
           "label naming the node on GPU series: Hostname as every released dcgm-exporter, "
           "or hostname as its main branch"),
    Option("--expected-gpus", kinds.positive_int, None,
           "GPUs this node should have; fewer seen is reported (default: as many as first seen)"),
    Option("--nvml-call-timeout", kinds.positive_seconds, None,
           "seconds after which an NVML call that has not returned counts as hung "
           "(default: the GPU interval, at least 5)"),
    Option("--gpu-stale-after", kinds.positive_seconds, None,
           "seconds after which a snapshot is too old to serve "
           "(default: 3 intervals, at least 15)"),
    Option("--ingest-token-file", kinds.text, None,
           "file holding the bearer token required to POST training events (a mounted Secret); "
           "the token may also come from $GPUFLEET_INGEST_TOKEN, never from a flag"),
    Option("--allow-unauthenticated-ingest", kinds.boolean, "false",
           "without a token, accept training events from beyond loopback too (by default only "
           "loopback clients may write when no token is set)", switch=True),
    Option("--ledger-url", kinds.text, None,
           "the fleet ledger (gpufleet fleet serve) to write the ranks' job attempt events to, "
           "e.g. http://gpufleet-fleet:9406 (default: none; the events are only counted)"),
    Option("--ledger-token-file", kinds.text, None,
           "file holding the ledger's write token (a mounted Secret); the token may also come "
           "from $GPUFLEET_LEDGER_TOKEN, never from a flag"),
    Option("--ledger-queue-size", kinds.positive_int, "1024",
           "attempt events held while the ledger is slow or down; beyond it they drop"),
    Option("--hpc-job-mapping-dir", kinds.text, None,
           "directory of Slurm job mapping files as dcgm-exporter reads them (one file per "
           "GPU index, or <index>.<GPU instance id> for MIG, one job id per line, written by "
           "a Slurm prolog/epilog): the GPU's series carry hpc_job (default: none)"),
    Option("--hpc-job-mapping-interval", kinds.positive_seconds, "5",
           "seconds between reads of the hpc-job-mapping directory"),
    Option("--kubernetes", kinds.boolean, "false",
           "name the pod holding each GPU: namespace, pod and container on its series, from "
           "the kubelet's pod-resources API, as dcgm-exporter's --kubernetes", switch=True),
    Option("--pod-resources-kubelet-socket", kinds.text, DEFAULT_SOCKET,
           "the kubelet's pod-resources socket (read with --kubernetes)"),
    Option("--kubernetes-gpu-id-type", kinds.choice(*GPU_ID_TYPES), "uid",
           "how the device plugin names GPUs: uid (GPU UUIDs, the NVIDIA device plugin's "
           "default) or device-name (nvidia0, ...); MIG devices are matched by MIG UUID"),
    Option("--nvidia-resource-names", resource_names, "",
           "comma-separated extended resource names that are GPUs besides nvidia.com/gpu "
           "and nvidia.com/mig-* (e.g. nvidia.com/a100)"),
    Option("--pod-resources-interval", kinds.positive_seconds, "10",
           "seconds between pod-resources List calls (in a thread, never on a scrape)"),
    Option("--pod-resources-timeout", kinds.positive_seconds, "5",
           "seconds a pod-resources List call may take"),
    Option("--job-ttl", kinds.ttl_seconds, _flag_default(_INGEST.job_ttl_s),
           "seconds after which a training job that stopped reporting is forgotten"),
    Option("--max-jobs", kinds.positive_int, _flag_default(_INGEST.max_jobs),
           "training jobs tracked at once"),
    Option("--max-stages", kinds.positive_int, _flag_default(_INGEST.max_stages),
           "(training_job, pp_stage) pairs tracked at once"),
    Option("--max-ranks-per-stage", kinds.positive_int, _flag_default(_INGEST.max_ranks_per_stage),
           "ranks tracked per (training_job, pp_stage)"),
    Option("--max-series", kinds.positive_int, _flag_default(_INGEST.max_series),
           "training and checkpoint series exported, in all"),
    Option("--max-batch-events", kinds.positive_int, _flag_default(_INGEST.max_batch_events),
           "events accepted in one POST"),
    Option("--max-body-bytes", kinds.positive_int, _flag_default(_INGEST.max_body_bytes),
           "largest ingest body accepted"),
    Option("--max-connections", kinds.positive_int, _flag_default(_CONNECTIONS.max_connections),
           "HTTP connections held open; beyond it the oldest idle one is closed"),
    Option("--max-connections-per-client", kinds.positive_int,
           _flag_default(_CONNECTIONS.max_connections_per_client),
           "HTTP connections one client address may hold"),
    log_level_option("GPUFLEET_LOG_LEVEL"),
))
# fmt: on


def node_name(explicit: str | None) -> str:
    """The node identity: --node / GPUFLEET_NODE, else NODE_NAME (downward API), else hostname."""
    return explicit or env("NODE_NAME") or socket.gethostname()


def ingest_token(token_file: str | None) -> str | None:
    """The agent's ingest token: from --ingest-token-file / GPUFLEET_INGEST_TOKEN_FILE, else
    GPUFLEET_INGEST_TOKEN. Never from a flag: a command line is visible in ``ps``."""
    from_env = env("GPUFLEET_INGEST_TOKEN")
    if token_file is None:
        return from_env.strip() if from_env else None
    if from_env:
        raise ConfigError(
            "both an ingest token file (--ingest-token-file / GPUFLEET_INGEST_TOKEN_FILE) and "
            "GPUFLEET_INGEST_TOKEN are set; keep one"
        )
    return resolve.read_secret("--ingest-token-file", token_file)


def ledger_settings(values: argparse.Namespace) -> ForwardSettings | None:
    """Where the agent writes job attempt events: --ledger-url with its token (from
    --ledger-token-file / GPUFLEET_LEDGER_TOKEN_FILE, else GPUFLEET_LEDGER_TOKEN)."""
    from gpufleet.agent.ledger_forward import ForwardSettings

    from_env = env("GPUFLEET_LEDGER_TOKEN")
    if values.ledger_token_file is not None and from_env:
        raise ConfigError(
            "both a ledger token file (--ledger-token-file / GPUFLEET_LEDGER_TOKEN_FILE) and "
            "GPUFLEET_LEDGER_TOKEN are set; keep one"
        )
    if values.ledger_token_file is not None:
        token: str | None = resolve.read_secret("--ledger-token-file", values.ledger_token_file)
    else:
        token = from_env.strip() if from_env else None
    url = values.ledger_url
    if url is None:
        if token:
            raise ConfigError("a ledger token is set but no --ledger-url (GPUFLEET_LEDGER_URL)")
        return None
    if not url.startswith(("http://", "https://")):
        raise ConfigError(
            f"--ledger-url (GPUFLEET_LEDGER_URL) {url!r} is not an http:// or https:// URL"
        )
    return ForwardSettings(url, token, queue_size=values.ledger_queue_size)


def run_agent(values: argparse.Namespace) -> int:
    from gpufleet.agent.app import AgentSettings
    from gpufleet.agent.startup import start_agent

    resolve.configure_logging(values.log_level)
    if values.kubernetes:
        try:
            import grpc  # noqa: F401
        except ImportError:
            raise ConfigError(
                "--kubernetes (GPUFLEET_KUBERNETES) needs grpcio: pip install 'gpufleet[agent]'"
            ) from None
    host, port = values.listen
    agent = resolve.settings(
        AgentSettings,
        values,
        node=node_name(values.node),
        host=host,
        port=port,
        stale_after=values.gpu_stale_after,
        ingest_token=ingest_token(values.ingest_token_file),
        limits=resolve.settings(IngestLimits, values, job_ttl_s=values.job_ttl),
        connections=resolve.settings(ConnectionLimits, values),
        ledger=ledger_settings(values),
    )
    return start_agent(agent, values.log_level)


def run_nvml_record(values: argparse.Namespace) -> int:
    from gpufleet.gpu.nvml_call import NvmlUnavailable
    from gpufleet.gpu.record import record_fixture

    try:
        print(record_fixture(node_name(values.node), values.out, values.metrics_out))
    except NvmlUnavailable as error:
        print(f"gpufleet nvml-record: {error}", file=sys.stderr)
        return 1
    return 0


AGENT = Command(
    "agent",
    run_agent,
    AGENT_OPTIONS,
    help="run the per-node agent (GPU metrics and training-metrics ingest)",
    description="Serve DCGM-compatible GPU metrics and the training-metrics ingest API.",
    extra="agent",
    service=True,
)
NVML_RECORD = Command(
    "nvml-record",
    run_nvml_record,
    (
        Option("--out", kinds.text, None, "fixture JSON to write", required=True),
        Option("--metrics-out", kinds.text, None, "also write the GPU part of /metrics here"),
        Option("--node", kinds.text, None, "node name for the labels (default: hostname)"),
    ),
    help="record this machine's NVML answers as a test fixture",
    description="Run one collection through real NVML and save every answer as a fixture "
    "that the tests' fake NVML replays.",
    extra="agent",
)
