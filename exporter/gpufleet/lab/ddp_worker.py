"""One rank of a lab job, under ``torchrun``: ``python -m gpufleet.lab.ddp_worker
--framework ddp|fsdp|lightning|lightning-fsdp|hf|deepspeed ...`` (the flags are
``Workload``'s fields).

Each framework is instrumented only as its user would be told to: the plain loop with
``Reporter()``, ``reporter.watch(model)`` (a DDP model, or one sharded by FSDP2's
``fully_shard``, or a DeepSpeed ZeRO-2 engine) and ``with reporter.step(tokens=n)``;
Lightning (its DDP strategy, or its FSDP2 ``ModelParallelStrategy``) with
``callbacks=[GpuFleetCallback()]``; the Hugging Face Trainer with
``callbacks=[GpuFleetTrainerCallback()]``. The one thing the harness adds is how the job
stops: every ``check_every`` steps the ranks agree (a MAX all-reduce, outside the timed
step) whether to stop, so that every rank stops after the same step and exits cleanly,
which a rank stopping alone would turn into a hang in its peers' all-reduce.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gpufleet.lab.parallel import data_parallel, shard_layers
from gpufleet.lab.workload import Workload

POOL_BATCHES = 8  # distinct batches cycled through: enough to be real data, cheap to make
DATASET_LEN = 1_000_000  # sequences; more than any lab run steps through


class Timeline:
    """This rank's moments the harness reads back: its first step, its slowdown, its end."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._rank = int(os.environ.get("RANK", "0"))

    def write(self, event: str, at: float, **extra: object) -> None:
        if not self._path:
            return
        line = json.dumps({"event": event, "at": at, "rank": self._rank, **extra})
        with open(self._path, "a", encoding="utf-8") as out:
            out.write(line + "\n")


class DeviceTime:
    """The sleep each forward pass holds in place of a GPU's kernels (``Workload``)."""

    def __init__(self, workload: Workload, timeline: Timeline) -> None:
        self._workload = workload
        self._timeline = timeline
        self._first: float | None = None
        self._slowed = False

    def run(self) -> None:
        now = time.time()
        if self._first is None:
            self._first = now
            self._timeline.write("first_step", now)
        elapsed = now - self._first
        if self._workload.slows and not self._slowed and elapsed >= self._workload.slow_after_s:
            self._slowed = True
            self._timeline.write("slow", now, factor=self._workload.slow_factor)
        time.sleep(self._workload.device_seconds(elapsed))


class TokenMlp(torch.nn.Module):  # type: ignore[misc]
    """An MLP over every token of a batch of sequences, after its device time."""

    def __init__(self, width: int, device_time: DeviceTime) -> None:
        super().__init__()
        self.device_time = device_time
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, 1),
        )

    def forward(self, inputs: Any, labels: Any = None) -> Any:
        self.device_time.run()
        predicted = self.layers(inputs)
        if labels is None:
            return predicted
        # the shape the Hugging Face Trainer takes from a model: a dict with the loss
        return {"loss": torch.nn.functional.mse_loss(predicted, labels)}


class SequenceDataset(torch.utils.data.Dataset):  # type: ignore[misc]
    """Sequences of ``tokens_per_seq`` tokens, cycled from a small pool made once."""

    def __init__(self, workload: Workload) -> None:
        generator = torch.Generator().manual_seed(workload.seed + int(os.environ.get("RANK", "0")))
        shape = (POOL_BATCHES * workload.batch_seqs, workload.tokens_per_seq)
        self._inputs = torch.randn(*shape, workload.width, generator=generator)
        self._labels = torch.randn(*shape, 1, generator=generator)

    def __len__(self) -> int:
        return DATASET_LEN

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = index % len(self._inputs)
        return {"inputs": self._inputs[row], "labels": self._labels[row]}


class StopAgreement:
    """Whether every rank stops now: asked (the stop file exists) or out of time on any
    rank, agreed every ``check_every`` steps."""

    def __init__(self, workload: Workload) -> None:
        self._workload = workload
        self._steps = 0
        self._deadline = time.monotonic() + workload.max_seconds

    def should_stop(self) -> bool:
        self._steps += 1
        if self._steps % self._workload.check_every:
            return False
        stop_file = self._workload.stop_file
        asked = bool(stop_file) and Path(stop_file).exists()
        flag = torch.tensor([1.0 if asked or time.monotonic() > self._deadline else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)


def batches(workload: Workload) -> Iterator[dict[str, Any]]:
    loader = torch.utils.data.DataLoader(SequenceDataset(workload), batch_size=workload.batch_seqs)
    yield from loader


def train_plain(workload: Workload, model: TokenMlp) -> int:
    """A hand-written loop over a DDP model, an FSDP2-sharded one or a DeepSpeed engine,
    with the README's lines."""
    from gpufleet.client import Reporter

    dist.init_process_group("gloo")
    wrapped, backward_and_step = data_parallel(
        workload.framework, model, micro_batch=workload.batch_seqs
    )
    reporter = Reporter()
    reporter.watch(wrapped)
    stop = StopAgreement(workload)
    steps = 0
    for batch in batches(workload):
        with reporter.step(tokens=workload.tokens_per_step):
            backward_and_step(wrapped(batch["inputs"], batch["labels"])["loss"])
        steps += 1
        if stop.should_stop():
            break
    reporter.finish()
    dist.destroy_process_group()
    return steps


def train_lightning(workload: Workload, model: TokenMlp) -> int:
    try:  # the same package the adapter's Callback comes from
        import lightning.pytorch as pl
        from lightning.pytorch.strategies import ModelParallelStrategy
    except ImportError:
        import pytorch_lightning as pl
        from pytorch_lightning.strategies import ModelParallelStrategy
    world = int(os.environ["WORLD_SIZE"])
    fsdp = workload.framework == "lightning-fsdp"

    from gpufleet.reporter.lightning import GpuFleetCallback

    class LitTokenMlp(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, inputs: Any, labels: Any) -> Any:
            return self.model(inputs, labels)

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
            return self(batch["inputs"], batch["labels"])["loss"]

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

        def configure_model(self) -> None:
            if fsdp:  # Lightning's FSDP2 strategy shards here, on its device mesh
                shard_layers(self.model, self.device_mesh["data_parallel"])

    class StopWhenAgreed(pl.Callback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.agreement = StopAgreement(workload)

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if self.agreement.should_stop():
                trainer.should_stop = True

    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        num_nodes=world,
        strategy=ModelParallelStrategy(data_parallel_size=world, tensor_parallel_size=1)
        if fsdp
        else "ddp",
        max_epochs=-1,
        callbacks=[GpuFleetCallback(), StopWhenAgreed()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tempfile.mkdtemp(prefix="gpufleet-lab-"),
    )
    loader = torch.utils.data.DataLoader(SequenceDataset(workload), batch_size=workload.batch_seqs)
    trainer.fit(LitTokenMlp(), train_dataloaders=loader)
    return int(trainer.global_step)


def train_hf(workload: Workload, model: TokenMlp) -> int:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from gpufleet.reporter.huggingface import GpuFleetTrainerCallback

    class StopWhenAgreed(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.agreement = StopAgreement(workload)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.agreement.should_stop():
                control.should_training_stop = True

    arguments = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="gpufleet-lab-"),
        per_device_train_batch_size=workload.batch_seqs,
        max_steps=DATASET_LEN // workload.batch_seqs,
        learning_rate=1e-3,
        use_cpu=True,
        ddp_backend="gloo",
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=workload.seed,
    )
    trainer = Trainer(
        model=model,
        args=arguments,
        train_dataset=SequenceDataset(workload),
        callbacks=[GpuFleetTrainerCallback(), StopWhenAgreed()],
    )
    trainer.train()
    return int(trainer.state.global_step)


TRAINERS = {
    "ddp": train_plain,
    "fsdp": train_plain,
    "deepspeed": train_plain,
    "lightning": train_lightning,
    "lightning-fsdp": train_lightning,
    "hf": train_hf,
}


def main(argv: Sequence[str] | None = None) -> int:
    workload = Workload.from_argv(argv)
    # one intra-op thread per rank: a rank stands for one GPU, and several share the cores
    torch.set_num_threads(1)
    torch.manual_seed(workload.seed)  # the same initial weights on every rank
    timeline = Timeline(workload.events_file)
    model = TokenMlp(workload.width, DeviceTime(workload, timeline))
    steps = TRAINERS[workload.framework](workload, model)
    timeline.write("end", time.time(), steps=steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
