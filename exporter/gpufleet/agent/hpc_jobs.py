"""Slurm jobs per GPU from dcgm-exporter's hpc-job-mapping directory, read in the background.

The format is dcgm-exporter's (``internal/pkg/transformation/hpc.go``), which a Slurm
prolog / epilog writes (``deploy/slurm/``): one file per GPU, named after its index
(``0``) or, for a MIG instance, ``<index>.<GPU instance id>`` (``0.3``), holding one job
id per line. Other names and directories are ignored. Two deliberate differences:
blank lines and surrounding whitespace are skipped (dcgm-exporter would label a
series ``hpc_job=""``), and the directory is read every ``interval`` seconds in a
thread rather than on each scrape, so a slow file system never slows ``/metrics``.
A missing directory means no jobs (logged once, as dcgm-exporter does).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from gpufleet.gpu.attribution import MAPPING_FILE_NAME

log = logging.getLogger(__name__)

# A file is a job list of a few lines; this bounds what one odd file can cost.
MAX_FILE_BYTES = 64 * 1024


def read_mapping(directory: Path) -> dict[str, tuple[str, ...]]:
    """Mapping file name -> job ids in the file's order. Raises OSError if the directory
    cannot be listed; a file that vanishes or cannot be read while listing is skipped."""
    jobs: dict[str, tuple[str, ...]] = {}
    with os.scandir(directory) as entries:
        for entry in entries:
            if not MAPPING_FILE_NAME.match(entry.name):
                continue
            try:
                if not entry.is_file():
                    continue
                with open(entry.path, "rb") as file:
                    text = file.read(MAX_FILE_BYTES).decode("utf-8", errors="replace")
            except OSError:
                continue  # removed by the epilog between listing and reading
            ids = tuple(line.strip() for line in text.splitlines() if line.strip())
            if ids:
                jobs[entry.name] = ids
    return jobs


class HpcJobMapping:
    """The directory's current mapping, refreshed by a thread; ``version`` counts changes."""

    def __init__(self, directory: str | Path, interval: float = 5.0) -> None:
        self.directory = Path(directory)
        self.interval = interval
        self.version = 0
        self._jobs: Mapping[str, tuple[str, ...]] = MappingProxyType({})
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._missing_logged = False

    def current(self) -> tuple[int, Mapping[str, tuple[str, ...]]]:
        """(version, mapping file name -> job ids), read together."""
        with self._lock:
            return self.version, self._jobs

    def refresh(self) -> None:
        """Read the directory once; the mapping changes (and its version) only if it differs."""
        try:
            jobs = read_mapping(self.directory)
            self._missing_logged = False
        except OSError as error:
            if not self._missing_logged:
                log.warning(
                    "hpc-job-mapping directory %s cannot be read (%s); no hpc_job labels "
                    "until it can",
                    self.directory,
                    error.strerror or error,
                )
                self._missing_logged = True
            jobs = {}
        with self._lock:
            if jobs != self._jobs:
                self._jobs = MappingProxyType(jobs)
                self.version += 1

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self.refresh()
        self._thread = threading.Thread(target=self._loop, name="gpufleet-hpc-jobs", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.refresh()
            except Exception:  # a thread that dies silently would freeze the labels
                log.exception("reading the hpc-job-mapping directory failed")
