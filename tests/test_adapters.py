"""The Lightning and Hugging Face adapters, driving real (CPU) training loops."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent.app import Agent, AgentSettings
from gpufleet.client import Reporter

torch = pytest.importorskip("torch")


def start_agent(serve_asgi: Callable[..., Any]) -> tuple[Agent, str]:
    agent = Agent(AgentSettings(node="node-t", gpu_source="none"))
    agent.open()
    return agent, serve_asgi(agent.asgi()).url


def value(agent: Agent, name: str, **labels: str) -> float:
    for family in agent.training.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


class TinyDataset(torch.utils.data.Dataset):  # type: ignore[misc]
    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> dict[str, Any]:
        generator = torch.Generator().manual_seed(index)
        x = torch.randn(4, generator=generator)
        return {"x": x, "labels": x.sum().unsqueeze(0)}


def test_lightning_callback_reports_train_and_validation_batches(
    serve_asgi: Callable[..., Any], tmp_path: Path
) -> None:
    pl = pytest.importorskip("pytorch_lightning")
    from gpufleet.reporter.lightning import GpuFleetCallback

    class Regressor(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
            return torch.nn.functional.mse_loss(self.layer(batch["x"]), batch["labels"])

        def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
            self.layer(batch["x"])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    agent, url = start_agent(serve_asgi)
    reporter = Reporter(url, training_job="lightning-job", rank=0)
    loader = torch.utils.data.DataLoader(TinyDataset(), batch_size=4)  # 8 batches per epoch
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        callbacks=[GpuFleetCallback(reporter, tokens_per_batch=lambda batch: len(batch["x"]))],
        default_root_dir=tmp_path,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(Regressor(), loader, loader)
    reporter.close()
    labels = {"training_job": "lightning-job", "pp_stage": "0"}
    assert value(agent, "gpufleet_training_steps_total", **labels) == 16
    assert value(agent, "gpufleet_training_tokens_total", **labels) == 64
    assert value(agent, "gpufleet_training_phase_steps_total", **labels, phase="eval") == 16
    # validation after the last epoch is reported at train step 16, the steps done so far
    assert value(agent, "gpufleet_training_step_number", **labels) == 16
    assert value(agent, "gpufleet_training_step_seconds_total", **labels) > 0


def test_huggingface_callback_reports_every_optimizer_step(
    serve_asgi: Callable[..., Any], tmp_path: Path
) -> None:
    transformers = pytest.importorskip("transformers")
    from gpufleet.reporter.huggingface import GpuFleetTrainerCallback

    class Regressor(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def forward(self, x: Any, labels: Any) -> dict[str, Any]:
            return {"loss": torch.nn.functional.mse_loss(self.layer(x), labels)}

    agent, url = start_agent(serve_asgi)
    reporter = Reporter(url, training_job="hf-job", rank=0)
    arguments = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=6,
        per_device_train_batch_size=4,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=Regressor(),
        args=arguments,
        train_dataset=TinyDataset(),
        callbacks=[GpuFleetTrainerCallback(reporter, tokens_per_step=lambda state: 4)],
    )
    trainer.train()
    reporter.close()
    labels = {"training_job": "hf-job", "pp_stage": "0"}
    assert value(agent, "gpufleet_training_steps_total", **labels) == 6
    assert value(agent, "gpufleet_training_step_number", **labels) == 6
    assert value(agent, "gpufleet_training_tokens_total", **labels) == 24


class TokenDataset(torch.utils.data.Dataset):  # type: ignore[misc]
    """Sequences of 3 token ids, the layout Hugging Face models take."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> dict[str, Any]:
        ids = torch.tensor([index % 5, (index + 1) % 5, (index + 2) % 5])
        return {"input_ids": ids, "labels": ids.float().sum().unsqueeze(0)}


class TokenRegressor(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(5, 2)

    def forward(self, input_ids: Any, labels: Any) -> dict[str, Any]:
        predicted = self.embed(input_ids).sum(dim=(1, 2)).unsqueeze(1)
        return {"loss": torch.nn.functional.mse_loss(predicted, labels)}


def test_lightning_callback_counts_input_ids_tokens_by_default(
    serve_asgi: Callable[..., Any], tmp_path: Path
) -> None:
    pl = pytest.importorskip("pytorch_lightning")
    from gpufleet.reporter.lightning import GpuFleetCallback

    class Module(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.model = TokenRegressor()

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
            return self.model(**batch)["loss"]

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    agent, url = start_agent(serve_asgi)
    reporter = Reporter(url, training_job="lightning-tokens", rank=0)
    loader = torch.utils.data.DataLoader(TokenDataset(), batch_size=4)  # 4 batches of 4x3
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        callbacks=[GpuFleetCallback(reporter)],
        default_root_dir=tmp_path,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Module(), loader)
    reporter.close()
    labels = {"training_job": "lightning-tokens", "pp_stage": "0"}
    assert value(agent, "gpufleet_training_steps_total", **labels) == 4
    assert value(agent, "gpufleet_training_tokens_total", **labels) == 4 * 4 * 3


def test_huggingface_callback_counts_each_steps_input_ids_by_default(
    serve_asgi: Callable[..., Any], tmp_path: Path
) -> None:
    transformers = pytest.importorskip("transformers")
    from gpufleet.reporter.huggingface import GpuFleetTrainerCallback

    agent, url = start_agent(serve_asgi)
    reporter = Reporter(url, training_job="hf-tokens", rank=0)
    arguments = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,  # a step is two micro-batches: 2 x 2 x 3 tokens
        eval_strategy="steps",
        eval_steps=1,  # evaluation forwards between steps are not counted as training
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=TokenRegressor(),
        args=arguments,
        train_dataset=TokenDataset(),
        eval_dataset=TokenDataset(),
        callbacks=[GpuFleetTrainerCallback(reporter)],
    )
    trainer.train()
    reporter.close()
    labels = {"training_job": "hf-tokens", "pp_stage": "0"}
    assert value(agent, "gpufleet_training_steps_total", **labels) == 3
    assert value(agent, "gpufleet_training_tokens_total", **labels) == 3 * 2 * 2 * 3


def test_client_import_does_not_import_frameworks() -> None:
    import subprocess
    import sys

    heavy = ("torch", "transformers", "pytorch_lightning", "fastapi", "pydantic")
    probe = f"import sys, gpufleet.client; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    output = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert output.stdout.strip() == "[]"
