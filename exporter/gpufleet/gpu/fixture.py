"""The recorded NVML fixtures the fake NVML (``gpu/fake.py``) serves, and their format.

Fixture format (JSON), as written by ``gpufleet nvml-record``::

    {"format": "gpufleet-nvml-fixture/1",
     "system": {"nvmlSystemGetDriverVersion": "570.86.15", ...},
     "devices": [{"nvmlDeviceGetName": "...",
                  "nvmlDeviceGetClockInfo": {"1": 1980, "2": 2619},
                  "nvmlDeviceGetRetiredPages": {"nvml_error": "NVML_ERROR_NOT_SUPPORTED"},
                  "nvmlDeviceGetFieldValues": {"82": {"type": 1, "value": 52}, "140@0": ...},
                  ...}]}

A call's entry is its result, or a mapping from its non-handle arguments
(comma-joined) to results. ``{"nvml_error": NAME}`` is an NVML error. A call
the fixture does not mention answers NVML_ERROR_NOT_SUPPORTED. A field value
read for one scope is keyed ``ID@SCOPE`` (4294967295: every link at once); it
may carry NVML's ``timestamp`` (us since the epoch).

A GPU in MIG mode (``nvmlDeviceGetMigMode`` [1, 1]) lists its MIG devices under
``mig_devices``, by the index ``nvmlDeviceGetMigDeviceHandleByIndex`` takes
(``null``: no MIG device there, NVML_ERROR_NOT_FOUND), each with the answers to
the calls made on its MIG device handle (``nvmlDeviceGetUUID`` "MIG-...",
``nvmlDeviceGetGpuInstanceId``, ``nvmlDeviceGetComputeInstanceId``,
``nvmlDeviceGetName``, ``nvmlDeviceGetAttributes``, ``nvmlDeviceGetMemoryInfo``...);
whatever an entry does not mention, NVML refuses on that handle. GPM metrics of a
GPU instance (``nvmlGpmMigSampleGet`` on the parent with the instance's id) are
under the parent's ``nvmlGpmMigMetricsGet``, keyed by GPU instance id.

``nvmlDeviceGetGpuFabricInfoV`` (and the v1 ``nvmlDeviceGetGpuFabricInfo``) is the
struct's fields: ``{"clusterUuid": "<uuid>", "status": 0, "cliqueId": 1, "state": 3}``.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

FIXTURE_FORMAT = "gpufleet-nvml-fixture/1"


def load_fixture(path: str | Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        fixture: dict[str, Any] = json.load(handle)
    if fixture.get("format") != FIXTURE_FORMAT:
        raise ValueError(f"{path}: not a {FIXTURE_FORMAT} fixture")
    return fixture


def bundled_fixture(name: str = "h100-sxm-8gpu") -> dict[str, Any]:
    """A fixture shipped with the package (used by the synthetic source and tests)."""
    text = resources.files("gpufleet.gpu").joinpath(f"fixtures/{name}.json").read_text("utf-8")
    fixture: dict[str, Any] = json.loads(text)
    return fixture
