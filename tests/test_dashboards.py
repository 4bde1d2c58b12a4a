"""The dashboards: generated files in sync, Grafana dashboard-linter's rules, the house
conventions, the SDK round trip, and every recorded name a panel reads is recorded."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from grafana_foundation_sdk.cog import plugins
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

from gpufleet.dashboards.__main__ import write_dashboards
from gpufleet.lab.processes import find_binary

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD_FILES = sorted((ROOT / "dashboards").glob("*.json"))
UIDS = {
    "gpufleet-overview",
    "gpufleet-fail-slow",
    "gpufleet-node",
    "gpufleet-checkpoint",
    "gpufleet-reliability",
}
DATASOURCE_UIDS = {"$datasource", "${datasource}"}
RECORDED = re.compile(r"\b[a-z]+:[A-Za-z0-9_]+:[a-z0-9_]+\b")
# Grafana's variables as a parser sees them: a plausible value of the right kind.
SAMPLE_VALUES = {
    "$__rate_interval": "2m",
    "$__range_s": "21600",
    "$__range": "6h",
    "$__interval": "1m",
}


def load(path: Path) -> dict[str, Any]:
    board: dict[str, Any] = json.loads(path.read_text())
    return board


def queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expression) of every target and annotation."""
    found = [
        (f"panel {panel['id']} {panel['title']!r}", target["expr"])
        for panel in board["panels"]
        for target in panel.get("targets", [])
    ]
    found += [
        (f"annotation {item['name']!r}", item["expr"])
        for item in board.get("annotations", {}).get("list", [])
        if item.get("expr")
    ]
    return found


def sample(expr: str) -> str:
    for name in sorted(SAMPLE_VALUES, key=len, reverse=True):
        expr = expr.replace(name, SAMPLE_VALUES[name])
    return re.sub(r"\$\{?([a-z_]+)\}?", r"\1-value", expr)


def unparsable(exprs: list[tuple[str, str]], workdir: Path) -> list[str]:
    """Expressions Prometheus's own parser (promtool) rejects, one rule file each."""
    problems = []
    for index, (where, expr) in enumerate(exprs):
        path = workdir / f"query-{index}.rules.yaml"
        rule = {"record": "lint:query:check", "expr": sample(expr)}
        path.write_text(yaml.safe_dump({"groups": [{"name": "lint", "rules": [rule]}]}))
        result = subprocess.run(
            [find_binary("promtool"), "check", "rules", str(path)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            problems.append(f"target-promql: {where}: {result.stdout.strip()[-300:]}")
    return problems


def rate_windows(expr: str) -> list[str]:
    """The range of every rate / irate / increase call in ``expr``."""
    windows = []
    for match in re.finditer(r"\b(rate|irate|increase)\s*\(", expr):
        depth, position = 1, match.end()
        while depth and position < len(expr):
            depth += {"(": 1, ")": -1}.get(expr[position], 0)
            position += 1
        inner = re.search(r"\[([^\]]*)\]", expr[match.end() : position])
        windows.append(inner.group(1) if inner else "")
    return windows


def lint(boards: dict[str, dict[str, Any]], workdir: Path) -> list[str]:
    """dashboard-linter's rules plus the house conventions; a list of problems."""
    problems: list[str] = []
    seen_uids: dict[str, str] = {}
    for name, board in boards.items():

        def problem(rule: str, text: str, name: str = name) -> None:
            problems.append(f"{name}: {rule}: {text}")

        uid = board.get("uid", "")
        if uid in seen_uids:
            problem("uid-unique", f"{uid} is also {seen_uids[uid]}'s")
        seen_uids[uid] = name
        variables = {v["name"]: v for v in board.get("templating", {}).get("list", [])}
        source = variables.get("datasource")
        if not source or source.get("type") != "datasource" or source.get("query") != "prometheus":
            problem("template-datasource", "no datasource variable of type prometheus")
        for variable in variables.values():
            if variable.get("type") == "query":
                if variable.get("datasource", {}).get("uid") not in DATASOURCE_UIDS:
                    problem(
                        "template-datasource", f"variable {variable['name']} has its own source"
                    )
                if variable.get("refresh") != 2:
                    problem("template-refresh", f"{variable['name']} not refreshed on time range")
        if board.get("editable") is not False or board.get("timezone") != "utc":
            problem("conventions", "dashboards are read-only and in UTC")
        if "gpufleet" not in board.get("tags", []) or not any(
            link.get("type") == "dashboards" and link.get("asDropdown") and link.get("keepTime")
            for link in board.get("links", [])
        ):
            problem("conventions", "the gpufleet tag and its dashboards dropdown link")
        ids = [panel.get("id") for panel in board["panels"]]
        if any(not isinstance(i, int) or i <= 0 for i in ids) or len(ids) != len(set(ids)):
            problem("panel-ids", f"ids must be set, positive and unique: {ids}")
        for panel in board["panels"]:
            where = f"panel {panel.get('id')} {panel.get('title')!r}"
            if panel.get("datasource", {}).get("uid") not in DATASOURCE_UIDS:
                problem("panel-datasource", where)
            if not panel.get("title") or not panel.get("description"):
                problem("panel-title-description", where)
            if not panel.get("fieldConfig", {}).get("defaults", {}).get("unit"):
                problem("panel-units", where)
            if not panel.get("targets"):
                problem("panel-targets", f"{where} queries nothing")
            for target in panel.get("targets", []):
                if target.get("datasource", {}).get("uid") not in DATASOURCE_UIDS:
                    problem("target-datasource", where)
                legend = target.get("legendFormat", "")
                if "{{gpu}}" in legend and "{{node}}" not in legend:
                    problem("legend-names-node", f"{where}: {legend!r}")
        for where, expr in queries(board):
            for window in rate_windows(expr):
                if window != "$__rate_interval":
                    problem("target-rate-interval", f"{where}: [{window}]")
        problems.extend(f"{name}: {text}" for text in unparsable(queries(board), workdir))
    return problems


def committed() -> dict[str, dict[str, Any]]:
    return {path.stem: load(path) for path in DASHBOARD_FILES}


def test_committed_dashboards_are_what_the_code_generates(tmp_path: Path) -> None:
    written = write_dashboards(tmp_path)
    assert {path.name for path in written} == {path.name for path in DASHBOARD_FILES}
    for path in written:
        assert (ROOT / "dashboards" / path.name).read_text() == path.read_text(), (
            f"run `make generate`: dashboards/{path.name} differs"
        )


def test_five_dashboards_with_stable_uids() -> None:
    assert {board["uid"] for board in committed().values()} == UIDS


def test_every_dashboard_passes_the_linter(tmp_path: Path) -> None:
    assert lint(committed(), tmp_path) == []


def test_the_linter_fails_a_broken_dashboard(tmp_path: Path) -> None:
    boards = committed()
    broken = copy.deepcopy(boards["overview"])
    broken["uid"] = boards["node"]["uid"]
    broken["templating"]["list"] = [
        v for v in broken["templating"]["list"] if v["name"] != "datasource"
    ]
    first, second, third = broken["panels"][:3]
    first["datasource"] = {"type": "prometheus", "uid": "P1809F7CD0C75ACF3"}
    second["description"] = ""
    del third["fieldConfig"]["defaults"]["unit"]
    third["id"] = second["id"]
    first["targets"][0]["expr"] = "sum(rate(up[5m])"
    second["targets"][0]["expr"] = "sum(rate(up[5m]))"
    second["targets"][0]["legendFormat"] = "GPU {{gpu}}"
    problems = lint({"node": boards["node"], "broken": broken}, tmp_path)
    rules = {text.split(": ")[1] for text in problems if text.startswith("broken")}
    assert rules == {
        "uid-unique",
        "template-datasource",
        "panel-datasource",
        "panel-title-description",
        "panel-units",
        "panel-ids",
        "target-promql",
        "target-rate-interval",
        "legend-names-node",
    }, problems


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda path: path.stem)
def test_round_trip_through_the_sdk(path: Path) -> None:
    plugins.register_default_plugins()
    text = path.read_text()
    again = dm.Dashboard.from_json(json.loads(text))
    assert json.dumps(again, cls=JSONEncoder, indent=2, sort_keys=True) + "\n" == text


def test_every_recorded_name_a_panel_reads_is_recorded() -> None:
    recorded = {
        rule["record"]
        for path in (ROOT / "alerts").glob("*.rules.yaml")
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    used = {
        name
        for board in committed().values()
        for _, expr in queries(board)
        for name in RECORDED.findall(expr)
    }
    assert used and used - recorded == set()


def test_panels_read_node_never_hostname() -> None:
    for name, board in committed().items():
        for where, expr in queries(board):
            selectors = re.sub(
                r'label_replace\([^"]*"node", "\$1", "[Hh]ostname", "\(\.\+\)"\)', "", expr
            )
            assert not re.search(r"[{,]\s*[Hh]ostname\s*[=!]", selectors), f"{name} {where}"


def test_tables_link_rows_to_the_node_dashboard() -> None:
    overview = committed()["overview"]
    table = next(p for p in overview["panels"] if p["title"] == "Nodes by health score")
    links = [
        prop["value"]
        for override in table["fieldConfig"]["overrides"]
        if override["matcher"]["options"] == "node"
        for prop in override["properties"]
        if prop["id"] == "links"
    ]
    assert links and links[0][0]["url"].startswith("/d/gpufleet-node/")


def test_the_runbook_names_real_panels() -> None:
    titles = {panel["title"] for board in committed().values() for panel in board["panels"]}
    uids = {board["uid"] for board in committed().values()}
    runbook = (ROOT / "alerts" / "RUNBOOK.md").read_text()
    lines = re.findall(r"^\*\*Dashboard\*\*: (.+(?:\n(?!\n).+)*)", runbook, re.M)
    assert len(lines) >= 20
    named = {title for line in lines for title in re.findall(r'"([^"]+)"', line)}
    assert named and named - titles == set()
    assert {uid for line in lines for uid in re.findall(r"`(gpufleet-[a-z-]+)`", line)} <= uids


def test_the_coverage_table_explains_every_reason_the_rules_record() -> None:
    expr = next(
        rule["expr"]
        for path in (ROOT / "alerts").glob("*.rules.yaml")
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if rule.get("record") == "stage:gpufleet_straggler_detection:active"
    )
    recorded = set(re.findall(r'"reason", "(\w+)"', expr))
    table = next(
        panel
        for panel in committed()["fail-slow"]["panels"]
        if panel["title"] == "Straggler detection coverage by job and stage"
    )
    mapped = next(
        prop["value"][0]["options"]
        for override in table["fieldConfig"]["overrides"]
        if override["matcher"]["options"] == "reason"
        for prop in override["properties"]
        if prop["id"] == "mappings"
    )
    assert recorded == {"node_peers", "rank_peers", "too_few_peers", "no_compute_split"}
    assert set(mapped) == recorded
    uncovered = {"too_few_peers", "no_compute_split"}
    for reason, shown in mapped.items():
        assert shown["text"].startswith("NOT covered" if reason in uncovered else "covered")
