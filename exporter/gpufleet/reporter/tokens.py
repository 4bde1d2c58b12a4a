"""Tokens in a batch, as the adapters count them when the job does not say.

A batch's tokens are the elements of its ``input_ids`` tensor (batch x sequence), the
key Hugging Face models and tokenizers use: padding included, because a padded
position costs the GPU as much as a real one, and the count exists to tell a node
given more work from a slow one. Only the tensor's shape is read, so counting never
waits for the GPU. A batch without ``input_ids`` counts 0 tokens; pass the adapter's
``tokens_per_batch`` / ``tokens_per_step`` for any other layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TOKEN_KEY = "input_ids"  # noqa: S105 - a batch key, not a secret


def input_ids_tokens(batch: Any) -> int:
    """The elements of ``batch["input_ids"]``, or 0 when the batch has no such tensor."""
    if not isinstance(batch, Mapping):
        return 0
    return _numel(batch.get(TOKEN_KEY))


def _numel(value: Any) -> int:
    numel = getattr(value, "numel", None)
    return int(numel()) if callable(numel) else 0


class ForwardTokenCounter:
    """Counts ``input_ids`` elements passed to a module's forward, between resets.

    For loops that hand the batch to the model as keyword arguments and give the
    callback no batch (the Hugging Face Trainer): a forward pre-hook on the model
    sees each micro-batch, so gradient accumulation sums its micro-batches.
    """

    def __init__(self, module: Any) -> None:
        self.tokens = 0
        self._handle = module.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.tokens += _numel(kwargs.get(TOKEN_KEY))

    def take(self) -> int:
        """Tokens counted since the last ``take``."""
        tokens, self.tokens = self.tokens, 0
        return tokens

    def remove(self) -> None:
        self._handle.remove()
