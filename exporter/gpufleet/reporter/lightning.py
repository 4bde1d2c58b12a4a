"""PyTorch Lightning adapter: ``Trainer(callbacks=[GpuFleetCallback()])``.

Importing this module imports Lightning (``lightning.pytorch``, else the older
``pytorch_lightning``); ``gpufleet.client`` itself never does.

Each training batch is one step: its time runs from the end of the previous
batch (so data loading is included and reported as data wait) to the end of
this one. Validation batches are reported with phase ``eval``. On CUDA the
callback synchronises before reading the clock, so asynchronous kernels are
counted in the batch that launched them.

Under the DDP strategy the callback watches the wrapped model (``Reporter.watch``):
each step reports this rank's exposed wait for its peers' gradients apart from its
own compute, which is what finds a slow rank (DDP's all-reduce runs inside
``backward()``, so the batch's time alone is the same on every rank).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone package of Lightning < 2.0 naming
    from pytorch_lightning.callbacks import Callback

from gpufleet.reporter.reporter import Reporter
from gpufleet.reporter.stepclock import StepClock
from gpufleet.reporter.tokens import input_ids_tokens


class GpuFleetCallback(Callback):  # type: ignore[misc]
    """Reports every training and validation batch to the node's gpufleet agent.

    Args:
        reporter: a configured Reporter; by default one is made in ``setup`` with
            the trainer's global rank and ``pp_stage``.
        pp_stage: this rank's pipeline stage (when the reporter is made here).
        tokens_per_batch: returns the number of tokens in a batch; by default the
            elements of ``batch["input_ids"]`` (0 for a batch without it). Tokens let
            the straggler rule tell a node given longer batches from a slow one.
        synchronize_cuda: synchronise CUDA before reading the clock (default True).
        time_collectives: watch the strategy's DDP model to tell this rank's compute
            from its wait for peers (default True).
    """

    def __init__(
        self,
        reporter: Reporter | None = None,
        pp_stage: int = 0,
        tokens_per_batch: Callable[[Any], int] | None = None,
        synchronize_cuda: bool = True,
        time_collectives: bool = True,
    ) -> None:
        super().__init__()
        self._time_collectives = time_collectives
        self.reporter = reporter
        self._pp_stage = pp_stage
        self._tokens = tokens_per_batch or input_ids_tokens
        self._synchronize_cuda = synchronize_cuda
        self._clock = StepClock()
        self._train_steps = 0

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.reporter is None:
            self.reporter = Reporter(rank=int(trainer.global_rank), pp_stage=self._pp_stage)
        device = getattr(pl_module, "device", None)
        if self._synchronize_cuda and getattr(device, "type", "") == "cuda":
            import torch

            self._clock.sync = torch.cuda.synchronize

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        # The strategy wraps the module (DDP) in its setup, after the callbacks' setup.
        if self.reporter is not None and self._time_collectives:
            self.reporter.watch(trainer.strategy.model)

    def _begin(self) -> None:
        self._clock.begin()

    def _end(self, batch: Any, phase: str) -> None:
        step_s, data_wait = self._clock.end()
        tokens = self._tokens(batch)
        if self.reporter is None:
            return
        self.reporter.record_step(
            step_s,
            data_wait_s=data_wait,
            tokens=tokens,
            phase=phase,  # type: ignore[arg-type]
            step=self._train_steps,
        )

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        self._begin()

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._end(batch, "train")
        self._train_steps += 1

    def on_validation_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._begin()

    def on_validation_batch_end(  # noqa: PLR0917 - Lightning's hook signature
        self,
        trainer: Any,
        pl_module: Any,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._end(batch, "eval")

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.reporter is not None:
            self.reporter.finish()
