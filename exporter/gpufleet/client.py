"""Public client API for training code: ``from gpufleet.client import Reporter``.

See :mod:`gpufleet.training.client` for the details. Adapters:
``gpufleet.training.lightning.GpuFleetCallback`` (PyTorch Lightning) and
``gpufleet.training.huggingface.GpuFleetTrainerCallback`` (Hugging Face Trainer).
"""

from gpufleet.training.client import (
    CheckpointTimer,
    Reporter,
    StepTimer,
    job_from_environment,
    rank_from_environment,
)

__all__ = [
    "CheckpointTimer",
    "Reporter",
    "StepTimer",
    "job_from_environment",
    "rank_from_environment",
]
