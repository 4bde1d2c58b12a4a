"""Public client API for training code: ``from gpufleet.client import Reporter``.

See :mod:`gpufleet.reporter.reporter` for the details. Adapters:
``gpufleet.reporter.lightning.GpuFleetCallback`` (PyTorch Lightning) and
``gpufleet.reporter.huggingface.GpuFleetTrainerCallback`` (Hugging Face Trainer).
"""

from gpufleet.reporter.identity import (
    attempt_from_environment,
    job_from_environment,
    rank_from_environment,
)
from gpufleet.reporter.pod import pod_from_environment
from gpufleet.reporter.reporter import Reporter
from gpufleet.reporter.timers import CheckpointTimer, StepTimer

__all__ = [
    "CheckpointTimer",
    "Reporter",
    "StepTimer",
    "attempt_from_environment",
    "job_from_environment",
    "pod_from_environment",
    "rank_from_environment",
]
