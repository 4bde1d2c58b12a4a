"""Who this rank is, from the launcher's environment: its job, rank and attempt, and the
agent's token. Standard library only."""

from __future__ import annotations

import logging
import os
import re
import socket

log = logging.getLogger("gpufleet.client")

DEFAULT_AGENT_URL = "http://127.0.0.1:9405"
JOB_VARIABLES = (
    "GPUFLEET_TRAINING_JOB",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "PBS_JOBID",
    "LSB_JOBID",
    "JOB_ID",
)
RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
ATTEMPT_VARIABLES = ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9._:@/+=-]")


def job_from_environment() -> str:
    """The training job id: GPUFLEET_TRAINING_JOB, else the launcher's (TorchElastic, Slurm...)."""
    for name in JOB_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value and value.lower() != "none":
            return safe_label(value)
    return safe_label(f"local-{socket.gethostname()}")


def rank_from_environment() -> int:
    """The global rank: RANK (torchrun), else SLURM_PROCID, OMPI / PMI variables, else 0."""
    for name in RANK_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def attempt_from_environment() -> int:
    """The launcher's restart count: TORCHELASTIC_RESTART_COUNT (torchrun), else
    SLURM_RESTART_COUNT, else 0 (the first launch)."""
    for name in ATTEMPT_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def safe_label(value: str) -> str:
    """Make a value acceptable as a training_job label (what the agent accepts)."""
    cleaned = _LABEL_UNSAFE.sub("_", value)[:128]
    if not cleaned or not cleaned[0].isalnum():
        cleaned = ("j" + cleaned)[:128]
    return cleaned


def token_from_environment() -> str | None:
    token = os.environ.get("GPUFLEET_INGEST_TOKEN", "").strip()
    if token:
        return token
    path = os.environ.get("GPUFLEET_INGEST_TOKEN_FILE", "").strip()
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as file:
            return file.read().strip() or None
    except OSError as error:
        log.warning("gpufleet client: cannot read GPUFLEET_INGEST_TOKEN_FILE %r: %s", path, error)
        return None
