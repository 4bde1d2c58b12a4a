"""Tokens read from files (a mounted Kubernetes Secret), the one way every command does it."""

from __future__ import annotations


class SecretFileError(ValueError):
    """A token file that cannot be read or is empty; the message names the file."""


def read_secret_file(path: str) -> str:
    """The token in ``path``, without the trailing newline editors and Secrets add."""
    try:
        with open(path, encoding="utf-8") as handle:
            token = handle.read().strip()
    except OSError as error:
        raise SecretFileError(f"cannot read {path}: {error.strerror}") from None
    if not token:
        raise SecretFileError(f"{path} is empty")
    return token
