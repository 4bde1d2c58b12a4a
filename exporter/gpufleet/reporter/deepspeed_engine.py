"""A rank's own work apart from its wait for peers, under DeepSpeed (ZeRO stages 0-3).

DeepSpeed reduces gradients in ``engine.backward()`` (all-reduce at stage 0, bucketed
reductions at stages 1-2) and, at stage 3, all-gathers parameters inside ``forward()``
and reduce-scatters gradients inside ``backward()``: a healthy rank waits for a slow
one inside calls no user timer can split. Every one of those collectives goes through
DeepSpeed's communication layer, ``deepspeed.comm``, whose backend object (``cdb``, a
``TorchBackend`` over ``torch.distributed``) runs it. ``watch(engine)`` wraps that
backend's collectives on the instance, each call timed as for FSDP2
(``gpufleet.reporter.spans.CollectiveSpans``: wall clock on CPU, where the calls block
or complete through a future; CUDA events on the current stream on a GPU).

Alternatives looked at: DeepSpeed's own comms logger (``comms_logger`` in its config)
times the same calls, but synchronises the device after every collective (and under
MPI adds a barrier), which changes the job it measures; a communication hook does not
exist in DeepSpeed's engine. Point-to-point sends and receives (pipeline engines) are
not timed: a ``PipelineEngine`` is refused, as before.

The backend is DeepSpeed's internal object (``deepspeed.comm.comm.cdb``); where a
version has none, ``watch`` logs it and times nothing.
"""

from __future__ import annotations

import functools
import logging
import sys

import torch

from gpufleet.reporter.spans import CollectiveSpans

log = logging.getLogger("gpufleet.client")

# the backend's collectives that carry a step's gradients or parameters
TIMED = (
    "all_reduce",
    "all_reduce_coalesced",
    "inference_all_reduce",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_coalesced",
    "broadcast",
)


def engine_class(name: str) -> type | None:
    """DeepSpeed's ``name`` engine class, if the job imported DeepSpeed (never imported
    here: a job without DeepSpeed pays nothing)."""
    module = sys.modules.get(
        "deepspeed.runtime.pipe.engine" if name == "PipelineEngine" else "deepspeed.runtime.engine"
    )
    found = getattr(module, name, None)
    return found if isinstance(found, type) else None


def is_deepspeed_engine(model: object) -> bool:
    engine = engine_class("DeepSpeedEngine")
    return engine is not None and isinstance(model, engine)


def watch_deepspeed(engine: object) -> CollectiveSpans | None:
    """Time the collectives DeepSpeed runs for ``engine``'s job; None where they cannot
    be (a pipeline engine, or no communication backend found)."""
    pipeline = engine_class("PipelineEngine")
    if pipeline is not None and isinstance(engine, pipeline):
        log.warning(
            "gpufleet: watch() does not time DeepSpeed's pipeline engine (its stages wait "
            "on each other's activations, not only on collectives), so its steps report "
            "step time only"
        )
        return None
    comm = sys.modules.get("deepspeed.comm.comm")
    backend = getattr(comm, "cdb", None)
    if backend is None:
        log.warning(
            "gpufleet: no DeepSpeed communication backend (deepspeed.comm's cdb) to time: "
            "call watch() after deepspeed.initialize(); steps report step time only"
        )
        return None
    spans = getattr(backend, "_gpufleet_spans", None)
    if isinstance(spans, CollectiveSpans):  # watched before: timed once
        return spans
    device = getattr(engine, "device", None)
    spans = CollectiveSpans(cuda=isinstance(device, torch.device) and device.type == "cuda")
    for name in TIMED:
        inner = getattr(backend, name, None)
        if callable(inner):
            setattr(backend, name, functools.partial(spans.timed, inner))
    backend._gpufleet_spans = spans
    return spans
