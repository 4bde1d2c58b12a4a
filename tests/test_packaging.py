"""What each install brings: `pip install gpufleet` is the training client alone (standard
library only), the services come with extras at the ranges pyproject.toml declares and the
pins constraints.txt holds, and a command whose extra is missing says which to install.

The wheel is built once from this checkout and installed offline (`--no-index`) into a
fresh venv, as a training image would install it."""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import urllib.request
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from deploy_tools import REPO, build_wheel, tool
from gpufleet.cli import COMMAND_EXTRAS, MODULE_EXTRAS, missing_extra_hint
from gpufleet.lab.deploytree import CONFIGS, PACKAGE_COPIES
from gpufleet.lab.processes import free_port, wait_until

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
ADAPTERS = {
    "lightning.py": {"lightning", "pytorch_lightning", "torch"},
    "huggingface.py": {"transformers", "torch"},
}


def clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH: the venv must run its installed gpufleet."""
    return {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}


def wheel_user_env() -> dict[str, str]:
    """A user's environment for a wheel install: no PYTHONPATH, and Prometheus's family from
    PATH (the repository's .tools/prometheus3, which GPUFLEET_PROMETHEUS=3 names, is not
    beside an installed package)."""
    return {k: v for k, v in clean_env().items() if k != "GPUFLEET_PROMETHEUS"}


class Install:
    """A fresh venv with only the gpufleet wheel installed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.python = root / "bin" / "python"

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.python), *args],
            cwd=self.root,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def gpufleet(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run("-m", "gpufleet", *args)

    @property
    def site_packages(self) -> Path:
        (path,) = self.root.glob("lib/python3*/site-packages")
        return path


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> Install:
    wheel = build_wheel(tmp_path_factory.mktemp("wheel"))
    root = tmp_path_factory.mktemp("venv")
    venv.create(root, with_pip=True)
    installed = Install(root)
    result = installed.run(
        "-m", "pip", "install", "--quiet", "--no-index", "--disable-pip-version-check", str(wheel)
    )
    assert result.returncode == 0, result.stderr
    return installed


def test_installing_the_client_brings_no_other_distribution(install: Install) -> None:
    script = "import importlib.metadata as m; print([d.name for d in m.distributions()])"
    result = install.run("-c", script)
    assert result.returncode == 0, result.stderr
    names = set(ast.literal_eval(result.stdout))
    # pip and setuptools come with every venv; nothing else may come with gpufleet.
    assert names - {"pip", "setuptools"} == {"gpufleet"}
    assert PYPROJECT["project"]["dependencies"] == []


def test_the_client_imports_from_the_bare_install_with_the_standard_library_only(
    install: Install,
) -> None:
    script = """
import sys
before = set(sys.modules)
from gpufleet.client import Reporter, StepTimer, CheckpointTimer
import gpufleet, gpufleet.reporter.reporter
reporter = Reporter("http://127.0.0.1:9", training_job="j", rank=0, exit_timeout=0.1)
with reporter.step(tokens=1):
    pass
reporter.close()
outside = sorted(
    name for name in set(sys.modules) - before
    if name.split(".")[0] not in sys.stdlib_module_names and name.split(".")[0] != "gpufleet"
)
print(gpufleet.__file__)
print(outside)
"""
    result = install.run("-c", script)
    assert result.returncode == 0, result.stderr
    where, outside = result.stdout.splitlines()[-2:]
    assert where.startswith(str(install.site_packages))
    assert outside == "[]"


@pytest.mark.parametrize("module", sorted(ADAPTERS))
def test_the_adapters_import_only_the_standard_library_the_client_and_their_framework(
    module: str,
) -> None:
    tree = ast.parse((REPO / "exporter/gpufleet/reporter" / module).read_text())
    imported = {
        name.split(".")[0]
        for node in ast.walk(tree)
        for name in (
            [alias.name for alias in node.names] if isinstance(node, ast.Import)
            else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        )
    }  # fmt: skip
    assert ADAPTERS[module] & imported
    assert imported - ADAPTERS[module] - {"gpufleet", "__future__"} <= sys.stdlib_module_names


def test_the_adapters_import_from_the_bare_install_beside_their_framework(
    install: Install,
) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("pytorch_lightning")
    # The training image's own packages: this venv's, after the bare install's gpufleet.
    script = f"""
import sys
sys.path.append({sysconfig.get_paths()["purelib"]!r})
from gpufleet.reporter.lightning import GpuFleetCallback
from gpufleet.reporter.huggingface import GpuFleetTrainerCallback
import gpufleet.reporter.lightning as module
print(module.__file__)
"""
    result = install.run("-c", script, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith(str(install.site_packages))


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (["simulate", "--list-scenarios"], "sim"),
        (["agent", "--gpu-source", "none"], "agent"),
        (["fleet"], "agent"),
        (["mixin", "--out", "rules"], "sim"),
        (["report", "--prometheus", "http://127.0.0.1:9", "--db", "missing.db"], "report"),
    ],
)
def test_a_command_without_its_extra_names_the_extra_in_one_line(
    install: Install, args: list[str], extra: str
) -> None:
    result = install.gpufleet(*args)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"gpufleet {args[0]}: ")
    assert line.endswith(f"needs pip install 'gpufleet[{extra}]'")
    assert COMMAND_EXTRAS[args[0]] == extra


def test_commands_of_the_base_install_run_and_help_needs_no_extra(install: Install) -> None:
    result = install.gpufleet("agent", "--help")
    assert result.returncode == 0 and "GPUFLEET_LISTEN" in result.stdout
    # The ledger's client commands are standard library only: a refused connection, not
    # a missing module.
    result = install.gpufleet("exclusions", "top", "--fleet-url", "http://127.0.0.1:9")
    assert result.returncode == 1 and "gpufleet exclusions top:" in result.stderr
    assert "pip install" not in result.stderr


def requirements() -> dict[str, list[Requirement]]:
    extras: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]
    return {
        extra: [Requirement(text) for text in texts if not text.startswith("gpufleet")]
        for extra, texts in extras.items()
    }


def constraints() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version.strip()
    return pins


def test_services_declare_ranges_and_constraints_pin_each_within_its_range() -> None:
    pins = constraints()
    for extra, requirements_of_extra in requirements().items():
        for requirement in requirements_of_extra:
            name = re.sub(r"[-_.]+", "-", requirement.name).lower()
            assert name in pins, f"constraints.txt does not pin {name} ({extra})"
            assert requirement.specifier.contains(pins[name], prereleases=True), name
    # The services and the report take any version of a range, never one exact version.
    for extra in ("agent", "sim", "report"):
        for requirement in requirements()[extra]:
            assert not any(spec.operator == "==" for spec in requirement.specifier), requirement


def test_every_extra_a_command_names_exists_and_brings_the_modules_it_is_named_for() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert set(COMMAND_EXTRAS.values()) <= set(extras)
    assert "gpufleet[agent]" in extras["sim"]  # the simulator and demo run the agent's stack
    distributions = {
        "yaml": "pyyaml",
        "pynvml": "nvidia-ml-py",
        "prometheus_client": "prometheus-client",
    }
    for module, extra in MODULE_EXTRAS.items():
        if module == "starlette":
            continue  # fastapi's own dependency
        wanted = distributions.get(module, module)
        assert any(text.startswith(wanted) for text in extras[extra]), (module, extra)


def test_the_package_links_the_demo_configurations_and_the_sdist_carries_them(
    tmp_path: Path,
) -> None:
    # One committed copy: gpufleet/deploy/ links to deploy/; the sdist (and the wheel built
    # from it, or from the checkout: test_gpufleet_demo_runs_from_a_wheel_install) holds
    # the files themselves.
    for relative in CONFIGS:
        link = REPO / PACKAGE_COPIES / relative
        assert link.is_symlink() and link.resolve() == (REPO / relative).resolve()
    script = (
        "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    with tarfile.open(tmp_path / result.stdout.split()[-1]) as sdist:
        for relative in CONFIGS:
            (member,) = [
                m for m in sdist.getmembers() if m.name.endswith(f"/{PACKAGE_COPIES / relative}")
            ]
            assert member.isfile()
            content = sdist.extractfile(member)
            assert content is not None and content.read() == (REPO / relative).read_bytes()


@pytest.fixture
def agent_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    port = free_port()
    log = (tmp_path / "agent.err").open("w")
    process = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "gpufleet", "agent", "--gpu-source",
         "synthetic", "--gpu-interval", "0.5", "--listen", f"127.0.0.1:{port}"],
        stderr=log, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    yield process, port
    if process.poll() is None:
        process.terminate()
        process.wait(timeout=30)
    log.close()


def test_the_agent_process_never_imports_numpy_yaml_or_pandas(
    tmp_path: Path, agent_process: tuple[subprocess.Popen[str], int]
) -> None:
    process, port = agent_process
    url = f"http://127.0.0.1:{port}"

    def metrics() -> str:
        try:
            with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
                return str(response.read().decode())
        except OSError:
            return ""

    wait_until(lambda: "DCGM_FI_DEV_GPU_TEMP" in metrics(), 60, what="the agent's GPU series")
    body = (
        b'{"events": [{"training_job": "j", "rank": 0, "step": 1, "duration_s": 1.0,'
        b' "tokens": 10}]}'
    )
    request = urllib.request.Request(
        f"{url}/v1/steps", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status in (200, 202)
    wait_until(lambda: 'training_job="j"' in metrics(), 30, what="the training series")
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=30)
    lines = (tmp_path / "agent.err").read_text().splitlines()
    imported = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in lines
        if line.startswith("import time:") and "|" in line
    }
    assert {"fastapi", "uvicorn", "gpufleet"} <= imported  # the log is the agent's imports
    assert not imported & {"numpy", "yaml", "pandas", "matplotlib"}


@pytest.mark.integration
def test_gpufleet_demo_runs_from_a_wheel_install(install: Install, tmp_path: Path) -> None:
    tool("prometheus", "apt-get install -y prometheus")
    tool("prometheus-alertmanager", "apt-get install -y prometheus-alertmanager")
    # The services' dependencies come from this venv (offline), after the wheel's gpufleet.
    (install.site_packages / "services.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    workdir = tmp_path / "demo"
    output = tmp_path / "demo.out"
    pager_port = free_port()  # not the configured 9407: a demo may be running beside the test
    with output.open("w") as out:
        demo = subprocess.Popen(
            [str(install.python), "-m", "gpufleet", "demo", "--workdir", str(workdir),
             "--nodes", "2", "--scenario", "healthy", "--pager-port", str(pager_port)],
            cwd=tmp_path, env=wheel_user_env(), stdout=out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            wait_until(
                lambda: "gpufleet demo is up" in output.read_text() or demo.poll() is not None,
                180,
                what="the demo from the wheel to come up",
            )
            text = output.read_text()
            assert "gpufleet demo is up" in text, text
        finally:
            demo.send_signal(signal.SIGINT)
            demo.wait(timeout=60)
    (install.site_packages / "services.pth").unlink()
    rules = sorted(path.name for path in (workdir / "etc/alerts").glob("*.rules.yaml"))
    assert rules == sorted(path.name for path in (REPO / "alerts").glob("*.rules.yaml"))
    assert f"{len(rules)} rule files" in text
    for relative in CONFIGS:
        copied = workdir / "etc" / relative
        shipped = (REPO / relative).read_text().replace(":9407/", f":{pager_port}/")
        assert not copied.is_symlink() and copied.read_text() == shipped
    assert "gpufleet demo stopped." in output.read_text()


def test_a_missing_module_of_no_extra_is_not_hidden_behind_a_hint() -> None:
    assert missing_extra_hint("agent", "fastapi") == (
        "fastapi is not installed; this command needs pip install 'gpufleet[agent]'"
    )
    # A command's own extra wins: the simulator needs the agent's stack too.
    assert "gpufleet[sim]" in str(missing_extra_hint("simulate", "uvicorn.config"))
    # A broken gpufleet module or an unknown one keeps its traceback.
    assert missing_extra_hint("agent", "gpufleet.nothing") is None
    assert missing_extra_hint("agent", None) is None
