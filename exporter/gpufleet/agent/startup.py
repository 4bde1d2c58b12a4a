"""Starting the node agent: open its GPU source, say how ingest is protected, serve."""

from __future__ import annotations

import logging
import sys

from gpufleet.agent.app import Agent, AgentSettings, serve_agent
from gpufleet.gpu.nvml_call import NvmlUnavailable

log = logging.getLogger("gpufleet.agent")


def start_agent(settings: AgentSettings, log_level: str) -> int:
    """Serve until SIGINT/SIGTERM; 1, with one line on stderr, when NVML is missing."""
    agent = Agent(settings)
    try:
        agent.open()
    except NvmlUnavailable as error:
        print(
            f"gpufleet agent: {error}. On a machine without NVIDIA GPUs use "
            "--gpu-source none (training-metrics ingest only) or --gpu-source synthetic (demo).",
            file=sys.stderr,
        )
        return 1
    if settings.ingest_token is None and settings.allow_unauthenticated_ingest:
        log.warning(
            "the ingest API on %s:%d accepts training events from anyone who can reach it "
            "(--allow-unauthenticated-ingest)",
            settings.host,
            settings.port,
        )
    elif settings.ingest_token is None:
        log.info(
            "no ingest token: training events are accepted from loopback only; set "
            "--ingest-token-file (or GPUFLEET_INGEST_TOKEN) for clients beyond it"
        )
    serve_agent(agent, log_level)
    return 0
