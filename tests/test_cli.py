"""The gpufleet command: flags, environment fallbacks, clear failures."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.cli import AGENT_OPTIONS, ConfigError, build_parser, ingest_token, node_name


def resolve(argv: list[str], monkeypatch: pytest.MonkeyPatch, **env: str) -> dict[str, object]:
    for option in AGENT_OPTIONS:
        monkeypatch.delenv(option.env, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    namespace = build_parser().parse_args(["agent", *argv])
    return {option.dest: option.resolve(namespace) for option in AGENT_OPTIONS}


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    values = resolve([], monkeypatch)
    assert values["listen"] == ("0.0.0.0", 9405)
    assert values["gpu_source"] == "nvml"
    assert values["gpu_interval"] == 5.0
    assert values["node"] is None


def test_every_flag_has_an_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    values = resolve(
        [],
        monkeypatch,
        GPUFLEET_LISTEN="127.0.0.1:9999",
        GPUFLEET_GPU_SOURCE="synthetic",
        GPUFLEET_GPU_INTERVAL="2.5",
        GPUFLEET_NODE="gpu-node-17",
        GPUFLEET_NODE_LABEL="hostname",
        GPUFLEET_EXPECTED_GPUS="8",
        GPUFLEET_NVML_CALL_TIMEOUT="7",
        GPUFLEET_GPU_STALE_AFTER="30",
        GPUFLEET_LOG_LEVEL="debug",
        GPUFLEET_INGEST_TOKEN_FILE="/run/secrets/token",
        GPUFLEET_ALLOW_UNAUTHENTICATED_INGEST="true",
        GPUFLEET_JOB_TTL="1800",
        GPUFLEET_MAX_JOBS="4",
        GPUFLEET_MAX_STAGES="8",
        GPUFLEET_MAX_RANKS_PER_STAGE="16",
        GPUFLEET_MAX_SERIES="1000",
        GPUFLEET_MAX_BATCH_EVENTS="1000",
        GPUFLEET_MAX_BODY_BYTES="500000",
        GPUFLEET_MAX_CONNECTIONS="100",
        GPUFLEET_MAX_CONNECTIONS_PER_CLIENT="10",
        GPUFLEET_LEDGER_URL="http://ledger:9406",
        GPUFLEET_LEDGER_TOKEN_FILE="/run/secrets/ledger",
        GPUFLEET_LEDGER_QUEUE_SIZE="64",
        GPUFLEET_HPC_JOB_MAPPING_DIR="/run/gpufleet/hpc-jobs",
        GPUFLEET_HPC_JOB_MAPPING_INTERVAL="2",
        GPUFLEET_KUBERNETES="true",
        GPUFLEET_POD_RESOURCES_KUBELET_SOCKET="/var/lib/kubelet/pod-resources/kubelet.sock",
        GPUFLEET_KUBERNETES_GPU_ID_TYPE="device-name",
        GPUFLEET_NVIDIA_RESOURCE_NAMES="nvidia.com/a100",
        GPUFLEET_POD_RESOURCES_INTERVAL="15",
        GPUFLEET_POD_RESOURCES_TIMEOUT="3",
    )
    assert values == {
        "listen": ("127.0.0.1", 9999),
        "gpu_source": "synthetic",
        "gpu_interval": 2.5,
        "node": "gpu-node-17",
        "node_label": "hostname",
        "expected_gpus": 8,
        "nvml_call_timeout": 7.0,
        "gpu_stale_after": 30.0,
        "log_level": "debug",
        "ingest_token_file": "/run/secrets/token",
        "allow_unauthenticated_ingest": True,
        "job_ttl": 1800.0,
        "max_jobs": 4,
        "max_stages": 8,
        "max_ranks_per_stage": 16,
        "max_series": 1000,
        "max_batch_events": 1000,
        "ledger_url": "http://ledger:9406",
        "ledger_token_file": "/run/secrets/ledger",
        "ledger_queue_size": 64,
        "max_body_bytes": 500000,
        "max_connections": 100,
        "max_connections_per_client": 10,
        "hpc_job_mapping_dir": "/run/gpufleet/hpc-jobs",
        "hpc_job_mapping_interval": 2.0,
        "kubernetes": True,
        "pod_resources_kubelet_socket": "/var/lib/kubelet/pod-resources/kubelet.sock",
        "kubernetes_gpu_id_type": "device-name",
        "nvidia_resource_names": ("nvidia.com/a100",),
        "pod_resources_interval": 15.0,
        "pod_resources_timeout": 3.0,
    }
    assert {option.env for option in AGENT_OPTIONS} == {
        "GPUFLEET_LISTEN",
        "GPUFLEET_GPU_SOURCE",
        "GPUFLEET_GPU_INTERVAL",
        "GPUFLEET_NODE",
        "GPUFLEET_NODE_LABEL",
        "GPUFLEET_EXPECTED_GPUS",
        "GPUFLEET_NVML_CALL_TIMEOUT",
        "GPUFLEET_GPU_STALE_AFTER",
        "GPUFLEET_LOG_LEVEL",
        "GPUFLEET_INGEST_TOKEN_FILE",
        "GPUFLEET_ALLOW_UNAUTHENTICATED_INGEST",
        "GPUFLEET_JOB_TTL",
        "GPUFLEET_MAX_JOBS",
        "GPUFLEET_MAX_STAGES",
        "GPUFLEET_MAX_RANKS_PER_STAGE",
        "GPUFLEET_MAX_SERIES",
        "GPUFLEET_MAX_BATCH_EVENTS",
        "GPUFLEET_MAX_BODY_BYTES",
        "GPUFLEET_MAX_CONNECTIONS",
        "GPUFLEET_MAX_CONNECTIONS_PER_CLIENT",
        "GPUFLEET_LEDGER_URL",
        "GPUFLEET_LEDGER_TOKEN_FILE",
        "GPUFLEET_LEDGER_QUEUE_SIZE",
        "GPUFLEET_HPC_JOB_MAPPING_DIR",
        "GPUFLEET_HPC_JOB_MAPPING_INTERVAL",
        "GPUFLEET_KUBERNETES",
        "GPUFLEET_POD_RESOURCES_KUBELET_SOCKET",
        "GPUFLEET_KUBERNETES_GPU_ID_TYPE",
        "GPUFLEET_NVIDIA_RESOURCE_NAMES",
        "GPUFLEET_POD_RESOURCES_INTERVAL",
        "GPUFLEET_POD_RESOURCES_TIMEOUT",
    }


def test_no_flag_takes_a_token_on_the_command_line() -> None:
    # A command line is visible to every user of the node (ps, /proc/PID/cmdline).
    flags = {option.flag for option in AGENT_OPTIONS}
    assert "--ingest-token" not in flags
    assert not [flag for flag in flags if flag.endswith("token")]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["agent", "--ingest-token", "s3cret"])


def test_the_token_comes_from_a_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUFLEET_INGEST_TOKEN", raising=False)
    assert ingest_token(None) is None
    secret = tmp_path / "token"
    secret.write_text("s3cret\n")  # a mounted Secret often ends with a newline
    assert ingest_token(str(secret)) == "s3cret"
    monkeypatch.setenv("GPUFLEET_INGEST_TOKEN", "from-env")
    assert ingest_token(None) == "from-env"
    with pytest.raises(ConfigError, match="keep one"):
        ingest_token(str(secret))
    monkeypatch.delenv("GPUFLEET_INGEST_TOKEN")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        ingest_token(str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="cannot read"):
        ingest_token(str(tmp_path / "missing"))


def test_allow_unauthenticated_ingest_is_a_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve([], monkeypatch)["allow_unauthenticated_ingest"] is False
    assert resolve(["--allow-unauthenticated-ingest"], monkeypatch)["allow_unauthenticated_ingest"]
    with pytest.raises(ConfigError, match="not true or false"):
        resolve([], monkeypatch, GPUFLEET_ALLOW_UNAUTHENTICATED_INGEST="maybe")


def test_a_flag_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    values = resolve(["--gpu-interval", "1"], monkeypatch, GPUFLEET_GPU_INTERVAL="9")
    assert values["gpu_interval"] == 1.0


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {"GPUFLEET_GPU_INTERVAL": "fast"}, "GPUFLEET_GPU_INTERVAL: 'fast' is not a number"),
        (["--listen", "9405"], {}, "--listen: '9405' is not HOST:PORT"),
        (["--gpu-source", "dcgm"], {}, "--gpu-source: 'dcgm' is not one of: nvml, synthetic"),
        (["--expected-gpus", "-1"], {}, "--expected-gpus: '-1' is not a positive whole number"),
        (["--gpu-interval", "0"], {}, "--gpu-interval: '0' must be between 0 and 3600"),
        ([], {"GPUFLEET_JOB_TTL": "5"}, "GPUFLEET_JOB_TTL: '5' must be between 60 seconds"),
    ],
)
def test_bad_values_name_the_flag_or_variable(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(argv, monkeypatch, **env)


def test_node_identity_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "from-downward-api")
    assert node_name("explicit") == "explicit"
    assert node_name(None) == "from-downward-api"
    monkeypatch.delenv("NODE_NAME")
    import socket

    assert node_name(None) == socket.gethostname()


def run_cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gpufleet", *argv],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
        check=False,
    )


def test_without_a_driver_the_agent_exits_with_one_clear_line() -> None:
    result = run_cli("agent", "--listen", "127.0.0.1:19999")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "libnvidia-ml.so.1 was not found" in lines[0]
    assert "--gpu-source none" in lines[0] and "--gpu-source synthetic" in lines[0]
    assert "Traceback" not in result.stderr


def test_a_bad_environment_value_exits_2_without_traceback() -> None:
    result = run_cli("agent", env={"GPUFLEET_GPU_SOURCE": "cuda"})
    assert result.returncode == 2
    assert "GPUFLEET_GPU_SOURCE: 'cuda' is not one of" in result.stderr
    assert "Traceback" not in result.stderr


def test_help_lists_the_environment_variables() -> None:
    result = run_cli("agent", "--help")
    assert result.returncode == 0
    for option in AGENT_OPTIONS:
        assert option.env in result.stdout


def test_parser_requires_a_command() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([])
    assert isinstance(build_parser(), argparse.ArgumentParser)


def test_every_flag_of_a_service_has_a_variable_and_help_names_it() -> None:
    from gpufleet.cli import COMMANDS
    from gpufleet.cli.options import Command

    services = [c for c in COMMANDS if isinstance(c, Command) and c.service]
    assert {c.name for c in services} == {
        "agent", "fleet", "simulate", "demo", "kube-watch", "slurm-watch"}  # fmt: skip
    for command in services:
        shown = run_cli(command.name, "--help").stdout
        for option in command.options:
            assert option.env and option.env.startswith("GPUFLEET_"), (command.name, option.flag)
            assert option.env in shown, (command.name, option.env)


def test_simulator_flags_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpufleet.cli import parse

    for name in [k for k in os.environ if k.startswith("GPUFLEET_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("GPUFLEET_SIM_NODES", "16")
    monkeypatch.setenv("GPUFLEET_SIM_LISTEN", "0.0.0.0:9600")
    values = parse(["simulate", "--seed", "3"])
    assert (values.nodes, values.listen, values.seed) == (16, ("0.0.0.0", 9600), 3)
    assert (values.scenario, values.tick, values.log_level) == ("realistic-week", 1.0, "warning")
    assert parse(["simulate", "--nodes", "8"]).nodes == 8  # the flag wins
    monkeypatch.setenv("GPUFLEET_SIM_NODES", "many")
    with pytest.raises(ConfigError, match="GPUFLEET_SIM_NODES: 'many' is not a whole number"):
        parse(["simulate"])


def test_a_bad_value_of_a_one_shot_command_exits_2_naming_the_flag() -> None:
    result = run_cli("exclusions", "top", "--days", "soon")
    assert result.returncode == 2
    assert result.stderr.strip() == "gpufleet exclusions: --days: 'soon' is not a number"


def test_a_service_flag_without_a_variable_cannot_be_declared() -> None:
    from gpufleet.cli.kinds import text
    from gpufleet.cli.options import Command, Option

    with pytest.raises(TypeError, match="--orphan"):
        Command("svc", lambda _: 0, (Option("--orphan", text, None, "x"),), "h", service=True)
