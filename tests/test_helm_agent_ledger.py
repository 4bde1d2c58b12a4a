"""The chart's switch for the agents to write job attempts to the ledger (agent.ledger):
off by default; on, the agent gets the ledger's URL and token file, and only the agent
(the ci/attempts-values.yaml scenario is also linted and validated in test_helm_chart)."""

from __future__ import annotations

import subprocess
from typing import Any

import yaml

from deploy_tools import CHART, helm
from gpufleet.cli import AGENT_OPTIONS

NAMESPACE = "gpufleet"


def helm_template(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm()), "template", "gpufleet", str(CHART), "--namespace", NAMESPACE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def render(*args: str) -> list[dict[str, Any]]:
    result = helm_template(*args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def workload(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [doc for doc in docs if doc["kind"] == kind]
    return found


def env_of(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    container = workload(docs, kind)["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


def ledger_volume(docs: list[dict[str, Any]]) -> dict[str, Any] | None:
    volumes = workload(docs, "DaemonSet")["spec"]["template"]["spec"]["volumes"]
    return next((volume for volume in volumes if volume["name"] == "ledger-token"), None)


def test_off_by_default() -> None:
    docs = render()
    assert not {"GPUFLEET_LEDGER_URL", "GPUFLEET_LEDGER_TOKEN_FILE"} & set(
        env_of(docs, "DaemonSet")
    )
    assert ledger_volume(docs) is None


def test_on_the_agent_writes_to_this_releases_ledger_with_its_token() -> None:
    docs = render("-f", str(CHART / "ci" / "attempts-values.yaml"))
    env = env_of(docs, "DaemonSet")
    assert env["GPUFLEET_LEDGER_URL"] == f"http://gpufleet-fleet.{NAMESPACE}.svc:9406"
    assert env["GPUFLEET_LEDGER_TOKEN_FILE"] == "/etc/gpufleet/ledger-token/token"
    assert {name for name in env if name.startswith("GPUFLEET_")} <= {
        option.env for option in AGENT_OPTIONS
    }
    volume = ledger_volume(docs)
    assert volume is not None and volume["secret"]["secretName"] == "gpufleet-fleet-token"
    # the ledger admits the agent pods
    (policy,) = [
        doc
        for doc in docs
        if doc["kind"] == "NetworkPolicy"
        and doc["metadata"]["labels"]["app.kubernetes.io/component"] == "fleet"
    ]
    peers = policy["spec"]["ingress"][0]["from"]
    assert {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "gpufleet",
                "app.kubernetes.io/instance": "gpufleet",
                "app.kubernetes.io/component": "agent",
            }
        }
    } in peers


def test_a_ledger_elsewhere_takes_its_url_and_a_secret_you_name() -> None:
    docs = render(
        "--set", "agent.ledger.enabled=true",
        "--set", "fleet.enabled=false",
        "--set", "agent.ledger.url=https://ledger.example:9406",
        "--set", "agent.ledger.token.existingSecret=ledger-writer",
        "--set", "agent.ledger.token.secretKey=write",
    )  # fmt: skip
    env = env_of(docs, "DaemonSet")
    assert env["GPUFLEET_LEDGER_URL"] == "https://ledger.example:9406"
    assert env["GPUFLEET_LEDGER_TOKEN_FILE"] == "/etc/gpufleet/ledger-token/write"
    volume = ledger_volume(docs)
    assert volume is not None and volume["secret"]["secretName"] == "ledger-writer"
    assert volume["secret"]["items"] == [{"key": "write", "path": "write"}]


def test_no_ledger_to_write_to_is_refused_by_name() -> None:
    result = helm_template("--set", "agent.ledger.enabled=true", "--set", "fleet.enabled=false")
    assert result.returncode != 0 and "set agent.ledger.url" in result.stderr
    result = helm_template("--set", "agent.ledger.url=ledger:9406")
    assert result.returncode != 0 and "agent.ledger.url" in result.stderr
