"""This rank's place in the job's parallel layout: which tensor-, pipeline-, data-,
context- and expert-parallel groups it is in, found where the framework keeps them.

What each rank reports is local knowledge only: for each group, its kind (``tp``,
``pp``, ``dp``, ``cp``, ``ep`` or a DeviceMesh dimension's own name), its size, this
rank's position in it and the group's lowest global rank, which names the group the
same way on every rank. The node each rank runs on is its agent's; Prometheus counts
the nodes (and NVLink domains) each group spans from every agent's series
(``alerts/layout.rules.yaml``). So no collective is ever run for it: a monitor that
called one could hang the job it watches, and one all-gather per attempt would tell
nothing that the agents' node labels do not.

Where the layout comes from, first found wins:

1. ``Reporter.describe_layout(mesh)``: a ``torch.distributed`` DeviceMesh given by hand.
2. Megatron-Core's ``parallel_state``, when the job imported it and initialised it.
3. DeepSpeed's pipeline grid (``PipelineParallelGrid``, made by its PipelineEngine): its
   slice (tensor-parallel), pipe and data groups.
4. A DeviceMesh the job made (``init_device_mesh``): the one with named dimensions that
   holds this rank, the largest if several.
   3 and 4 are found once by one walk over the objects the collector tracks, as
   ``collectives.data_parallel_wrapper`` finds a DDP wrapper.
5. Sizes given as ``Reporter(tp_size=..., pp_size=..., cp_size=..., dp_size=...)`` or
   ``GPUFLEET_TP_SIZE`` / ``GPUFLEET_PP_SIZE`` / ``GPUFLEET_CP_SIZE`` /
   ``GPUFLEET_DP_SIZE``, ranks ordered as Megatron-Core orders them by default
   (``tp-cp-ep-dp-pp``: tensor-parallel ranks adjacent, pipeline stages furthest apart).

The NVLink domain of the rank's node, where the site names it (NVL72-class racks, where
tensor parallelism across hosts inside one domain is intended), comes from
``GPUFLEET_NVLINK_DOMAIN`` (e.g. the ``nvidia.com/gpu.clique`` value GPU Feature
Discovery gives the node: NVML's fabric cluster UUID and clique id).

Standard library only at import; torch is only touched when the job imported it.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import re
import sys
from collections.abc import Mapping
from typing import Any, NamedTuple

from gpufleet.reporter.wire import GROUP_NAME_PATTERN, MAX_GROUPS

log = logging.getLogger("gpufleet.client")

GROUP_NAME = re.compile(GROUP_NAME_PATTERN)
# Sizes by hand, in Megatron-Core's default order (fastest-varying first); expert
# parallelism shares the data-parallel ranks there, so it has no place of its own.
SIZE_ORDER = ("tp", "cp", "dp", "pp")
SIZE_VARIABLES = {kind: f"GPUFLEET_{kind.upper()}_SIZE" for kind in SIZE_ORDER}
DOMAIN_VARIABLE = "GPUFLEET_NVLINK_DOMAIN"
# Megatron-Core's parallel_state getters, by kind.
_MEGATRON_GROUPS = (
    ("tp", "get_tensor_model_parallel_group"),
    ("pp", "get_pipeline_model_parallel_group"),
    ("cp", "get_context_parallel_group"),
    ("ep", "get_expert_model_parallel_group"),
    ("dp", "get_data_parallel_group"),
)
# DeepSpeed's PipelineParallelGrid getters, by kind (its "slice" group: the model-parallel
# ranks of one pipeline stage).
_DEEPSPEED_GROUPS = (
    ("tp", "get_slice_parallel_group"),
    ("pp", "get_pipe_parallel_group"),
    ("dp", "get_data_parallel_group"),
)
# Dimension names frameworks give their meshes, as the kinds the rules know (Lightning's
# ModelParallelStrategy: "data_parallel", "tensor_parallel"); others are kept as named.
_KIND_ALIASES = {
    "tensor_parallel": "tp",
    "tensor": "tp",
    "pipeline_parallel": "pp",
    "pipeline": "pp",
    "data_parallel": "dp",
    "data": "dp",
    "context_parallel": "cp",
    "expert_parallel": "ep",
}
_DOMAIN_UNSAFE = re.compile(r"[^A-Za-z0-9._:@/+=-]")


class ParallelGroup(NamedTuple):
    """One group this rank is in. ``group_first_rank``: the group's lowest global rank,
    the same on each of its ranks, so the agents' series of one group join on it."""

    group: str
    size: int
    group_rank: int  # this rank's position in the group
    group_first_rank: int


class Layout(NamedTuple):
    groups: tuple[ParallelGroup, ...]
    source: str  # megatron, deepspeed, device_mesh, explicit


def group_name(name: str) -> str | None:
    """A DeviceMesh dimension's name as a group label (``tp``, ``dp_shard``; Lightning's
    ``tensor_parallel`` is ``tp``); None when it cannot be one."""
    cleaned = name.strip().lower().replace("-", "_")
    cleaned = _KIND_ALIASES.get(cleaned, cleaned)
    return cleaned if GROUP_NAME.match(cleaned) else None


def nvlink_domain() -> str | None:
    """The NVLink domain of this rank's node: GPUFLEET_NVLINK_DOMAIN, else unknown."""
    value = os.environ.get(DOMAIN_VARIABLE, "").strip()
    return _DOMAIN_UNSAFE.sub("_", value)[:128] or None


def sizes_from_environment(environ: Mapping[str, str] = os.environ) -> dict[str, int]:
    """The group sizes set in GPUFLEET_TP_SIZE, ..._PP_SIZE, ..._CP_SIZE, ..._DP_SIZE."""
    sizes = {}
    for kind, variable in SIZE_VARIABLES.items():
        value = environ.get(variable, "").strip()
        if value.isdigit() and int(value) > 0:
            sizes[kind] = int(value)
        elif value:
            log.warning("gpufleet: %s=%r is not a whole number above 0; ignored", variable, value)
    return sizes


def from_sizes(rank: int, world_size: int, sizes: Mapping[str, int]) -> Layout | None:
    """The groups of ``rank`` for sizes given by hand, ranks ordered tp-cp-dp-pp (Megatron-
    Core's default: a tensor-parallel group is ``tp`` adjacent ranks). dp, when not given,
    is what the others leave of the world; None (logged) when they do not divide it."""
    given = {kind: size for kind, size in sizes.items() if kind in SIZE_ORDER and size > 0}
    if not given:
        return None
    others = math.prod(given.get(kind, 1) for kind in SIZE_ORDER if kind != "dp")
    if "dp" not in given and world_size % others == 0:
        given["dp"] = world_size // others
    if math.prod(given.get(kind, 1) for kind in SIZE_ORDER) == world_size:
        groups = []
        stride = 1
        for kind in SIZE_ORDER:
            size = given.get(kind, 1)
            index = (rank // stride) % size
            if kind in given:
                groups.append(ParallelGroup(kind, size, index, rank - index * stride))
            stride *= size
        return Layout(tuple(groups), "explicit")
    log.warning(
        "gpufleet: parallel sizes %s do not make a world of %d ranks; no layout is reported",
        ", ".join(f"{kind}={size}" for kind, size in sorted(given.items())),
        world_size,
    )
    return None


def from_mesh(mesh: Any) -> Layout | None:
    """The groups of this rank in a ``torch.distributed`` DeviceMesh: one per named
    dimension (read from the mesh's rank tensor: no process group is touched)."""
    coordinate = mesh.get_coordinate()
    names = mesh.mesh_dim_names or ()
    if coordinate is None or not names:
        return None
    ranks = mesh.mesh
    groups: list[ParallelGroup] = []
    for dim, name in enumerate(names):
        kind = group_name(str(name))
        if kind is None or any(kind == group.group for group in groups):
            continue
        along = list(coordinate)
        along[dim] = slice(None)
        members = [int(rank) for rank in ranks[tuple(along)].flatten().tolist()]
        groups.append(ParallelGroup(kind, len(members), coordinate[dim], min(members)))
    return Layout(tuple(groups[:MAX_GROUPS]), "device_mesh") if groups else None


def from_megatron() -> Layout | None:
    """The groups Megatron-Core's ``parallel_state`` holds, when the job imported it and
    initialised model parallelism (never imported here)."""
    state = sys.modules.get("megatron.core.parallel_state")
    dist = sys.modules.get("torch.distributed")
    if state is None or dist is None:
        return None
    try:
        if not state.model_parallel_is_initialized():
            return None
    except Exception as error:  # noqa: BLE001 - a version that differs must not break training
        log.warning("gpufleet: cannot read Megatron-Core's parallel_state (%s)", error)
        return None
    return _from_getters(dist, state, _MEGATRON_GROUPS, "megatron")


def from_deepspeed(grid: Any) -> Layout | None:
    """The groups of a DeepSpeed ``PipelineParallelGrid``."""
    dist = sys.modules.get("torch.distributed")
    return _from_getters(dist, grid, _DEEPSPEED_GROUPS, "deepspeed") if dist else None


def _from_getters(
    dist: Any, holder: Any, getters: tuple[tuple[str, str], ...], source: str
) -> Layout | None:
    """The groups ``holder``'s getters return; a kind of one rank (not used) is left out:
    Megatron and DeepSpeed make every kind's groups."""
    try:
        rank = dist.get_rank()
        groups = []
        for kind, getter in getters:
            try:
                process_group = getattr(holder, getter)()
            except (AssertionError, AttributeError, RuntimeError):
                continue  # not made in this job (expert parallelism off) or another version
            if process_group is None:
                continue
            members = dist.get_process_group_ranks(process_group)
            if len(members) > 1:
                groups.append(ParallelGroup(kind, len(members), members.index(rank), min(members)))
    except Exception as error:  # noqa: BLE001 - a version that differs must not break training
        log.warning("gpufleet: cannot read the parallel groups of %s (%s)", source, error)
        return None
    return Layout(tuple(groups), source) if groups else None


def find_mesh() -> Any | None:
    """The job's DeviceMesh with named dimensions that holds this rank (one walk)."""
    return find_layout_objects()[0]


def find_layout_objects() -> tuple[Any | None, Any | None]:
    """The job's DeviceMesh with named dimensions that holds this rank, the largest of
    them, and DeepSpeed's pipeline grid: one walk over the objects the collector tracks
    (bench/layout_overhead.py: 20-60 ms at 170k objects, 0.06-0.2 s per million more)."""
    mesh_type = getattr(sys.modules.get("torch.distributed.device_mesh"), "DeviceMesh", None)
    grid_type = getattr(
        sys.modules.get("deepspeed.runtime.pipe.topology"), "PipelineParallelGrid", None
    )
    wanted = tuple(kind for kind in (mesh_type, grid_type) if kind is not None)
    if not wanted:
        return None, None
    found = None
    grid = None
    for candidate in gc.get_objects():
        # type(), not isinstance(): some torch objects warn when their __class__ is read
        kind = type(candidate)
        if not issubclass(kind, wanted):
            continue
        if grid_type is not None and issubclass(kind, grid_type):
            grid = candidate
            continue
        try:
            if not candidate.mesh_dim_names or candidate.get_coordinate() is None:
                continue
            key = (candidate.ndim, candidate.mesh.numel())
        except Exception:  # noqa: BLE001, S112 - a half-made mesh is not this job's layout
            continue
        if found is None or key > found[0]:
            found = (key, candidate)
    return (found[1] if found is not None else None), grid


def discover(rank: int, sizes: Mapping[str, int]) -> Layout | None:
    """This rank's layout, from the first source that has one (the module's docstring)."""
    dist = sys.modules.get("torch.distributed")
    distributed = bool(dist is not None and dist.is_available() and dist.is_initialized())
    if distributed:
        layout = from_megatron()
        if layout is None:
            mesh, grid = find_layout_objects()
            layout = from_deepspeed(grid) if grid is not None else None
            if layout is None and mesh is not None:
                layout = from_mesh(mesh)
        if layout is not None:
            return layout
    world = _world_size(dist if distributed else None)
    return from_sizes(rank, world, sizes) if world else None


def _world_size(dist: Any | None) -> int | None:
    if dist is not None:
        return int(dist.get_world_size())
    value = os.environ.get("WORLD_SIZE", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def layout_json(
    layout: Layout,
    training_job: str,
    rank: int,
    attempt: int | None,
    domain: str | None,
) -> dict[str, object]:
    """The agent's JSON for one rank's layout (``POST /v1/layout``)."""
    payload: dict[str, object] = {
        "training_job": training_job,
        "rank": rank,
        "groups": [group._asdict() for group in layout.groups[:MAX_GROUPS]],
    }
    if attempt is not None:
        payload["attempt"] = attempt
    if domain:
        payload["nvlink_domain"] = domain
    return payload
