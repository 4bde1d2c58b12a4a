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
any training environment. Its parts: ``identity`` (job, rank and attempt from the
environment), ``timers`` (the step and checkpoint context managers), ``sender`` (the
buffer and the thread that sends it), ``transport`` (HTTP to the agent) and ``wire``
(the limits and paths the agent shares).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpufleet.reporter.attempts import claim, launched_attempt
from gpufleet.reporter.events import (
    CheckpointEvent,
    CheckpointOp,
    InvalidEventError,
    Phase,
    RankFinished,
    StepEvent,
    whole,
)
from gpufleet.reporter.identity import (
    DEFAULT_AGENT_URL,
    attempt_from_environment,
    job_from_environment,
    rank_from_environment,
    safe_label,
    token_from_environment,
)
from gpufleet.reporter.layout import from_mesh
from gpufleet.reporter.pod import pod_headers
from gpufleet.reporter.sender import Sender
from gpufleet.reporter.timers import CheckpointTimer, StepTimer
from gpufleet.reporter.transport import AgentConnection
from gpufleet.reporter.wire import MAX_ATTEMPT, MAX_RANK, MAX_STAGE

if TYPE_CHECKING:
    from gpufleet.reporter.collectives import CollectiveWait, CommHook, NoCollectives
    from gpufleet.reporter.spans import CollectiveSpans

log = logging.getLogger("gpufleet.client")
_FINISHED = RankFinished()
_new_tuple = tuple.__new__
# A gap longer than this between two steps is not data loading (eval, logging, a stall).
_MAX_AUTO_DATA_WAIT_S = 60.0


class Reporter(Sender):
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
        self.agent_url = url
        self.training_job = safe_label(training_job) if training_job else job_from_environment()
        self.rank = rank if rank is not None else rank_from_environment()
        self.pp_stage = pp_stage
        self.dp_rank = dp_rank
        self.attempt = attempt if attempt is not None else attempt_from_environment()
        token = token if token is not None else token_from_environment()
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        # On Kubernetes, the pod (downward API) in two headers, once per request.
        headers.update(pod_headers())
        super().__init__(
            AgentConnection(url, headers, timeout, self._warn),
            buffer_size=buffer_size,
            batch_size=batch_size,
            flush_interval=flush_interval,
            layout_sizes={"tp": tp_size, "pp": pp_size, "cp": cp_size, "dp": dp_size},
        )
        self._sync = sync
        self._exit_timeout = exit_timeout
        if enabled is None:
            enabled = os.environ.get("GPUFLEET_DISABLE", "") not in ("1", "true", "yes")
        self.enabled = enabled
        self._step_counter = itertools.count()
        self._checkpoint_ids = itertools.count()
        self._last_step_end: float | None = None
        self._collectives: CollectiveWait | CollectiveSpans | NoCollectives | None = None
        if enabled and not self._identity_is_valid():
            self.enabled = enabled = False
        if enabled:
            self._watch_process()

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
        ``DistributedDataParallel`` model, one sharded by FSDP2's ``fully_shard``, or a
        DeepSpeed engine: ``reporter.watch(model)`` once, before the first forward. Each
        step then reports its exposed collective wait (DDP: from this rank's last
        gradient bucket to the end of its all-reduces; FSDP2 and DeepSpeed: the time in
        their collectives) and its compute as the rest of the step, which is what tells
        a slow rank from the ranks that wait for it. ``comm_hook`` / ``state``: a DDP
        communication hook of your own (DDP takes one); it runs inside gpufleet's. True
        when the model is watched; watching it again returns the same timing.
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
        self._agent.close()
        if self._attempt is not None:
            self._attempt.detach()
        self.enabled = False
        atexit.unregister(self.close)
