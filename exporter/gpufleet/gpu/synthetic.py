"""Plausible, moving values for an 8-GPU H100 node, behind the pynvml API.

``--gpu-source synthetic`` runs the real reader, sampler and renderer against
this stand-in, so a demo exercises exactly the code a GPU node runs. The load
follows a training job: near-full utilisation, with a short dip every ten
minutes (a checkpoint), power and temperature following utilisation, and the
energy, NVLink and violation counters only ever growing.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from typing import Any

from gpufleet.gpu.fake import FakeNvml
from gpufleet.gpu.fake_devices import FakeHandle
from gpufleet.gpu.fixture import bundled_fixture

_CHECKPOINT_PERIOD_S = 600.0
_CHECKPOINT_LENGTH_S = 25.0


class SyntheticNvml(FakeNvml):
    def __init__(
        self,
        gpus: int = 8,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        template = bundled_fixture()
        devices = [dict(template["devices"][i % len(template["devices"])]) for i in range(gpus)]
        rng = random.Random(seed)
        for index, device in enumerate(devices):
            device["nvmlDeviceGetUUID"] = "GPU-" + "-".join(
                "".join(rng.choice("0123456789abcdef") for _ in range(n)) for n in (8, 4, 4, 4, 12)
            )
            device["nvmlDeviceGetMinorNumber"] = index
        super().__init__({"system": template["system"], "devices": devices})
        self._clock = clock
        self._start = clock()
        self._phase = [rng.uniform(0, 2 * math.pi) for _ in devices]
        self._power_base = [rng.uniform(560.0, 640.0) for _ in devices]

    def _load(self, index: int) -> float:
        """Utilisation between 0 and 1 at this moment."""
        elapsed = self._clock() - self._start
        if elapsed % _CHECKPOINT_PERIOD_S > _CHECKPOINT_PERIOD_S - _CHECKPOINT_LENGTH_S:
            return 0.04
        return 0.97 + 0.03 * math.sin(elapsed / 7.0 + self._phase[index])

    def _lookup(
        self, index: int | None, call: str, key: str | None = None, mig: FakeHandle | None = None
    ) -> Any:
        value = super()._lookup(index, call, key, mig)
        if index is None or mig is not None:
            return value
        elapsed = self._clock() - self._start
        load = self._load(index)
        watts = 75.0 + (self._power_base[index] - 75.0) * load
        if call == "nvmlDeviceGetPowerUsage":
            return int(watts * 1000)
        if call == "nvmlDeviceGetTotalEnergyConsumption":
            average_mw = (75.0 + (self._power_base[index] - 75.0) * 0.95) * 1000
            return int(value + average_mw * elapsed)
        if call == "nvmlDeviceGetTemperature":
            return int(32 + watts / 22)
        if call == "nvmlDeviceGetUtilizationRates":
            return {"gpu": round(100 * load), "memory": round(45 * load)}
        if call == "nvmlDeviceGetClockInfo" and key == "1":
            return int(value if load > 0.5 else 1980)
        if call == "nvmlDeviceGetPcieThroughput":
            return int(value * (0.3 + load))
        if call == "nvmlDeviceGetViolationStatus" and key == "0":
            return {**value, "violationTime": int(value["violationTime"] + 2e6 * elapsed)}
        if call == "nvmlGpmMetricsGet":
            return {metric: round(share * load, 2) for metric, share in value.items()}
        if call == "nvmlDeviceGetFieldValues":
            return self._moving_fields(value, elapsed, load)
        return value

    @staticmethod
    def _moving_fields(fields: dict[str, Any], elapsed: float, load: float) -> dict[str, Any]:
        moved = dict(fields)
        for key, entry in fields.items():
            if key.startswith(("138@", "139@")):
                # data over all 18 links, ~12 GB/s per link and direction while training, in KiB
                moved[key] = {**entry, "value": int(entry["value"] + 18 * 12e6 * elapsed * 0.97)}
            elif key == "74":
                # held at the power cap ~0.2% of the time, in ns
                moved[key] = {**entry, "value": int(entry["value"] + 2e6 * elapsed)}
            elif key == "82":
                moved[key] = {**entry, "value": int(entry["value"] - 8 + 10 * load)}
        return moved
