"""``gpufleet fleet`` and the ledger commands: tokens from files, safe defaults, clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpufleet.cli import FLEET_OPTIONS, build_parser
from gpufleet.fleet.exported import LedgerLimits
from gpufleet.lab.processes import ManagedProcess, free_port, http_get, wait_until


def run_cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    return subprocess.run(
        [sys.executable, "-m", "gpufleet", *argv],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        timeout=60,
        check=False,
    )


def status(url: str, token: str | None = None, body: bytes | None = None) -> int:
    headers = {"Content-Type": "application/json", "Idempotency-Key": "cli-test-0001"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.integration
def test_the_ledger_takes_its_token_from_a_file_for_writes_and_reads(tmp_path: Path) -> None:
    secret = tmp_path / "fleet-token"
    secret.write_text("from-a-file\n")  # the newline a mounted Secret or an editor leaves
    port = free_port()
    ledger = ManagedProcess(
        [sys.executable, "-m", "gpufleet", "fleet", "--listen", f"127.0.0.1:{port}",
         "--db", str(tmp_path / "fleet.db"), "--log-level", "warning"],
        tmp_path / "ledger.log",
        {**os.environ, "GPUFLEET_FLEET_TOKEN_FILE": str(secret)},
    )  # fmt: skip
    ledger.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_get(f"{url}/readyz"), 30, what="the ledger")
        body = b'{"node": "node-017", "reason": "xid79"}'
        assert status(f"{url}/v1/exclusions", body=body) == 401
        assert status(f"{url}/v1/exclusions", "from-a-file", body) == 201
        assert status(f"{url}/v1/exclusions/top") == 401
        top = run_cli("exclusions", "top", "--fleet-url", url, "--token-file", str(secret))
        assert top.returncode == 0, top.stderr
        assert "exclusions in the last 30 days: 1 on 1 nodes" in top.stdout
        by_env = run_cli(
            "exclusions", "top", "--fleet-url", url, env={"GPUFLEET_FLEET_TOKEN_FILE": str(secret)}
        )
        assert by_env.returncode == 0, by_env.stderr
        anonymous = run_cli("exclusions", "top", "--fleet-url", url)
        assert anonymous.returncode == 1 and "401" in anonymous.stderr
        assert "Traceback" not in anonymous.stderr
    finally:
        ledger.stop()


@pytest.mark.parametrize(
    ("argv", "prefix"),
    [
        (["exclude", "node-017", "--reason", "xid79"], "gpufleet exclude: "),
        (["release", "node-017"], "gpufleet release: "),
        (["exclusions", "top"], "gpufleet exclusions top: "),
    ],
)
def test_a_ledger_command_without_a_ledger_exits_1_with_one_line(
    argv: list[str], prefix: str
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = run_cli(*argv, "--fleet-url", url)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(f"{prefix}cannot reach the ledger at {url}")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--token", "a", "--token-file", "x"], {}, "set --token or --token-file, not both"),
        (["--token-file", "EMPTY"], {}, "is empty"),
        (["--token-file", "MISSING"], {}, "No such file"),
        (["--read-token-file", "MISSING"], {}, "--read-token-file"),
        (["--idempotency-window", "5m"], {}, "between 1 hour and 365 days"),
        ([], {"GPUFLEET_FLEET_IDEMPOTENCY_WINDOW": "soon"}, "GPUFLEET_FLEET_IDEMPOTENCY_WINDOW"),
        ([], {"GPUFLEET_FLEET_ALLOW_UNAUTHENTICATED_WRITES": "maybe"}, "not true or false"),
        (["--max-nodes", "0"], {}, "--max-nodes"),
    ],
)
def test_bad_ledger_settings_exit_with_one_line_naming_them(
    tmp_path: Path, argv: list[str], env: dict[str, str], message: str
) -> None:
    (tmp_path / "EMPTY").write_text("\n")
    argv = [str(tmp_path / a) if a in ("EMPTY", "MISSING") else a for a in argv]
    result = run_cli(
        "fleet", "--listen", "127.0.0.1:1", "--db", str(tmp_path / "f.db"), *argv, env=env
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def resolved(monkeypatch: pytest.MonkeyPatch, *argv: str, **env: str) -> dict[str, object]:
    for name in [k for k in os.environ if k.startswith("GPUFLEET_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    namespace = build_parser().parse_args(["fleet", *argv])
    return {option.dest: option.resolve(namespace) for option in FLEET_OPTIONS}


def test_defaults_are_safe_and_match_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    values = resolved(monkeypatch)
    assert values["allow_unauthenticated_writes"] is False
    assert values["token"] is None and values["token_file"] is None
    limits = LedgerLimits()
    assert values["max_nodes"] == limits.max_nodes
    assert values["max_training_jobs"] == limits.max_training_jobs
    assert values["max_exclusion_series"] == limits.max_exclusion_series
    assert values["export_retention"] == limits.export_retention_s == 40 * 86400
    assert values["idempotency_window"] == limits.idempotency_window_s == 7 * 86400
    assert resolved(monkeypatch, "--allow-unauthenticated-writes")["allow_unauthenticated_writes"]
    by_env = resolved(monkeypatch, GPUFLEET_FLEET_ALLOW_UNAUTHENTICATED_WRITES="true")
    assert by_env["allow_unauthenticated_writes"] is True
    assert resolved(monkeypatch, "--idempotency-window", "48h")["idempotency_window"] == 172800
