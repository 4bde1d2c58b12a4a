"""The dcgm-exporter-shaped fixture renders what dcgm-exporter serves for a counters file."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.lab import dcgm_counters
from gpufleet.lab.dcgm_shape import CountersError, DcgmNode, Pod, parse_counters, render
from gpufleet.schema import gpu as cat
from gpufleet.schema.external import DCGM_EXPORTER_ONLY

ROOT = Path(__file__).resolve().parents[1]
RECOMMENDED = ROOT / "deploy" / "dcgm-exporter" / "gpufleet-counters.csv"


def stock() -> str:
    path = resources.files("gpufleet.gpu").joinpath("fixtures/dcgm-exporter-default-counters.csv")
    return path.read_text("utf-8")


def names(text: str) -> set[str]:
    return {family.name for family in text_string_to_metric_families(text)}


def test_the_stock_file_lacks_what_is_opt_in_and_the_recommended_file_has_it() -> None:
    node = DcgmNode.with_gpus("n1", 2)
    stock_names = names(render(node, parse_counters(stock())))
    recommended = names(render(node, parse_counters(RECOMMENDED.read_text())))
    opt_in = {
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "DCGM_EXP_XID_ERRORS_COUNT",
    }
    assert not opt_in & stock_names
    assert opt_in <= recommended
    assert stock_names <= recommended
    assert "DCGM_FI_DRIVER_VERSION" not in recommended  # a label, not a series


def test_labels_in_dcgm_exporter_order_with_driver_pod_and_xid_attributes() -> None:
    node = DcgmNode.with_gpus("n1", 1)
    gpu = node.gpu(0)
    gpu.pod = Pod("train-0", "ml", "main")
    gpu.xid(79)
    counters = parse_counters(
        "DCGM_FI_DEV_XID_ERRORS, gauge, last\nDCGM_FI_DRIVER_VERSION, label, Driver\n"
        "DCGM_EXP_XID_ERRORS_COUNT, counter, count\n"
    )
    lines = [line for line in render(node, counters, "hostname").splitlines() if "{" in line]
    assert lines[0] == (
        'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-n1-0000",pci_bus_id="00000000:18:00.0",'
        'device="nvidia0",modelName="NVIDIA H100 80GB HBM3",hostname="n1",'
        'DCGM_FI_DRIVER_VERSION="570.86.15",container="main",err_code="79",'
        'err_msg="GPU has fallen off the bus",namespace="ml",pod="train-0"} 79'
    )
    assert 'window_size_in_ms="300000",xid="79"} 1' in lines[1]


def test_no_xid_in_the_window_is_one_zero_series_without_xid() -> None:
    node = DcgmNode.with_gpus("n1", 1)
    text = render(node, parse_counters("DCGM_EXP_XID_ERRORS_COUNT, counter, count\n"))
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    assert len(samples) == 1 and "xid" not in samples[0].labels and samples[0].value == 0
    assert samples[0].labels["Hostname"] == "n1"


def test_a_malformed_counters_line_names_its_line() -> None:
    with pytest.raises(CountersError, match=r"x\.csv:2: type 'histogram'"):
        parse_counters("# c\nDCGM_FI_DEV_GPU_TEMP, histogram, t\n", "x.csv")
    with pytest.raises(CountersError, match=r"x\.csv:1: expected 'FIELD, type, help'"):
        parse_counters("DCGM_FI_DEV_GPU_TEMP gauge\n", "x.csv")


def test_the_recommended_file_declares_each_field_as_gpufleet_s_schema_does() -> None:
    """dcgm-exporter serves each field under the type its counters file gives: gpufleet's
    file must give the schema's (DCGM_EXP_XID_ERRORS_COUNT a gauge: a count over a sliding
    window falls as XIDs age out; NVLINK_BANDWIDTH_TOTAL a gauge: DCGM's rate)."""
    schema = {metric.name: metric for metric in (*cat.GPU_FAMILIES, *DCGM_EXPORTER_ONLY)}
    for counter in parse_counters(RECOMMENDED.read_text()):
        if counter.kind == "label":
            continue
        assert counter.name in schema, counter.name
        assert counter.kind == schema[counter.name].kind, counter.name


def test_the_recommended_file_is_the_one_the_schema_writes() -> None:
    # Names and types from the schema's families (make generate writes the file).
    assert RECOMMENDED.read_text() == dcgm_counters.render()
