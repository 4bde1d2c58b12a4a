"""A model made data-parallel the way each framework's users do it, with its training
step: one definition for the lab's jobs (``ddp_worker``), the timing tests and the
benchmarks (``bench/real_pytorch.py``, ``bench/cuda_timing.py``). Imports torch (and
DeepSpeed only for ``deepspeed``); the process group must exist."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch

Kind = Literal["ddp", "fsdp", "deepspeed"]
Step = Callable[[Any], None]  # backward and optimizer step, given the loss


def shard_layers(model: torch.nn.Module, mesh: Any = None) -> torch.nn.Module:
    """FSDP2 units: each linear layer (as a transformer's blocks would be), then the
    whole model; returns it."""
    from torch.distributed.fsdp import fully_shard

    for layer in list(model.modules()):
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def deepspeed_config(micro_batch: int) -> dict[str, Any]:
    """ZeRO stage 2 (gradients reduced in buckets, parameters gathered after the
    optimizer step), with the job's own torch optimizer."""
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,
    }


def data_parallel(
    kind: Kind | str, model: torch.nn.Module, *, lr: float = 1e-3, micro_batch: int = 8, **ddp: Any
) -> tuple[Any, Step]:
    """(the data-parallel model, its step) for ``kind``: DDP (``ddp`` passed on to it),
    FSDP2 (``shard_layers``) or a DeepSpeed engine over SGD (DeepSpeed reads
    ``LOCAL_RANK``, which torchrun sets)."""
    if kind == "deepspeed":
        import deepspeed

        engine, *_ = deepspeed.initialize(
            model=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=lr),
            config=deepspeed_config(micro_batch),
        )

        def engine_step(loss: Any) -> None:
            engine.backward(loss)
            engine.step()

        return engine, engine_step
    if kind == "ddp":
        wrapped: Any = torch.nn.parallel.DistributedDataParallel(model, **ddp)
    elif kind == "fsdp":
        wrapped = shard_layers(model)
    else:
        raise ValueError(f"no data-parallel kind {kind!r}")
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=lr)

    def step(loss: Any) -> None:
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    return wrapped, step
