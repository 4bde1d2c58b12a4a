"""Report training steps and checkpoints to the node's gpufleet agent.

Three lines in a training loop::

    reporter = Reporter()                      # job, rank and agent URL from the environment
    for batch in loader:
        with reporter.step(tokens=batch_tokens):
            train_step(batch)

Recording never blocks and never raises into training code: events go into a
bounded in-memory buffer that a background thread sends in batches. While the
agent is down the thread backs off and retries; when the buffer is full, new
events are dropped and counted, and the count is reported to the agent when it
answers again. The buffer is flushed at exit (for at most ``exit_timeout``), then
the agent is told this rank finished, so that a job that ended is not taken for
a job that hung (``finish()`` does this earlier, e.g. at the end of ``fit``).

Timings overlap on a GPU (collectives run under backward compute), so what is
sent is made to add up, in the sender thread (never on the training thread):
``data_wait_s`` and ``compute_s`` are kept as measured (each at most the step),
and ``comm_wait_s`` is the *exposed* collective wait, clamped to what is left of
the step: communication hidden under compute is not waiting. An event that
cannot be made valid (a non-finite or out-of-range duration, a negative step)
is dropped alone, logged and counted in ``dropped``; if the agent still refuses
some events of a batch, it names them and the rest of the batch is resent, so
one bad event never costs its neighbours.

Only the standard library is imported, so this module is cheap to import in
any training environment.
"""

from __future__ import annotations

import atexit
import http.client
import itertools
import json
import logging
import os
import random
import re
import socket
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from gpufleet.reporter.attempts import AttemptLifecycle, claim, launched_attempt
from gpufleet.reporter.events import (
    ATTEMPTS_PATH,
    MAX_ATTEMPT,
    MAX_ATTEMPT_EVENTS,
    MAX_BATCH_EVENTS,
    MAX_RANK,
    MAX_STAGE,
    AttemptEvent,
    CheckpointEvent,
    CheckpointOp,
    Event,
    InvalidEventError,
    Phase,
    RankFinished,
    StepEvent,
    attempt_json,
    checkpoint_json,
    step_json,
    whole,
)
from gpufleet.reporter.layout import (
    LAYOUT_PATH,
    Layout,
    discover,
    from_mesh,
    layout_json,
    nvlink_domain,
    sizes_from_environment,
)
from gpufleet.reporter.pod import pod_headers

if TYPE_CHECKING:
    from gpufleet.reporter.collectives import CollectiveWait, CommHook, NoCollectives

log = logging.getLogger("gpufleet.client")
EventT = TypeVar("EventT", StepEvent, CheckpointEvent)
_FINISHED = RankFinished()
_new_tuple = tuple.__new__

DEFAULT_AGENT_URL = "http://127.0.0.1:9405"
_JOB_VARIABLES = (
    "GPUFLEET_TRAINING_JOB",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "PBS_JOBID",
    "LSB_JOBID",
    "JOB_ID",
)
_RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
_ATTEMPT_VARIABLES = ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9._:@/+=-]")
# A gap longer than this between two steps is not data loading (eval, logging, a stall).
_MAX_AUTO_DATA_WAIT_S = 60.0
_WARN_EVERY_S = 60.0


def job_from_environment() -> str:
    """The training job id: GPUFLEET_TRAINING_JOB, else the launcher's (TorchElastic, Slurm...)."""
    for name in _JOB_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value and value.lower() != "none":
            return safe_label(value)
    return safe_label(f"local-{socket.gethostname()}")


def rank_from_environment() -> int:
    """The global rank: RANK (torchrun), else SLURM_PROCID, OMPI / PMI variables, else 0."""
    for name in _RANK_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def attempt_from_environment() -> int:
    """The launcher's restart count: TORCHELASTIC_RESTART_COUNT (torchrun), else
    SLURM_RESTART_COUNT, else 0 (the first launch)."""
    for name in _ATTEMPT_VARIABLES:
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


class _Phase:
    """Times one phase (data, compute, comm) inside a step."""

    __slots__ = ("_attr", "_started", "_timer")

    def __init__(self, timer: StepTimer, attr: str) -> None:
        self._timer = timer
        self._attr = attr
        self._started = 0.0

    def __enter__(self) -> None:
        self._started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        elapsed = time.perf_counter() - self._started
        setattr(self._timer, self._attr, getattr(self._timer, self._attr) + elapsed)


class _Timer:
    """What the step and checkpoint timers share: the exit, which tells ``_exited``
    whether the timed block ended normally."""

    __slots__ = ()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exited(exc_type is None)

    def _exited(self, ok: bool) -> None:
        raise NotImplementedError


class StepTimer(_Timer):
    """Context manager for one step. Use ``data()``, ``comm()`` or ``compute()`` inside to
    split it; set ``tokens`` if not known up front. Without ``compute()``, compute is the
    step's time minus its data and communication waits."""

    __slots__ = (
        "_reporter",
        "_started",
        "comm_wait_s",
        "compute_s",
        "data_wait_s",
        "phase",
        "step",
        "tokens",
    )

    def __init__(self, reporter: Reporter, tokens: int, phase: Phase, step: int | None) -> None:
        self._reporter = reporter
        self.tokens = tokens
        self.phase = phase
        self.step = step
        self.data_wait_s = 0.0
        self.comm_wait_s = 0.0
        self.compute_s: float | None = None
        self._started = 0.0

    def data(self) -> _Phase:
        return _Phase(self, "data_wait_s")

    def comm(self) -> _Phase:
        return _Phase(self, "comm_wait_s")

    def compute(self) -> _Phase:
        if self.compute_s is None:
            self.compute_s = 0.0
        return _Phase(self, "compute_s")

    def __enter__(self) -> StepTimer:
        self._started = time.perf_counter()
        return self

    def _exited(self, ok: bool) -> None:
        if not ok:
            self._reporter._last_step_end = None  # an interrupted step is not recorded
            return
        self._reporter._finish_step(self, self._started)


class CheckpointTimer(_Timer):
    """Context manager for one checkpoint save or restore.

    Call ``serving()`` at the moment the storage starts serving the operation (a
    slot, lock or connection was granted); the time before it is queue wait, the
    time after it is service. Without ``serving()`` the whole operation counts
    as service time.
    """

    __slots__ = ("_reporter", "_served_at", "_started", "bytes", "id", "op")

    def __init__(self, reporter: Reporter, op: CheckpointOp, ident: str, size: int) -> None:
        self._reporter = reporter
        self.op = op
        self.id = ident
        self.bytes = size
        self._started = 0.0
        self._served_at: float | None = None

    def serving(self) -> None:
        self._served_at = time.perf_counter()

    def __enter__(self) -> CheckpointTimer:
        self._started = time.perf_counter()
        self._reporter._push(CheckpointEvent(self.op, "begin", self.id, 0.0, 0.0, 0, True))
        return self

    def _exited(self, ok: bool) -> None:
        ended = time.perf_counter()
        served = self._served_at if self._served_at is not None else self._started
        queue_wait, service = served - self._started, ended - served
        event = CheckpointEvent(self.op, "end", self.id, queue_wait, service, self.bytes, ok)
        self._reporter._push(event)


class Reporter:
    """Sends this rank's steps and checkpoints to the node's agent. Thread-safe to call.

    Args:
        agent_url: the agent, e.g. ``http://10.0.0.5:9405`` (default: GPUFLEET_AGENT_URL,
            else http://127.0.0.1:9405). In Kubernetes point it at the node:
            ``http://$(HOST_IP):9405`` with HOST_IP from the downward API.
        training_job: job id (default: GPUFLEET_TRAINING_JOB, TORCHELASTIC_RUN_ID,
            SLURM_JOB_ID, ...).
        rank: global rank (default: RANK, SLURM_PROCID, ...).
        pp_stage: this rank's pipeline-parallel stage; ranks are only compared with
            peers in the same stage.
        dp_rank: data-parallel rank, where known.
        attempt: how many times the launcher restarted this job (default:
            TORCHELASTIC_RESTART_COUNT under ``torchrun --max-restarts``, else
            SLURM_RESTART_COUNT, else 0). Restarted workers keep the job id, so their
            steps count under the same training_job; the agent exports the highest attempt.
        token: bearer token if the agent requires one (default: GPUFLEET_INGEST_TOKEN, else
            the content of the file named by GPUFLEET_INGEST_TOKEN_FILE).
        sync: called before a step's end time is taken, e.g. ``torch.cuda.synchronize``,
            so that asynchronous GPU work is inside the step it belongs to.
        buffer_size: events held while the agent is slow or down; beyond it they drop.
        batch_size: events per request, at most ``MAX_BATCH_EVENTS`` (what the agent takes).
        enabled: False (or GPUFLEET_DISABLE=1) makes every call a no-op.
        tp_size, pp_size, cp_size, dp_size: the job's parallel sizes (default:
            GPUFLEET_TP_SIZE...), used when neither Megatron-Core, DeepSpeed's pipeline
            grid nor a DeviceMesh says them; ranks ordered tp-cp-dp-pp. The layout is
            found once, in the sender thread after the first step, and sent once
            (``describe_layout``, ``gpufleet.reporter.layout``).
    """

    def __init__(
        self,
        agent_url: str | None = None,
        *,
        training_job: str | None = None,
        rank: int | None = None,
        pp_stage: int = 0,
        dp_rank: int | None = None,
        attempt: int | None = None,
        token: str | None = None,
        sync: Callable[[], object] | None = None,
        buffer_size: int = 65_536,
        batch_size: int = 4096,
        flush_interval: float = 1.0,
        timeout: float = 2.0,
        exit_timeout: float = 2.0,
        enabled: bool | None = None,
        tp_size: int | None = None,
        pp_size: int | None = None,
        cp_size: int | None = None,
        dp_size: int | None = None,
    ) -> None:
        url = agent_url or os.environ.get("GPUFLEET_AGENT_URL") or DEFAULT_AGENT_URL
        parsed = urllib.parse.urlsplit(url if "//" in url else f"http://{url}")
        self.agent_url = url
        self._host = parsed.hostname or "127.0.0.1"
        self._port = parsed.port or 9405
        self._base_path = parsed.path.rstrip("/")
        self.training_job = safe_label(training_job) if training_job else job_from_environment()
        self.rank = rank if rank is not None else rank_from_environment()
        self.pp_stage = pp_stage
        self.dp_rank = dp_rank
        self.attempt = attempt if attempt is not None else attempt_from_environment()
        token = token if token is not None else _token_from_environment()
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        # On Kubernetes, the pod (downward API) in two headers, once per request.
        self._headers.update(pod_headers())
        self._sync = sync
        self._capacity = buffer_size
        self._batch_size = max(1, min(batch_size, MAX_BATCH_EVENTS))
        self._flush_interval = flush_interval
        self._timeout = timeout
        self._exit_timeout = exit_timeout
        if enabled is None:
            enabled = os.environ.get("GPUFLEET_DISABLE", "") not in ("1", "true", "yes")
        self.enabled = enabled

        self._buffer: deque[Event] = deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        self._idle = threading.Condition()
        self._in_flight = 0
        self._connection: http.client.HTTPConnection | None = None
        self._step_counter = itertools.count()
        self._checkpoint_ids = itertools.count()
        self._last_step_end: float | None = None
        self._warned: dict[str, float] = {}
        self._count_lock = threading.Lock()
        self._collectives: CollectiveWait | NoCollectives | None = None
        self._init_layout({"tp": tp_size, "pp": pp_size, "cp": cp_size, "dp": dp_size})
        self._forget_attempt()

        self.dropped = 0  # events dropped and not yet reported to the agent
        self.dropped_total = 0
        self.sent = 0
        self.rejected = 0  # events the agent refused
        self.invalid = 0  # events dropped here because no clamping could make them valid
        if enabled and not self._identity_is_valid():
            self.enabled = enabled = False
        if enabled:
            self._watch_process()

    def _init_layout(self, given: dict[str, int | None]) -> None:
        self._layout_sizes = sizes_from_environment() | {
            kind: size for kind, size in given.items() if size
        }
        self._layout_described = False  # described by hand, or found after the first step
        self._layout_discover = False  # the sender thread looks for it
        self._layout_outbox: dict[str, object] | None = None

    def _forget_attempt(self) -> None:
        # Attempt events wait here, apart from the steps, so that ``ended`` (sent at once
        # from whatever thread sees the end) can take what is still unsent along with it.
        self._attempt_outbox: deque[AttemptEvent] = deque()
        self._attempt_lock = threading.Lock()
        self._attempt: AttemptLifecycle | None = None
        self._first_step_pending = False  # the one check a step pays for attempts

    def _watch_process(self) -> None:
        """Close at exit, start afresh in a forked child; and, when a launcher numbered this
        attempt, tell the agent it started and watch for its first step and its end
        (``gpufleet.reporter.attempts``)."""
        atexit.register(self.close)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)
        launched = launched_attempt()
        if launched is not None:
            self._attempt = claim(
                self.training_job, launched, self.rank, self._queue_attempt, self._send_now
            )
        if self._attempt is not None:
            self._attempt.started()
        self._first_step_pending = True  # attempt's first step, and the layout looked for

    def _identity_is_valid(self) -> bool:
        try:
            whole("rank", self.rank, MAX_RANK)
            whole("pp_stage", self.pp_stage, MAX_STAGE)
            if self.dp_rank is not None:
                whole("dp_rank", self.dp_rank, MAX_RANK)
            whole("attempt", self.attempt, MAX_ATTEMPT)
        except InvalidEventError as error:
            log.error("gpufleet client disabled: %s", error)
            return False
        return True

    # -- recording (training thread) ----------------------------------------------

    def watch(self, model: object, comm_hook: CommHook | None = None, state: object = None) -> bool:
        """Time this rank's own work apart from its wait for peers, for a
        ``DistributedDataParallel`` model: ``reporter.watch(ddp_model)`` once, before
        the first backward. Each step then reports its exposed collective wait (from
        this rank's last gradient bucket to the end of its all-reduces) and its compute
        as the rest of the step, which is what tells a slow rank from the ranks that
        wait for it. ``comm_hook`` / ``state``: a communication hook of your own (DDP
        takes one); it runs inside gpufleet's. True when the model is watched.
        """
        if not self.enabled:
            return False
        from gpufleet.reporter.collectives import watch_model

        self._collectives = watch_model(model, comm_hook, state)
        return self._collectives is not None

    def step(self, tokens: int = 0, phase: Phase = "train", step: int | None = None) -> StepTimer:
        """Time one step: ``with reporter.step(tokens=n): ...``.

        The gap since the previous step ended (the time spent in ``next(loader)``)
        counts as data-loader wait and as part of the step.
        """
        return StepTimer(self, tokens, phase, step)

    def _finish_step(self, timer: StepTimer, started: float) -> None:
        if self._sync is not None:
            try:
                self._sync()
            except Exception:  # noqa: BLE001 - timing must never break training
                self._warn("sync", "the sync callable raised; timings may be early")
        ended = time.perf_counter()
        previous = self._last_step_end
        self._last_step_end = ended
        gap = started - previous if previous is not None else 0.0
        if not 0.0 <= gap <= _MAX_AUTO_DATA_WAIT_S:
            gap = 0.0
        self.record_step(
            duration_s=ended - started + gap,
            compute_s=timer.compute_s,
            data_wait_s=timer.data_wait_s + gap,
            comm_wait_s=timer.comm_wait_s,
            tokens=timer.tokens,
            phase=timer.phase,
            step=timer.step,
        )

    def record_step(
        self,
        duration_s: float,
        *,
        compute_s: float | None = None,
        data_wait_s: float = 0.0,
        comm_wait_s: float = 0.0,
        tokens: int = 0,
        phase: Phase = "train",
        step: int | None = None,
    ) -> None:
        """Record a step timed by the caller (seconds). Never blocks, never raises.

        On a watched model (``watch``) the collective wait since the previous step is
        added to ``comm_wait_s`` and, unless given, compute is the rest of the step."""
        if self._first_step_pending:
            self._first_step_pending = False
            if self._attempt is not None:
                self._attempt.first_step()
            # Process groups and meshes are made after the Reporter as often as before it:
            # by the first step they exist. Found in the sender thread, never here.
            self._layout_discover = not self._layout_described
        if step is None:
            step = next(self._step_counter)
        collectives = self._collectives
        if collectives is not None:
            comm_wait_s += collectives.take()
            if compute_s is None:
                compute_s = max(0.0, duration_s - data_wait_s - comm_wait_s)
        # tuple.__new__ skips the NamedTuple's generated __new__ (a Python-level call):
        # about 0.1 us less per step on the training thread (bench/client_overhead.py).
        self._push(
            _new_tuple(
                StepEvent, (step, duration_s, compute_s, data_wait_s, comm_wait_s, tokens, phase)
            )
        )

    def describe_layout(self, mesh: object = None) -> bool:
        """Report this rank's parallel layout now: the groups of ``mesh`` (a
        ``torch.distributed`` DeviceMesh with named dimensions: ``tp``, ``pp``, ``dp``...),
        else what Megatron-Core, the job's DeviceMesh or the sizes given say (as after the
        first step, but on the calling thread). Once per attempt is enough; a later call
        replaces what was sent. True when a layout was found."""
        if not self.enabled:
            return False
        layout = from_mesh(mesh) if mesh is not None else self._discover_layout()
        self._queue_layout(layout)
        return layout is not None

    def _discover_layout(self) -> Layout | None:
        try:
            return discover(self.rank, self._layout_sizes)
        except Exception as error:  # noqa: BLE001 - looking must never break training
            self._warn("layout", f"gpufleet client cannot read the parallel layout: {error}")
            return None

    def _queue_layout(self, layout: Layout | None) -> None:
        self._layout_described = True
        if layout is None:
            log.debug("gpufleet: no parallel layout found; GPUFLEET_TP_SIZE... can say it")
            return
        log.info(
            "gpufleet: parallel layout from %s: %s",
            layout.source,
            ", ".join(f"{group.group} {group.size}" for group in layout.groups),
        )
        self._layout_outbox = layout_json(
            layout, self.training_job, self.rank, self.attempt, nvlink_domain()
        )
        if self._thread is None:
            self._start_thread()
        self._wake.set()

    def _send_layout(self) -> bool:
        """Find the layout if the first step asked for it, and send it (sender thread).
        False: the agent is unreachable (retry later)."""
        if self._layout_discover:
            self._layout_discover = False
            if not self._layout_described:
                self._queue_layout(self._discover_layout())
        payload = self._layout_outbox
        if payload is None:
            return True
        if not self._send_payload(LAYOUT_PATH, [payload], counted=False):
            return False
        if self._layout_outbox is payload:  # unless described again meanwhile
            self._layout_outbox = None
        return True

    def checkpoint(
        self, op: CheckpointOp = "save", bytes: int = 0, id: str | None = None
    ) -> CheckpointTimer:
        """Time a checkpoint: ``with reporter.checkpoint("save", bytes=n) as c: ...``;
        call ``c.serving()`` when the storage starts serving, to separate queue wait."""
        ident = id or f"{self.rank}-{next(self._checkpoint_ids)}"
        return CheckpointTimer(self, op, ident, bytes)

    def record_checkpoint(
        self,
        op: CheckpointOp,
        *,
        queue_wait_s: float,
        service_s: float,
        bytes: int = 0,
        ok: bool = True,
    ) -> None:
        """Record a checkpoint operation timed by the caller (begin and end at once)."""
        ident = f"{self.rank}-{next(self._checkpoint_ids)}"
        self._push(CheckpointEvent(op, "begin", ident, 0.0, 0.0, 0, True))
        self._push(CheckpointEvent(op, "end", ident, queue_wait_s, service_s, bytes, ok))

    def _push(self, event: Event) -> None:
        if not self.enabled:
            return
        if self._thread is None:
            self._start_thread()
        buffer = self._buffer
        if len(buffer) >= self._capacity:
            self._count_dropped(1)
            return
        buffer.append(event)
        if len(buffer) == self._batch_size:
            self._wake.set()

    # -- sending (background thread) ------------------------------------------------

    def _start_thread(self) -> None:
        with self._thread_lock:
            if self._thread is not None:
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="gpufleet-reporter", daemon=True)
            self._thread.start()

    def _after_fork(self) -> None:
        # A forked child (a DataLoader worker) has no sender thread: start afresh, empty.
        self._buffer = deque()
        self._thread = None
        self._connection = None
        self._thread_lock = threading.Lock()
        self._idle = threading.Condition()
        self._in_flight = 0
        self._forget_attempt()  # the child is not the attempt (attempts.py)
        self._layout_discover, self._layout_outbox = False, None  # nor the rank's layout

    def _run(self) -> None:
        backoff = 0.0
        while not self._stop.is_set():
            if backoff:
                self._stop.wait(backoff)
            else:
                self._wake.wait(self._flush_interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            if self._drain() is False:
                backoff = min(30.0, max(0.5, backoff * 2)) * random.uniform(0.8, 1.2)
            else:
                backoff = 0.0

    def _drain(self) -> bool | None:
        """Send everything buffered. False: the agent is unreachable (retry later)."""
        result: bool | None = None
        if self._attempt_outbox:
            if not self._send_queued_attempts():
                return False
            result = True
        if self._layout_discover or self._layout_outbox is not None:
            if not self._send_layout():
                return False
            result = True
        while self._buffer:
            taken = self._take()
            try:
                ok = self._send_events(taken)
            finally:
                with self._idle:
                    self._in_flight -= 1
                    self._idle.notify_all()
            if not ok:
                # Put the batch back in front, within capacity; the rest is dropped and counted.
                room = self._capacity - len(self._buffer)
                keep = taken[: max(0, room)]
                self._buffer.extendleft(reversed(keep))
                if len(keep) < len(taken):
                    self._count_dropped(len(taken) - len(keep))
                return False
            result = True
        with self._idle:
            self._idle.notify_all()
        return result

    def _count_dropped(self, count: int, warn: bool = True) -> None:
        with self._count_lock:
            self.dropped += count
            self.dropped_total += count
        if warn:
            self._warn("dropped", "gpufleet client buffer full: dropping events (they are counted)")

    def _take(self) -> list[Event]:
        # Taken and marked in flight under one lock: flush() never sees the events
        # neither buffered nor in flight (it would return before they were sent).
        taken: list[Event] = []
        buffer = self._buffer
        with self._idle:
            for _ in range(min(self._batch_size, len(buffer))):
                taken.append(buffer.popleft())
            self._in_flight += 1
        return taken

    def _send_events(self, events: list[Event]) -> bool:
        steps = self._valid(self._step_json, [e for e in events if isinstance(e, StepEvent)])
        checkpoints = self._valid(
            self._checkpoint_json, [e for e in events if isinstance(e, CheckpointEvent)]
        )
        finished: list[dict[str, object]] = [
            {"training_job": self.training_job, "rank": self.rank, "pp_stage": self.pp_stage}
            for e in events
            if isinstance(e, RankFinished)
        ][:1]
        for path, payload, counted in (
            ("/v1/steps", steps, True),
            ("/v1/checkpoints", checkpoints, True),
            ("/v1/finished", finished, False),  # last: after this batch's steps
        ):
            if payload and not self._send_payload(path, payload, counted):
                return False
        return True

    def _valid(
        self,
        to_json: Callable[[EventT], dict[str, object]],
        events: list[EventT],
    ) -> list[dict[str, object]]:
        payload = []
        for event in events:
            try:
                payload.append(to_json(event))
            except InvalidEventError as error:
                self.invalid += 1
                self._count_dropped(1, warn=False)
                self._warn("invalid", f"gpufleet client dropped an event it cannot send: {error}")
        return payload

    def _send_payload(self, path: str, payload: list[dict[str, object]], counted: bool) -> bool:
        """POST one batch. False: the agent is unreachable or failing (retry later)."""
        for attempt in range(2):  # the second: without the events the agent named as refused
            dropped = self.dropped
            body = json.dumps({"events": payload, "dropped": dropped}).encode()
            answer = self._post(path, body)
            if answer is None or answer[0] >= 500:
                return False
            status, text = answer
            if status < 300:
                self.sent += len(payload) if counted else 0
                with self._count_lock:
                    self.dropped -= dropped
                return True
            refused = _refused_indices(text, len(payload)) if status == 422 else []
            if attempt == 0 and 0 < len(refused) < len(payload):
                self.rejected += len(refused)
                self._warn(
                    "http-422",
                    f"the agent at {self.agent_url} refused {len(refused)} of {len(payload)} "
                    f"events ({_detail(text)}); they are dropped, the rest is resent",
                )
                skip = set(refused)
                payload = [event for index, event in enumerate(payload) if index not in skip]
                continue
            self.rejected += len(payload)
            self._warn(
                f"http-{status}",
                f"the agent at {self.agent_url} rejected {len(payload)} events with HTTP "
                f"{status} ({_detail(text)}); they are dropped",
            )
            return True
        return True

    # -- attempt events --------------------------------------------------------------

    def _queue_attempt(self, event: AttemptEvent) -> None:
        if not self.enabled:
            return
        if len(self._attempt_outbox) < MAX_ATTEMPT_EVENTS:
            self._attempt_outbox.append(event)
        if self._thread is None:
            self._start_thread()
        self._wake.set()

    def _send_queued_attempts(self) -> bool:
        """Send the queued attempt events (sender thread). False: retry later."""
        with self._attempt_lock:
            events = list(self._attempt_outbox)
            if not events:
                return True
            if not self._send_attempts(events, self._post):
                return False
            for _ in events:
                self._attempt_outbox.popleft()
        return True

    def _send_now(self, events: list[AttemptEvent], budget: float) -> bool:
        """Send ``events`` (an attempt's end) at once from the calling thread, after what is
        still queued, on a connection of their own; for at most about ``budget`` seconds."""
        deadline = time.monotonic() + budget
        locked = self._attempt_lock.acquire(timeout=max(0.0, budget / 2))
        try:
            if locked:
                events = [*self._attempt_outbox, *events]

            def post(path: str, body: bytes) -> tuple[int, bytes] | None:
                # one socket timeout per step (connect, send, read): about the budget in all
                remaining = max(0.05, (deadline - time.monotonic()) / 2)
                return self._post_on_new_connection(path, body, remaining)

            sent = self._send_attempts(events, post)
            if sent and locked:
                self._attempt_outbox.clear()
            return sent
        finally:
            if locked:
                self._attempt_lock.release()

    def _send_attempts(
        self,
        events: list[AttemptEvent],
        post: Callable[[str, bytes], tuple[int, bytes] | None],
    ) -> bool:
        """POST attempt events to the agent. False: unreachable or failing (retry later); a
        refusal (an agent too old to know attempts, a bad token) drops them, logged."""
        body = json.dumps({"events": [attempt_json(event) for event in events]}).encode()
        answer = post(ATTEMPTS_PATH, body)
        if answer is None or answer[0] >= 500:
            return False
        status, text = answer
        if status >= 300:
            self._warn(
                f"attempts-http-{status}",
                f"the agent at {self.agent_url} refused {len(events)} job attempt events with "
                f"HTTP {status} ({_detail(text)}); they are dropped",
            )
        return True

    def _post_on_new_connection(
        self, path: str, body: bytes, timeout: float
    ) -> tuple[int, bytes] | None:
        connection = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        try:
            connection.request("POST", self._base_path + path, body, self._headers)
            response = connection.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException):
            return None
        finally:
            connection.close()

    def _step_json(self, event: StepEvent) -> dict[str, object]:
        return step_json(
            event,
            self.training_job,
            self.rank,
            self.pp_stage,
            dp_rank=self.dp_rank,
            attempt=self.attempt,
        )

    def _checkpoint_json(self, event: CheckpointEvent) -> dict[str, object]:
        return checkpoint_json(event, self.training_job, self.rank)

    def _post(self, path: str, body: bytes) -> tuple[int, bytes] | None:
        for attempt in range(2):  # one retry on a stale keep-alive connection
            connection = self._connection
            if connection is None:
                connection = self._connection = http.client.HTTPConnection(
                    self._host, self._port, timeout=self._timeout
                )
            try:
                connection.request("POST", self._base_path + path, body, self._headers)
                response = connection.getresponse()
                return response.status, response.read()
            except (OSError, http.client.HTTPException) as error:
                connection.close()
                self._connection = None
                if attempt == 1 or not isinstance(
                    error, http.client.RemoteDisconnected | BrokenPipeError
                ):
                    self._warn(
                        "unreachable",
                        f"gpufleet agent at {self.agent_url} unreachable ({error}); "
                        "buffering and retrying",
                    )
                    return None
        return None

    def _warn(self, kind: str, message: str) -> None:
        now = time.monotonic()
        if now - self._warned.get(kind, -_WARN_EVERY_S) >= _WARN_EVERY_S:
            self._warned[kind] = now
            log.warning(message)

    # -- lifecycle -----------------------------------------------------------------

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything recorded so far is sent (or ``timeout`` passes)."""
        if not self.enabled or self._thread is None:
            return not self._buffer
        deadline = time.monotonic() + timeout
        self._wake.set()
        with self._idle:
            while (
                self._buffer
                or self._in_flight
                or self._attempt_outbox
                or self._layout_discover
                or self._layout_outbox is not None
            ):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._wake.set()
                self._idle.wait(min(remaining, 0.05))
        return True

    def finish(self, timeout: float = 5.0) -> bool:
        """Tell the agent this rank's training ended, after everything recorded so far,
        and wait until it is sent (or ``timeout`` passes). A job whose ranks all finished
        is not reported as hung. Recording may go on afterwards (the rank runs again)."""
        if not self.enabled or self._thread is None:
            return not self._buffer  # nothing was ever recorded: nothing to finish
        self._push(_FINISHED)
        flushed = self.flush(timeout)
        if self._attempt is not None:
            self._attempt.succeeded()
        return flushed

    def close(self) -> None:
        """Finish, flush (for at most ``exit_timeout``) and stop the sender. Called at exit."""
        if not self.enabled:
            return
        if self._thread is not None:
            self.finish(self._exit_timeout)
            self._stop.set()
            self._wake.set()
            self._thread.join(self._exit_timeout)
            self._thread = None
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        if self._attempt is not None:
            self._attempt.detach()
        self.enabled = False
        atexit.unregister(self.close)


def _token_from_environment() -> str | None:
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


def _refused_indices(text: bytes, size: int) -> list[int]:
    """The indices a 422 names in ``refused`` (the agent's answer), within the batch."""
    try:
        refused = json.loads(text).get("refused", [])
    except (ValueError, AttributeError):
        return []
    if not isinstance(refused, list):
        return []
    return sorted({i for i in refused if isinstance(i, int) and 0 <= i < size})


def _detail(text: bytes) -> str:
    try:
        detail = json.loads(text).get("detail", "")
    except (ValueError, AttributeError):
        detail = text[:200].decode("utf-8", "replace")
    shown = json.dumps(detail) if not isinstance(detail, str) else detail
    return shown if len(shown) <= 300 else shown[:297] + "..."
