"""Label values a client may set, one rule each for every service that accepts them.

A training job id becomes the ``training_job`` label on the agent's series and the
ledger's; both refuse the same values, so a job the agent accepts is never one the
ledger turns away (job ids from TorchElastic, Slurm, Kubernetes, MLflow...).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import StringConstraints

TrainingJob = Annotated[
    str,
    StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@/+=-]*$"),
]
