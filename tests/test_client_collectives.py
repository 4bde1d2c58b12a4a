"""``Reporter.watch``: a DDP or FSDP2 rank's own work apart from its wait for peers, on
real ``torch.distributed`` (gloo, CPU) processes."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytest.importorskip("torch.multiprocessing")

from gpufleet.client import Reporter  # noqa: E402
from gpufleet.reporter.collectives import (  # noqa: E402
    CollectiveWait,
    NoCollectives,
    data_parallel_wrapper,
    watch_model,
)
from torch_ranks import end_distributed, run_ranks  # noqa: E402

WORLD = 2
STEPS = 30
EXTRA_S = 0.03  # the slow rank's extra time before its backward, a slow GPU's kernels


def model() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))


class Trained:
    """The model, data-parallel as ``kind`` says (``gpufleet.lab.parallel``: DDP; FSDP2,
    ``fully_shard`` on each linear layer and on the whole; a DeepSpeed ZeRO-2 engine),
    and its training step."""

    def __init__(self, kind: str) -> None:
        from gpufleet.lab.parallel import data_parallel

        self.kind = kind
        if kind == "deepspeed":
            # what torchrun sets and DeepSpeed reads (one host: the rank)
            os.environ.setdefault("LOCAL_RANK", str(dist.get_rank()))
        self.model, self._step = data_parallel(kind, model(), lr=0.1, micro_batch=8)

    def step(self, x: Any, slow_s: float) -> None:
        loss = self.model(x).pow(2).mean()
        time.sleep(slow_s)
        self._step(loss)

    def parameters(self) -> list[Any]:
        if self.kind == "fsdp":
            return [p.full_tensor().detach() for p in self.model.parameters()]
        return [p.detach().clone() for p in self.model.parameters()]


def train(rank: int, store: str, out: str, watched: bool, slow_rank: int, kind: str) -> None:
    """One rank: STEPS steps; writes its waits and final parameters to ``out``."""
    torch.set_num_threads(1)
    # a file store, not a TCP port picked before use: another run on the machine may take
    # a port between its pick and its bind (a rank then met a stranger's store and aborted)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, init_method=f"file://{store}")
    trained = Trained(kind)
    wait = watch_model(trained.model) if watched else None
    assert wait is None or not isinstance(wait, NoCollectives)
    assert not watched or watch_model(trained.model) is wait  # watched twice: timed once
    generator = torch.Generator().manual_seed(rank)
    waits = []
    for _ in range(STEPS):
        x = torch.randn(8, 16, generator=generator)
        trained.step(x, EXTRA_S if rank == slow_rank else 0.0)
        if wait is not None:
            waits.append(wait.take())
    torch.save({"waits": waits, "params": trained.parameters()}, out)
    dist.barrier()
    del trained, wait
    end_distributed()


def run(tmp_path: Path, watched: bool, slow_rank: int = 1, kind: str = "ddp") -> list[Any]:
    name = f"{kind}-{'watched' if watched else 'plain'}"
    outs = [str(tmp_path / f"{name}-{rank}.pt") for rank in range(2)]
    store = str(tmp_path / f"{name}-store")
    run_ranks(_entry, (store, outs, watched, slow_rank, kind), WORLD, timeout_s=timeout_s(kind))
    return [torch.load(out) for out in outs]


def _entry(
    rank: int, store: str, outs: list[str], watched: bool, slow_rank: int, kind: str
) -> None:
    train(rank, store, outs[rank], watched, slow_rank, kind)


KINDS = ["ddp", "fsdp", "deepspeed"]


def timeout_s(kind: str) -> float:
    # DeepSpeed's first start on a machine compiles its shared-memory collectives (where a
    # C++ compiler is found): the first DeepSpeed test took 42 s with it here (alone),
    # 97 s in a loaded make test
    return 300.0 if kind == "deepspeed" else 120.0


def needs(kind: str) -> None:
    if kind == "deepspeed":
        pytest.importorskip("deepspeed")


@pytest.mark.parametrize("kind", KINDS)
def test_the_rank_that_waits_for_a_slow_peer_reports_the_wait_and_the_slow_rank_does_not(
    tmp_path: Path, kind: str
) -> None:
    needs(kind)
    healthy, slow = run(tmp_path, watched=True, kind=kind)
    healthy_wait = statistics.median(healthy["waits"][5:])
    slow_wait = statistics.median(slow["waits"][5:])
    # The healthy rank had its gradients ready EXTRA_S before the slow one and waited.
    assert healthy_wait > 0.6 * EXTRA_S, (healthy_wait, slow_wait)
    assert slow_wait < healthy_wait - 0.4 * EXTRA_S, (healthy_wait, slow_wait)


@pytest.mark.parametrize("kind", KINDS)
def test_the_timing_leaves_the_gradients_as_the_framework_averages_them(
    tmp_path: Path, kind: str
) -> None:
    needs(kind)
    watched = run(tmp_path, watched=True, kind=kind)
    plain = run(tmp_path, watched=False, kind=kind)
    for rank in range(WORLD):
        for mine, theirs in zip(watched[rank]["params"], plain[rank]["params"], strict=True):
            assert torch.equal(mine, theirs)
    # and the ranks agree with each other: the all-reduce ran
    for mine, theirs in zip(watched[0]["params"], watched[1]["params"], strict=True):
        assert torch.equal(mine, theirs)


def test_a_watched_step_sends_its_wait_and_the_rest_of_the_step_as_compute() -> None:
    reporter = Reporter("http://127.0.0.1:9", training_job="j", rank=0, enabled=True)
    try:

        class Waited:
            def take(self) -> float:
                return 0.25

        reporter._collectives = Waited()  # type: ignore[assignment]
        reporter.record_step(1.0, data_wait_s=0.1, step=3)
        event = reporter._buffer[-1]
        assert event.comm_wait_s == pytest.approx(0.25)
        assert event.compute_s == pytest.approx(0.65)
        # a split the caller timed itself is kept
        reporter.record_step(1.0, compute_s=0.5, step=4)
        assert reporter._buffer[-1].compute_s == 0.5
    finally:
        reporter.enabled = False


def test_a_model_of_a_single_process_job_waits_on_nothing() -> None:
    assert not dist.is_initialized()
    assert isinstance(watch_model(model()), NoCollectives)
    reporter = Reporter("http://127.0.0.1:9", training_job="j", rank=0)
    try:
        assert reporter.watch(model())
        reporter.record_step(0.5, data_wait_s=0.1)
        event = reporter._buffer[-1]
        assert event.compute_s == pytest.approx(0.4)  # sent as a timed split
        assert event.comm_wait_s == 0.0
    finally:
        reporter.enabled = False


def test_the_wrapper_of_a_bare_model_is_found(tmp_path: Path) -> None:
    # in a child process: a process group made in pytest's own outlives the test
    run_ranks(_find_wrappers, (str(tmp_path / "store"),), 1)


def _find_wrappers(rank: int, store: str) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    dist.init_process_group("gloo", rank=rank, world_size=1, init_method=f"file://{store}")
    bare = model()
    wrapped = torch.nn.parallel.DistributedDataParallel(bare)
    assert data_parallel_wrapper(bare) is wrapped
    assert data_parallel_wrapper(wrapped) is wrapped
    other = model()
    assert data_parallel_wrapper(other) is other
    # a model already given a hook keeps it, and watch says it cannot time it
    hooked = torch.nn.parallel.DistributedDataParallel(model())
    hooked.register_comm_hook(None, allreduce_hook)
    assert watch_model(hooked) is None
    # passed in, the job's own hook runs inside gpufleet's
    mine = torch.nn.parallel.DistributedDataParallel(model())
    assert isinstance(watch_model(mine, allreduce_hook, None), CollectiveWait)
    mine(torch.randn(4, 16)).sum().backward()
    assert mine.module[0].weight.grad is not None
    del wrapped, hooked, mine
    end_distributed()


def test_the_deepspeed_engine_of_a_bare_model_is_found(tmp_path: Path) -> None:
    # as the Hugging Face callback finds it, from the Trainer's bare model
    pytest.importorskip("deepspeed")
    run_ranks(_find_engine, (str(tmp_path / "store"),), 1, timeout_s=timeout_s("deepspeed"))


def _find_engine(rank: int, store: str) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=1, init_method=f"file://{store}")
    trained = Trained("deepspeed")
    engine = trained.model
    assert data_parallel_wrapper(engine.module) is engine
    assert data_parallel_wrapper(engine) is engine
    other = model()
    assert data_parallel_wrapper(other) is other
    del trained, engine
    end_distributed()


def test_spans_no_step_takes_are_added_up_not_held() -> None:
    # An evaluation loop runs forwards (FSDP2's all-gathers) and no step for a long time:
    # finished spans are added up as they come instead of held one by one.
    from gpufleet.reporter.spans import FOLD_AFTER, CollectiveSpans

    class Work:  # an asynchronous collective that already completed
        def get_future(self) -> Any:
            future: Any = torch.futures.Future()
            future.set_result([torch.zeros(1)])
            return future

    def collective(seconds: float) -> Work | None:
        time.sleep(seconds)
        return Work()

    spans = CollectiveSpans(cuda=False)
    for _ in range(4 * FOLD_AFTER):
        spans.timed(collective, 0.0)
        assert len(spans._completed) <= FOLD_AFTER + 1
    spans.timed(lambda: time.sleep(0.01))  # a synchronous one
    waited = spans.take()
    assert waited >= 0.01
    assert spans.take() == 0.0
