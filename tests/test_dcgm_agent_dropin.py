"""gpufleet's agent as a drop-in for dcgm-exporter: every field of dcgm-exporter's stock
counters file under the same name and type, its label set (driver version included),
err_code / err_msg on the last XID, the profiling families from the first snapshot,
and the node label named as the fleet's dcgm-exporter names it."""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.app import Agent, AgentSettings
from gpufleet.devstack import PrometheusServer, http_get, static_scrape_config, wait_until
from gpufleet.exposition import render
from gpufleet.gpu import catalogue as cat
from gpufleet.gpu.dcgm_shape import DcgmNode, parse_counters
from gpufleet.gpu.dcgm_shape import render as render_dcgm
from gpufleet.gpu.fake import FakeNvml
from gpufleet.gpu.reader import NvmlReader
from gpufleet.gpu.render import gpu_families
from gpufleet.gpu.xid import XidLedger

# Fields a bare-metal H100 has no answer for (dcgm-exporter omits them there too).
NOT_ON_BARE_METAL = {cat.VGPU_LICENSE_STATUS.name}


def stock_counters() -> str:
    path = resources.files("gpufleet.gpu").joinpath("fixtures/dcgm-exporter-default-counters.csv")
    return path.read_text("utf-8")


def families(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def first_snapshot_text(nvml: FakeNvml, **kwargs: Any) -> str:
    reader = NvmlReader(nvml, "node-a")
    reader.open()
    ledger = XidLedger()
    ledger.set_watching(True)
    return render(gpu_families(reader.read(), ledger.view(), **kwargs)).decode()


def test_every_stock_dcgm_exporter_field_has_its_name_type_and_labels(
    fake_nvml: FakeNvml,
) -> None:
    ours = families(first_snapshot_text(fake_nvml))
    theirs = families(render_dcgm(DcgmNode.with_gpus("node-a"), parse_counters(stock_counters())))
    for name, family in theirs.items():
        if name in NOT_ON_BARE_METAL:
            assert name not in ours
            continue
        assert name in ours, f"{name} is in dcgm-exporter's stock counters, not in the agent's"
        assert ours[name].type == family.type, name
        expected = set(family.samples[0].labels)
        for sample in ours[name].samples:
            assert set(sample.labels) == expected, name


def test_the_profiling_families_are_in_the_first_snapshot(fake_nvml: FakeNvml) -> None:
    ours = families(first_snapshot_text(fake_nvml))
    for name in ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE"):
        assert len(ours[name].samples) == 8, name
    grs = {s.labels["gpu"]: s.value for s in ours["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].samples}
    assert grs["0"] == pytest.approx(0.9777)


def test_encoder_decoder_and_vgpu_license_where_nvml_has_them(fake_nvml: FakeNvml) -> None:
    fake_nvml.set_value(
        2,
        "nvmlDeviceGetGridLicensableFeatures",
        {"isGridLicenseSupported": 1, "featureStates": [0, 1]},
    )
    fake_nvml.set_value(3, "nvmlDeviceGetDecoderUtilization", [37, 167000])
    ours = families(first_snapshot_text(fake_nvml))
    license_status = {s.labels["gpu"]: s.value for s in ours[cat.VGPU_LICENSE_STATUS.name].samples}
    assert license_status == {"2": 1.0}  # only where NVML answers: a vGPU guest
    decoder = {s.labels["gpu"]: s.value for s in ours[cat.DEC_UTIL.name].samples}
    assert decoder["3"] == 37 and decoder["0"] == 0
    assert len(ours[cat.ENC_UTIL.name].samples) == 8


def test_the_last_xid_carries_err_code_and_err_msg(fake_nvml: FakeNvml) -> None:
    reader = NvmlReader(fake_nvml, "node-a")
    reader.open()
    snapshot = reader.read()
    ledger = XidLedger()
    ledger.set_watching(True)
    ledger.record(snapshot.gpus[4].identity.uuid, 79, 1.0)
    ledger.record(snapshot.gpus[5].identity.uuid, 999, 1.0)
    text = render(gpu_families(snapshot, ledger.view())).decode()
    last = {s.labels["gpu"]: s.labels for s in families(text)["DCGM_FI_DEV_XID_ERRORS"].samples}
    assert (last["4"]["err_code"], last["4"]["err_msg"]) == ("79", "GPU has fallen off the bus")
    assert (last["5"]["err_code"], last["5"]["err_msg"]) == ("999", "Unknown Error")
    assert (last["0"]["err_code"], last["0"]["err_msg"]) == ("0", "No Error")


def test_every_gpu_series_carries_the_driver_version_and_the_chosen_node_label(
    fake_nvml: FakeNvml,
) -> None:
    text = first_snapshot_text(fake_nvml, node_label="hostname")
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            assert sample.labels.get("DCGM_FI_DRIVER_VERSION") == "570.86.15", sample.name
            assert sample.labels.get("hostname") == "node-a", sample.name
            assert "Hostname" not in sample.labels, sample.name


@pytest.mark.integration
def test_the_agent_is_ready_with_profiling_series_and_the_configured_node_label(
    fake_nvml: FakeNvml,
    serve_asgi: Callable[..., Any],
    prometheus_factory: Callable[..., PrometheusServer],
) -> None:
    settings = AgentSettings(node="gpu-node-07", gpu_interval=60.0, node_label="hostname")
    agent = Agent(settings, nvml=fake_nvml)
    agent.open()
    server = serve_asgi(agent.asgi())
    wait_until(lambda: http_get(f"{server.url}/readyz"), 30, what="agent ready")
    # the first scrape after ready, long before a second NVML cycle (60 s)
    first = families(http_get(f"{server.url}/metrics").decode())
    assert len(first["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].samples) == 8
    prometheus = prometheus_factory(
        scrape_configs=[static_scrape_config("gpufleet-agent", [f"127.0.0.1:{server.port}"])]
    )
    prometheus.wait_for_targets_up(1)
    series = prometheus.wait_for_series('DCGM_FI_PROF_GR_ENGINE_ACTIVE{hostname="gpu-node-07"}', 8)
    assert series[0]["metric"]["DCGM_FI_DRIVER_VERSION"] == "570.86.15"
