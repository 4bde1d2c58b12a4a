"""Job attempts as the training process sees them: started, first step, ended.

Under a launcher that numbers its restarts, the client tells its node's agent, which
writes to the fleet ledger (the training pod needs no ledger credentials):

- ``started``: rank 0, when its Reporter is made;
- ``first_step``: rank 0, when its first step is recorded;
- ``ended``: ``success`` from rank 0 at ``Reporter.finish()`` / ``close()`` (the Lightning
  and Hugging Face adapters call ``finish()`` at the end of ``fit``; ``close()`` runs at a
  normal interpreter exit); ``failed`` from any rank on an uncaught exception (cause: its
  class name) or on SIGTERM (cause ``sigterm``); ``cancelled`` on KeyboardInterrupt.
  Sent at once, on a connection of its own, for at most ``ENDED_BUDGET_S``: the process
  is about to die. Under torchrun, a failure in the last restart torchrun allows
  (``TORCHELASTIC_RESTART_COUNT`` = ``TORCHELASTIC_MAX_RESTARTS``) says
  ``restarts_exhausted``: no automatic attempt follows, and the ledger closes the job's
  retry chain as abandoned.

Which launcher numbered the attempt is the event's ``source``:

=========================  ===========  ==================================================
environment                source       attempt (the ledger's, from 1)
=========================  ===========  ==================================================
TORCHELASTIC_RUN_ID        torchrun     TORCHELASTIC_RESTART_COUNT + 1 (under Slurm too:
                                        + SLURM_RESTART_COUNT x (TORCHELASTIC_MAX_RESTARTS
                                        + 1), so a requeued job's numbers go on)
SLURM_JOB_ID               slurm        SLURM_RESTART_COUNT + 1
GPUFLEET_ATTEMPT only      manual       GPUFLEET_ATTEMPT
=========================  ===========  ==================================================

GPUFLEET_ATTEMPT=N sets the number of this launch's first attempt (a resubmission that
keeps its training_job, e.g. ``--rdzv-id``, passes the next number); the launcher's
restarts count on from it. The trigger is ``auto`` for a launcher's restart (a restart
count above 0), else GPUFLEET_ATTEMPT_TRIGGER (``manual`` marks a resubmission by a
person, ``auto`` one by a script), else ``initial`` for attempt 1 and ``manual`` after.
Without any of these variables nothing is sent: the client cannot tell one launch of a
job from the next. GPUFLEET_ATTEMPTS=0 turns attempt reporting off.

A process killed by SIGKILL (the OOM killer, a lost node) sends no ``ended``; the ledger
closes such an attempt when the job's next attempt starts.

Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import FrameType, TracebackType

from gpufleet.reporter.events import (
    AttemptEvent,
    AttemptSource,
    Outcome,
    Trigger,
    cause_name,
)
from gpufleet.reporter.wire import MAX_ATTEMPT

ENDED_BUDGET_S = 2.0
_OFF = ("0", "false", "no", "off")


@dataclass(frozen=True, slots=True)
class LaunchedAttempt:
    """This process's attempt as its launcher numbered it."""

    source: AttemptSource
    number: int  # the ledger's attempt number, from 1
    trigger: Trigger
    last: bool = False  # the launcher restarts no more: a failure here ends the retries


def _count(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "").strip()
    return int(value) if value.isdigit() else None


def _present(environ: Mapping[str, str], name: str) -> bool:
    value = environ.get(name, "").strip()
    return bool(value) and value.lower() != "none"


def launched_attempt(environ: Mapping[str, str] | None = None) -> LaunchedAttempt | None:
    """The attempt the launcher's environment describes (see the module); None when
    attempts are not reported (no launcher, or GPUFLEET_ATTEMPTS=0)."""
    env = os.environ if environ is None else environ
    if env.get("GPUFLEET_ATTEMPTS", "").strip().lower() in _OFF:
        return None
    elastic = _count(env, "TORCHELASTIC_RESTART_COUNT")
    slurm = _count(env, "SLURM_RESTART_COUNT") or 0
    source: AttemptSource
    last = False
    if _present(env, "TORCHELASTIC_RUN_ID") and elastic is not None:
        source, launch_restarts, restarts = "torchrun", 0, elastic
        max_restarts = _count(env, "TORCHELASTIC_MAX_RESTARTS")
        last = max_restarts is not None and elastic >= max_restarts
        if slurm and max_restarts is not None:
            launch_restarts = slurm * (max_restarts + 1)
    elif _present(env, "SLURM_JOB_ID"):
        source, launch_restarts, restarts = "slurm", slurm, 0
    elif _count(env, "GPUFLEET_ATTEMPT"):
        source, launch_restarts, restarts = "manual", 0, 0
    else:
        return None
    first = _count(env, "GPUFLEET_ATTEMPT") or 0
    number = (first or 1) + launch_restarts + restarts
    if not 1 <= number <= MAX_ATTEMPT:
        return None
    marked = env.get("GPUFLEET_ATTEMPT_TRIGGER", "").strip().lower()
    trigger: Trigger
    if restarts > 0:
        trigger = "auto"  # the launcher restarted this launch's workers
    elif marked in ("manual", "auto"):
        trigger = "manual" if marked == "manual" else "auto"
    elif launch_restarts > 0:
        trigger = "auto"  # a Slurm requeue
    else:
        trigger = "initial" if number == 1 else "manual"
    return LaunchedAttempt(source, number, trigger, last)


# Sends events to the agent now; True when the agent took them (or refused them for good).
PostNow = Callable[[list[AttemptEvent], float], bool]


class AttemptLifecycle:
    """One process's view of its attempt: queues ``started`` / ``first_step`` (``queue``,
    sent by the Reporter's thread) and sends ``ended`` at once (``send_now``), once."""

    def __init__(
        self,
        training_job: str,
        launched: LaunchedAttempt,
        rank: int,
        queue: Callable[[AttemptEvent], None],
        send_now: PostNow,
    ) -> None:
        self.training_job = training_job
        self.launched = launched
        self.lead = rank == 0  # rank 0 speaks for the attempt; any rank may say it failed
        self._queue = queue
        self._send_now = send_now
        self._first_step_sent = False
        self.ended = False

    def _event(self, stage: str, **fields: str | None) -> AttemptEvent:
        launched = self.launched
        return AttemptEvent(
            self.training_job,
            launched.number,
            stage,  # type: ignore[arg-type]
            launched.source,
            time.time(),
            **fields,  # type: ignore[arg-type]
        )

    def started(self) -> None:
        if self.lead:
            self._queue(self._event("started", trigger=self.launched.trigger))

    def first_step(self) -> None:
        if self.lead and not self._first_step_sent and not self.ended:
            self._first_step_sent = True
            self._queue(self._event("first_step"))

    def end(
        self, outcome: Outcome, cause: str | None = None, budget: float = ENDED_BUDGET_S
    ) -> bool:
        """Send ``ended`` now (at most ``budget`` seconds); only the first call sends."""
        if self.ended:
            return False
        self.ended = True
        _PROCESS.forget(self)
        event = self._event("ended", outcome=outcome, cause=cause)
        if outcome == "failed" and self.launched.last:
            event = event._replace(restarts_exhausted=True)
        return self._send_now([event], budget)

    def succeeded(self) -> None:
        """A clean finish: rank 0 says so; on other ranks it ends nothing."""
        if self.lead:
            self.end("success")

    def detach(self) -> None:
        """No longer watch this process's exit for this attempt (its Reporter closed)."""
        _PROCESS.forget(self)


# -- the process's exit: one set of hooks for every lifecycle in it -------------------


class _ProcessExit:
    """The attempts this process watches, and the hooks that see it end (installed once)."""

    def __init__(self) -> None:
        self.active: list[AttemptLifecycle] = []
        self.claimed: set[tuple[str, int]] = set()
        self.lock = threading.Lock()
        self.installed = False
        self.ending = threading.RLock()
        self.wakeup_fds: tuple[int, int] | None = None

    def claim(self, lifecycle: AttemptLifecycle) -> bool:
        with self.lock:
            identity = (lifecycle.training_job, lifecycle.launched.number)
            if identity in self.claimed:
                return False
            self.claimed.add(identity)
            self.active.append(lifecycle)
            self._install()
        return True

    def forget(self, lifecycle: AttemptLifecycle) -> None:
        with self.lock:
            if lifecycle in self.active:
                self.active.remove(lifecycle)

    def after_fork_in_child(self) -> None:
        # A forked child (a DataLoader worker) is not the attempt: its exit must say nothing,
        # and its signals must not wake the parent's watcher through the inherited pipe.
        self.active.clear()
        self.lock = threading.Lock()
        self.ending = threading.RLock()
        if self.wakeup_fds is not None:
            with contextlib.suppress(ValueError):  # not the main thread: nothing to undo
                signal.set_wakeup_fd(-1)
            for fd in self.wakeup_fds:
                os.close(fd)
            self.wakeup_fds = None

    def end_all(self, outcome: Outcome, cause: str | None) -> None:
        """End every attempt this process watches, within ``ENDED_BUDGET_S`` in all."""
        deadline = time.monotonic() + ENDED_BUDGET_S
        # One thread at a time (SIGTERM's watcher, an excepthook); reentrant for a signal
        # handler that runs in the thread already ending.
        with self.ending:
            with self.lock:
                watching = list(self.active)
            for lifecycle in watching:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                lifecycle.end(outcome, cause, remaining)

    def _install(self) -> None:
        if self.installed:
            return
        self.installed = True
        previous = sys.excepthook

        def excepthook(
            kind: type[BaseException], error: BaseException, trace: TracebackType | None
        ) -> None:
            try:
                previous(kind, error, trace)  # the traceback first: the user reads it
            finally:
                outcome: Outcome = "cancelled" if issubclass(kind, KeyboardInterrupt) else "failed"
                self.end_all(outcome, cause_name(kind.__name__))

        sys.excepthook = excepthook
        # Only where nobody handles SIGTERM yet; only the main thread may set a handler.
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        ):
            signal.signal(signal.SIGTERM, self._on_sigterm)
            self._watch_wakeups()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self.after_fork_in_child)

    def _watch_wakeups(self) -> None:
        """See SIGTERM from a thread too. A Python handler runs only when the main thread
        is back in Python: a rank blocked in a collective on a dead peer (NCCL's timeout is
        minutes) would outlive the launcher's SIGTERM until its SIGKILL, where the default
        action killed it at once. The signal's wakeup byte reaches this thread at once."""
        reader, writer = os.pipe()
        os.set_blocking(writer, False)
        try:
            previous = signal.set_wakeup_fd(writer, warn_on_full_buffer=False)
        except ValueError:
            previous = None
        if previous != -1:  # someone else (an event loop) reads the wakeups: leave them
            if previous is not None:
                signal.set_wakeup_fd(previous)
            os.close(reader)
            os.close(writer)
            return
        self.wakeup_fds = (reader, writer)
        threading.Thread(
            target=self._read_wakeups, args=(reader,), name="gpufleet-sigterm", daemon=True
        ).start()

    def _read_wakeups(self, reader: int) -> None:
        pid = os.getpid()
        while True:
            try:
                signals = os.read(reader, 64)
            except OSError:
                return
            if not signals:
                return
            if signal.SIGTERM in signals and os.getpid() == pid:
                self._on_sigterm(signal.SIGTERM, None)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.end_all("failed", "sigterm")
        _die_of_sigterm()


def _die_of_sigterm() -> None:
    """Die of SIGTERM as without the handler: the launcher sees the same exit status."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    else:
        # Only the main thread may set a handler through Python, and it is blocked in C:
        # reset the disposition in the C library (Python's own table is left as it is).
        import ctypes

        reset = ctypes.CDLL(None).signal
        reset.argtypes = (ctypes.c_int, ctypes.c_void_p)
        reset(signal.SIGTERM, None)  # NULL: SIG_DFL
    os.kill(os.getpid(), signal.SIGTERM)


_PROCESS = _ProcessExit()


def claim(
    training_job: str,
    launched: LaunchedAttempt,
    rank: int,
    queue: Callable[[AttemptEvent], None],
    send_now: PostNow,
) -> AttemptLifecycle | None:
    """The lifecycle of this process's attempt, for the first Reporter that asks (a second
    Reporter of the same attempt in the process gets None: the attempt is told once)."""
    lifecycle = AttemptLifecycle(training_job, launched, rank, queue, send_now)
    return lifecycle if _PROCESS.claim(lifecycle) else None
