"""What one node's training process does, in one definition: the harness writes it as
``ddp_worker`` flags, the worker reads it back. Standard library only (the harness side
does not import torch)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

Framework = Literal["ddp", "fsdp", "lightning", "lightning-fsdp", "hf", "deepspeed"]
FRAMEWORKS: tuple[Framework, ...] = get_args(Framework)


@dataclass(frozen=True, slots=True)
class Workload:
    """One node's rank of a lab job.

    A step is ``batch_seqs`` sequences of ``seq_len`` tokens through a small MLP, plus
    ``device_s`` of sleep standing for the GPU kernels a real model would run (on a
    shared 2-core machine, real matmuls of several ranks compete for the same cores, so
    a slow rank's extra work fills its peers' idle time instead of showing as theirs to
    wait for; a sleep holds its rank the way a slower GPU does, and leaves the cores to
    the others).
    """

    framework: Framework = "ddp"
    width: int = 256
    batch_seqs: int = 4
    seq_len: int = 16
    device_s: float = 0.02
    # longer batches on this node: seq_len and device time both times this (more tokens
    # and proportionally more work: an imbalance of the workload, not slow hardware)
    work_factor: float = 1.0
    # a slower GPU on this node: device time times slow_factor from slow_after_s seconds
    # after the job's first step
    slow_factor: float = 1.0
    slow_after_s: float = 0.0
    # the job stops at the first agreed check after stop_file exists or max_seconds passed
    stop_file: str = ""
    max_seconds: float = 600.0
    check_every: int = 10
    # JSON lines: the first step, the slowdown, the end (epoch seconds)
    events_file: str = ""
    seed: int = 0

    @property
    def tokens_per_seq(self) -> int:
        return max(1, round(self.seq_len * self.work_factor))

    @property
    def tokens_per_step(self) -> int:
        return self.batch_seqs * self.tokens_per_seq

    def device_seconds(self, since_first_step_s: float) -> float:
        """The device time of a step this long after the first one."""
        slowed = self.slow_factor if since_first_step_s >= self.slow_after_s else 1.0
        # in proportion to the tokens, as rounded to whole ones
        return self.device_s * self.tokens_per_seq / self.seq_len * slowed

    @property
    def slows(self) -> bool:
        return self.slow_factor != 1.0

    def argv(self) -> list[str]:
        """These fields as ``ddp_worker`` flags."""
        return [
            item
            for spec in dataclasses.fields(self)
            for item in (_flag(spec.name), str(getattr(self, spec.name)))
        ]

    @classmethod
    def from_argv(cls, argv: Sequence[str] | None = None) -> Workload:
        parser = argparse.ArgumentParser(
            prog="python -m gpufleet.lab.ddp_worker",
            description="One rank of a gpufleet lab job (run it under torchrun).",
        )
        defaults = cls()
        for spec in dataclasses.fields(cls):
            default = getattr(defaults, spec.name)
            if spec.name == "framework":
                parser.add_argument(_flag(spec.name), choices=FRAMEWORKS, default=default)
            else:
                parser.add_argument(_flag(spec.name), type=type(default), default=default)
        return cls(**vars(parser.parse_args(argv)))


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")
