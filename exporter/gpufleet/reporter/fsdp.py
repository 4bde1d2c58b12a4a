"""A rank's own work apart from its wait for peers, in PyTorch's FSDP2 (``fully_shard``).

FSDP keeps each unit's parameters sharded: before a unit's forward (and its backward,
where they were freed) the rank all-gathers them, and after its backward it
reduce-scatters the gradients. A rank that reaches a collective before a slow peer waits
in it, inside ``forward()`` and ``backward()``, where no timer the user places can tell
the wait from the work. The time each collective took, peers' lateness included, is
what tells them apart: long on the healthy ranks, short on the slow one, which arrives
last and finds its peers already there.

The mechanism is FSDP2's own extension point for collectives,
``FSDPModule.set_custom_all_gather`` / ``set_custom_reduce_scatter`` (public API): a
wrapper around the collective the unit would run anyway (FSDP's default, or one the
job set before ``watch``) that notes each call's span. Buffers, groups and results are
the inner collective's, unchanged.

- CPU (gloo): FSDP calls both collectives synchronously on the training thread (its
  default ``unshard_async_op=False``; reduce-scatter always), so each call's wall-clock
  time is the exposed wait. A prefetched all-gather issued asynchronously returns a
  ``Work``; its span runs from the call to the work's completion.
- CUDA: FSDP issues the collectives on its all-gather / reduce-scatter streams; two
  CUDA events are recorded on that stream around the call and read when the GPU has
  passed them (``Event.query()``, never ``synchronize()``). Where FSDP prefetches, part
  of that span overlaps compute; the slow rank's spans are still the shortest, which is
  what the rules compare. This path has not run on a GPU in gpufleet's tests.

Not timed: FSDP1 (``FullyShardedDataParallel``: its communication hook replaces only the
gradient reduction, and it needs an accelerator even with gloo), units with several
parameter groups (FSDP refuses a custom collective there), DeepSpeed engines.

Importing this module imports torch; ``collectives.watch_model`` imports it only for an
FSDP2 model.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from gpufleet.reporter.spans import CollectiveSpans

log = logging.getLogger("gpufleet.client")


class _TimedComm:
    """What FSDP2's collective interfaces (``torch.distributed.fsdp``'s ``AllGather`` and
    ``ReduceScatter``) share: buffers come from the unit's own collective."""

    def __init__(self, inner: Any, spans: CollectiveSpans) -> None:
        self.inner = inner
        self.spans = spans

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.inner.allocate(size, dtype=dtype, device=device)


class TimedAllGather(_TimedComm):
    """The unit's own all-gather, its span noted."""

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        async_op: bool = False,
    ) -> Any:
        return self.spans.timed(self.inner, output_tensor, input_tensor, group, async_op)


class TimedReduceScatter(_TimedComm):
    """The unit's own reduce-scatter, its span noted."""

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> Any:
        return self.spans.timed(self.inner, output_tensor, input_tensor, group, op, async_op)


def fsdp_units(model: object) -> list[FSDPModule]:
    """The ``fully_shard`` units in ``model`` (itself included)."""
    if not isinstance(model, torch.nn.Module):
        return []
    return [module for module in model.modules() if isinstance(module, FSDPModule)]


def _current_comms(unit: FSDPModule) -> tuple[Any, Any]:
    """The all-gather and reduce-scatter ``unit`` runs now: FSDP's defaults, or the job's
    own. FSDP has setters for them and no getters; read from its parameter group."""
    groups = unit._get_fsdp_state()._fsdp_param_groups
    if len(groups) != 1:
        raise ValueError(f"{len(groups)} parameter groups")
    return groups[0]._all_gather_comm, groups[0]._reduce_scatter_comm


def watch_fsdp(model: object) -> CollectiveSpans | None:
    """Time the collectives of every FSDP2 unit in ``model``; None where it has none or
    they cannot be timed (FSDP changed its internals, or a unit has several parameter
    groups: nothing is wrapped then)."""
    units = fsdp_units(model)
    if not units:
        return None
    try:
        # units without parameters of their own (a root over sharded children) run no
        # collective and have no parameter group
        comms = [(unit, _current_comms(unit)) for unit in units if _has_params(unit)]
    except (AttributeError, IndexError, ValueError) as error:
        log.warning(
            "gpufleet: cannot time this FSDP model's collectives (%s), so its steps report "
            "step time only: time comm() yourself to localise a slow rank",
            error,
        )
        return None
    for _, (gather, _) in comms:
        if isinstance(gather, TimedAllGather):  # watched before: timed once
            return gather.spans
    device = next(iter(model.parameters()), torch.empty(0)).device  # type: ignore[attr-defined]
    spans = CollectiveSpans(cuda=device.type == "cuda")
    for unit, (gather, scatter) in comms:
        unit.set_custom_all_gather(TimedAllGather(gather, spans))
        unit.set_custom_reduce_scatter(TimedReduceScatter(scatter, spans))
    return spans


def _has_params(unit: FSDPModule) -> bool:
    return bool(unit._get_fsdp_state()._fsdp_param_groups)
