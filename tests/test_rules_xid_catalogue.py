"""The XID catalogue: NVIDIA's buckets to gpufleet's classes, and every documented code
through the real rules (one promtool run for all of them)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.gpu.xid_catalogue import (
    CATALOGUE,
    CLASS_OVERRIDES,
    DCGM_MESSAGES,
    UNKNOWN_MESSAGE,
    XID_ROWS,
    XidClass,
    XidRow,
    xid_action,
    xid_class,
)
from gpufleet.lab.processes import find_binary
from gpufleet.rules.attribution import ATTRIBUTION_WHO

ALERTS_DIR = Path(__file__).resolve().parents[1] / "alerts"
UNKNOWN_CODE = 999  # in no catalogue

# What each class does, as the RUNBOOK documents it: the alert and its severity.
PAGES: dict[XidClass, tuple[str, str] | None] = {
    XidClass.ACT_NOW: ("GpuFleetCriticalXid", "critical"),
    XidClass.MAINTENANCE: ("GpuFleetMaintenanceXid", "warning"),
    XidClass.APPLICATION: ("GpuFleetApplicationXid", "info"),
    XidClass.INFORMATIONAL: None,
    # on a GPU that reports no recovery action (dcgm-exporter's stock counters)
    XidClass.RECOVERY_ACTION: ("GpuFleetCriticalXid", "critical"),
    XidClass.UNCLASSIFIED: ("GpuFleetUnclassifiedXid", "warning"),
}

# Read off NVIDIA's catalogue by hand (immediate / investigatory bucket), not from the
# table: what the derivation must give for the codes the issue names.
NVIDIA_SAYS: dict[int, XidClass] = {
    **dict.fromkeys((46, 109, 110, 136, 143, 155, 156, 158), XidClass.ACT_NOW),  # RESET_GPU
    **dict.fromkeys((119, 120), XidClass.ACT_NOW),  # RESET_GPU / INVESTIGATE_SW
    **dict.fromkeys(range(144, 151), XidClass.ACT_NOW),  # WORKFLOW_NVLINK5_ERR
    48: XidClass.ACT_NOW,  # WORKFLOW_XID_48
    64: XidClass.ACT_NOW,  # RESET_GPU / CONTACT_SUPPORT
    74: XidClass.ACT_NOW,  # WORKFLOW_NVLINK_ERR
    79: XidClass.ACT_NOW,  # RESTART_BM
    95: XidClass.ACT_NOW,  # RESET_GPU
    92: XidClass.MAINTENANCE,  # IGNORE / CONTACT_SUPPORT
    121: XidClass.MAINTENANCE,  # C2C: IGNORE / CONTACT_SUPPORT
    137: XidClass.MAINTENANCE,  # IGNORE / XID_137_FLOW
    157: XidClass.MAINTENANCE,  # IGNORE / CONTACT_SUPPORT
    13: XidClass.APPLICATION,  # RESTART_APP
    31: XidClass.APPLICATION,  # RESTART_APP
    94: XidClass.APPLICATION,  # RESTART_APP / IGNORE (sympathetic)
    45: XidClass.APPLICATION,  # WORKFLOW_XID_45
    63: XidClass.INFORMATIONAL,  # IGNORE / IGNORE
    154: XidClass.RECOVERY_ACTION,  # XID_154
    1: XidClass.UNCLASSIFIED,  # Unused
    61: XidClass.UNCLASSIFIED,  # Unused
}


@pytest.mark.parametrize("code", sorted(NVIDIA_SAYS))
def test_the_class_follows_nvidias_buckets(code: int) -> None:
    row = next(row for row in XID_ROWS if row.code == code)
    assert xid_class(row) is NVIDIA_SAYS[code]


def test_the_derivation_reads_the_buckets_not_the_code() -> None:
    def row(immediate: str, investigatory: str, description: str = "x") -> XidRow:
        return XidRow(500, "M", description, immediate, investigatory, "t")

    assert xid_class(row("RESET_GPU", "CONTACT_SUPPORT")) is XidClass.ACT_NOW
    assert xid_class(row("RESTART_BM", "")) is XidClass.ACT_NOW
    assert xid_class(row("RESTART_APP", "CONTACT_SUPPORT")) is XidClass.APPLICATION
    assert xid_class(row("IGNORE", "IGNORE")) is XidClass.INFORMATIONAL
    assert xid_class(row("IGNORE", "CHECK_APP/CUDA")) is XidClass.APPLICATION
    assert xid_class(row("IGNORE", "INVESTIGATE_SW")) is XidClass.MAINTENANCE
    assert xid_class(row("UPDATE_SWFW", "UPDATE_SWFW")) is XidClass.MAINTENANCE
    assert xid_class(row("XID_154", "")) is XidClass.RECOVERY_ACTION
    assert xid_class(row("RESET_GPU", "", "Unused")) is XidClass.UNCLASSIFIED
    assert xid_class(row("", "")) is XidClass.UNCLASSIFIED
    with pytest.raises(ValueError, match="NEW_BUCKET"):
        xid_class(row("NEW_BUCKET", ""))


def test_actions_name_nvidias_immediate_and_investigatory_steps() -> None:
    by_code = {entry.code: entry for entry in CATALOGUE}
    assert by_code[119].action == (
        "drain the node and reset the GPU; if it recurs, update the driver and firmware "
        "(not an RMA) (NVIDIA: RESET_GPU / INVESTIGATE_SW)"
    )
    assert by_code[92].action.startswith("no immediate action;")
    assert "restart Fabric Manager" in by_code[45].action
    assert all("RMA if" not in entry.action for entry in CATALOGUE)
    # every override is for a code the catalogue leaves blank, or says why it departs
    for code, override in CLASS_OVERRIDES.items():
        row = next(row for row in XID_ROWS if row.code == code)
        assert override.why
        assert not row.immediate or code == 43
        if row.immediate:
            assert xid_action(row).endswith(f"(NVIDIA: {row.immediate} / {row.investigatory})")


def test_every_code_nvidia_documents_is_in_the_table_with_dcgm_exporters_text() -> None:
    assert [row.code for row in XID_ROWS] == list(range(173))
    messages = DCGM_MESSAGES
    assert messages[79] == "GPU has fallen off the bus"
    assert messages[171] == "Uncorrectable DRAM Error"
    assert messages.get(173, UNKNOWN_MESSAGE) == "Unknown Error"


def _render(template: str, labels: dict[str, str], value: str) -> str:
    # these GPUs have no pod, Slurm job or MIG instance: the attribution renders nothing
    text = template.replace(ATTRIBUTION_WHO, "").replace("{{ $value }}", value)
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda match: labels[match.group(1)], text)


def _alert_rules() -> dict[str, dict[str, Any]]:
    found = {}
    for path in ALERTS_DIR.glob("*.rules.yaml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    found[rule["alert"]] = rule
    return found


def _expected(rule: dict[str, Any], labels: dict[str, str], value: str) -> dict[str, Any]:
    annotations = {name: _render(text, labels, value) for name, text in rule["annotations"].items()}
    return {"exp_labels": {"severity": rule["labels"]["severity"], **labels},
            "exp_annotations": annotations}  # fmt: skip


def test_every_documented_code_pages_as_its_class_through_the_real_rules(tmp_path: Path) -> None:
    """Codes 1-172 and one no catalogue knows, each on its own GPU of a training node:
    each alert is asserted with exactly the codes its class sends it, in one run."""
    rules = _alert_rules()
    where = 'job="gpufleet-agent",instance="c1",Hostname="c1"'
    series = [
        {"series": f'gpufleet_training_ranks{{{where},training_job="cat",node="c1",pp_stage="0"}}',
         "values": "8x6"},
    ]  # fmt: skip
    expected: dict[str, list[dict[str, Any]]] = {
        page[0]: [] for page in PAGES.values() if page is not None
    }
    codes = [(entry.code, entry.klass, entry.meaning, entry.action) for entry in CATALOGUE]
    codes.append((UNKNOWN_CODE, XidClass.UNCLASSIFIED, "", ""))
    for code, klass, meaning, action in codes:
        gpu = f'gpu="{code}",UUID="GPU-c1-{code}"'
        counter = f'gpufleet_gpu_xid_errors_total{{{where},{gpu},xid="{code}"}}'
        series.append({"series": counter, "values": "_ 1x5"})
        page = PAGES[klass]
        if page is None:
            continue
        alert, severity = page
        rule = rules[alert]
        assert rule["labels"]["severity"] == severity, alert
        if alert == "GpuFleetApplicationXid":
            labels = {"training_job": "cat", "xid": str(code), "action": action}
        else:
            labels = {"node": "c1", "gpu": str(code), "UUID": f"GPU-c1-{code}", "xid": str(code)}
            if alert != "GpuFleetUnclassifiedXid":
                labels |= {"meaning": meaning, "action": action}
        expected[alert].append(_expected(rule, labels, "1"))
    gpu_test = yaml.safe_load((ALERTS_DIR / "tests" / "gpu.test.yaml").read_text())
    document = {
        "rule_files": [str(ALERTS_DIR / "gpu.rules.yaml"), str(ALERTS_DIR / "training.rules.yaml"),
                       str(ALERTS_DIR / "node.rules.yaml")],
        "evaluation_interval": "1m",
        "group_eval_order": gpu_test["group_eval_order"],
        "tests": [{
            "name": "every catalogued code, and one unknown, as its class",
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [
                {"eval_time": "3m", "alertname": name, "exp_alerts": alerts}
                for name, alerts in expected.items()
            ],
        }],
    }  # fmt: skip
    path = tmp_path / "catalogue.test.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    result = subprocess.run(
        [find_binary("promtool"), "test", "rules", str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    counts = {name: len(alerts) for name, alerts in expected.items()}
    assert counts == {
        "GpuFleetCriticalXid": 32,  # 31 act_now, and 154 with no recovery action reported
        "GpuFleetMaintenanceXid": 22,
        "GpuFleetApplicationXid": 51,
        "GpuFleetUnclassifiedXid": 64,  # NVIDIA's 63 Unused codes, and 999
    }
