"""Hugging Face Transformers adapter: ``Trainer(..., callbacks=[GpuFleetTrainerCallback()])``.

Importing this module imports ``transformers``; ``gpufleet.client`` never does.

One optimizer step of the Trainer is one gpufleet step, timed from the end of
the previous step (so fetching the batch is included and reported as data
wait) to ``on_step_end``. On CUDA the callback synchronises before reading the
clock. Under DDP (``torchrun`` / ``accelerate launch``) the callback watches the
Trainer's DDP model (``Reporter.watch``), so each step reports this rank's exposed
wait for its peers' gradients apart from its own compute: what finds a slow rank.
Checkpoint saves are not timed here (the Trainer has no hook around the
write): wrap your own save in ``reporter.checkpoint()`` if you need them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

from gpufleet.reporter.reporter import Reporter
from gpufleet.reporter.stepclock import StepClock
from gpufleet.reporter.tokens import ForwardTokenCounter


class GpuFleetTrainerCallback(TrainerCallback):  # type: ignore[misc]
    """Reports every optimizer step of a Hugging Face Trainer to the node's agent.

    Args:
        reporter: a configured Reporter; by default one is made at train begin
            with the Trainer's process index as rank.
        pp_stage: this rank's pipeline stage (when the reporter is made here).
        tokens_per_step: returns tokens processed per step, given the TrainerState; by
            default this rank's ``input_ids`` elements passed to the model's forward
            during the step (micro-batches of gradient accumulation summed). Tokens let
            the straggler rule tell a node given longer batches from a slow one.
        synchronize_cuda: synchronise CUDA before reading the clock (default True).
        time_collectives: watch the Trainer's DDP model to tell this rank's compute from
            its wait for peers (default True).
    """

    def __init__(
        self,
        reporter: Reporter | None = None,
        pp_stage: int = 0,
        tokens_per_step: Callable[[Any], int] | None = None,
        synchronize_cuda: bool = True,
        time_collectives: bool = True,
    ) -> None:
        self.reporter = reporter
        self._time_collectives = time_collectives
        self._pp_stage = pp_stage
        self._tokens = tokens_per_step
        self._synchronize_cuda = synchronize_cuda
        self._clock = StepClock()
        self._counter: ForwardTokenCounter | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.reporter is None:
            self.reporter = Reporter(rank=int(args.process_index), pp_stage=self._pp_stage)
        if self._synchronize_cuda and str(getattr(args, "device", "")).startswith("cuda"):
            import torch

            self._clock.sync = torch.cuda.synchronize
        model = kwargs.get("model")
        if self._tokens is None and model is not None and self._counter is None:
            self._counter = ForwardTokenCounter(model)
        if self._time_collectives and model is not None:
            from gpufleet.reporter.collectives import data_parallel_wrapper

            self.reporter.watch(data_parallel_wrapper(model))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._counter is not None:
            self._counter.take()  # forwards between steps (evaluation) are not this step's
        self._clock.begin()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step_s, data_wait = self._clock.end()
        if self.reporter is not None:
            self.reporter.record_step(
                step_s,
                data_wait_s=data_wait,
                tokens=self._step_tokens(state),
                step=int(state.global_step),
            )

    def _step_tokens(self, state: Any) -> int:
        if self._tokens is not None:
            return self._tokens(state)
        return self._counter.take() if self._counter is not None else 0

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._counter is not None:
            self._counter.remove()
            self._counter = None
        if self.reporter is not None:
            self.reporter.finish()
