"""The containers for real, on a Docker engine: `make test-containers` runs this file (not
`make test`, whose machines need no engine) after it has installed Docker, started its
daemon and built the base and Prometheus / Alertmanager images with
deploy/compose/local-images/build.py (no image registry is reachable from CI).

- The agent image runs under the Helm chart's restrictions (read-only root, every
  capability dropped, the chart's user, no privilege escalation) and serves /metrics.
- `docker compose build` builds the one image (the only `build:`); `docker compose up`
  with every service but Grafana tells the demo's story: the four pages reach the pager,
  in order, for the right nodes, near docs/quickstart.md's minutes, and nothing else pages; the
  ledger holds one exclusion and both attempts, the simulator's events all taken. Then
  `docker compose down` keeps the volumes and a second `up` tells the same story (with
  compose v2 where it is installed, else 1.29 again), and `down -v` removes them.

The story is the demo's, five times faster, as in tests/test_demo_story.py: the
simulator runs ``Scenario.compressed(5)`` and Prometheus the rules with every window and
``for`` five times shorter (mounted over alerts/), scraping every 2 s. Everything else is
the compose file and the deploy/ files as a user runs them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy_tools import REPO, helm
from gpufleet.lab.processes import free_port, http_get, http_json, wait_until
from gpufleet.lab.realjob import compressed_rules
from gpufleet.rules.__main__ import write_rules
from gpufleet.simulate.config import load_scenario
from gpufleet.simulate.story import PAGES

FACTOR = 5
NODES = 64
SERVICES = ("fleet", "simulator", "prometheus", "alertmanager", "pager")  # all but Grafana
PROJECT = "gpufleet-containers-test"
LOCAL_IMAGES = REPO / "deploy/compose/local-images.yml"
SCENARIO_IN_CONTAINER = "/etc/gpufleet/demo-compressed.yaml"
PAGE_LINE = re.compile(r"PAGE (firing|resolved) (\w+) (.*?) receiver=")
STARTED = re.compile(r"its clock started at .* \(unix (\d+\.\d+)\)")


def docker(*args: str, timeout: float = 120, check: bool = True) -> str:
    result = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        pytest.fail(f"docker {' '.join(args[:4])}: {result.stderr.strip()[-2000:]}")
    return result.stdout


def image_exists(name: str) -> bool:
    found = subprocess.run(["docker", "image", "inspect", name], capture_output=True, check=False)
    return found.returncode == 0


def compose_image() -> str:
    image: str = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["fleet"][
        "image"
    ]
    return image


@pytest.fixture(scope="module", autouse=True)
def engine() -> None:
    """A Docker engine and the local images, or one line naming what is missing."""
    if shutil.which("docker") is None:
        pytest.fail("no docker CLI on PATH: run `make test-containers` (apt-get install docker.io)")
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if info.returncode != 0:
        pytest.fail("no Docker engine answers `docker info`: run `make test-containers`")
    for image in yaml.safe_load(LOCAL_IMAGES.read_text())["services"].values():
        name = image.get("image") or image.get("build", {}).get("args", {}).get("PYTHON_IMAGE")
        if name and not image_exists(name):
            pytest.fail(f"image {name} is missing: python3 deploy/compose/local-images/build.py")


# -- the agent under the chart's restrictions ---------------------------------------------


def chart_agent() -> tuple[dict[str, Any], dict[str, Any]]:
    """The rendered DaemonSet's pod and agent-container securityContext."""
    rendered = subprocess.run(
        [str(helm()), "template", "gpufleet", str(REPO / "helm/gpufleet")],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    (daemonset,) = [
        doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] == "DaemonSet"
    ]
    pod = daemonset["spec"]["template"]["spec"]
    (agent,) = [c for c in pod["containers"] if c["name"] == "agent"]
    writable = {m["mountPath"] for m in agent["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/tmp"}, f"the agent writes to {writable}: give docker run the same"
    return pod["securityContext"], agent["securityContext"]


def test_the_agent_image_runs_under_the_charts_restrictions(product_image: str) -> None:
    pod, container = chart_agent()
    assert container["readOnlyRootFilesystem"] is True
    assert container["capabilities"] == {"drop": ["ALL"]}
    assert container["allowPrivilegeEscalation"] is False and not container["privileged"]
    user = f"{pod['runAsUser']}:{pod['runAsGroup']}"
    port = free_port()
    name = f"gpufleet-agent-test-{os.getpid()}"
    docker(
        "run", "-d", "--name", name, "--read-only", "--cap-drop", "ALL", "--user", user,
        "--security-opt", "no-new-privileges", "--tmpfs", "/tmp", "-e", "NODE_NAME=node-007",
        "-p", f"127.0.0.1:{port}:9405", product_image, "agent", "--gpu-source", "synthetic",
    )  # fmt: skip
    try:
        # /metrics answers from the start; the GPU series follow the first collection,
        # which a loaded machine can delay past the first answer.
        def with_gpus() -> str | None:
            body = http_get(f"http://127.0.0.1:{port}/metrics").decode()
            return body if "DCGM_FI_DEV_GPU_TEMP{" in body else None

        body = wait_until(
            with_gpus, 90, interval=0.5, what="GPU series on the container's /metrics"
        )
        assert 'Hostname="node-007"' in body
        assert re.search(r"^gpufleet_agent_info\{.*\} 1\.0$", body, re.MULTILINE), body[:2000]
        # It runs as the chart's user, with no capability, and wrote nothing to its image.
        inside = docker("exec", name, "sh", "-c", "id -u; id -g; grep Cap /proc/self/status")
        uid, gid, *caps = inside.split("\n")
        assert f"{uid}:{gid}" == user
        assert all(line.split()[1] == "0000000000000000" for line in caps if line), caps
        assert docker("diff", name).strip() == ""
        assert docker("inspect", "-f", "{{.State.Running}}", name).strip() == "true"
    finally:
        docker("rm", "-f", name, check=False)


# -- the compose demo, twice -----------------------------------------------------------------


def compose_variants() -> list[tuple[str, list[str]]]:
    """(name, command) of each docker compose installed: Debian's 1.29, and v2 if any."""
    found = []
    v1 = shutil.which("docker-compose")
    if v1 is not None:
        found.append(("docker-compose 1.29", [v1]))
    v2 = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
    if v2.returncode == 0:
        found.append(("docker compose v2", ["docker", "compose"]))
    if not found:
        pytest.fail("no docker compose: apt-get install -y docker-compose (make test-containers)")
    return found


class Stack:
    """The compose project as the test runs it: the user's files plus one override."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.prometheus_port = free_port()
        self.alertmanager_port = free_port()
        self.override = workdir / "compressed.yml"
        self.files = [REPO / "docker-compose.yml", LOCAL_IMAGES, self.override]
        self.env = os.environ | {
            "GPUFLEET_PROMETHEUS_PORT": str(self.prometheus_port),
            "GPUFLEET_ALERTMANAGER_PORT": str(self.alertmanager_port),
        }

    @property
    def prometheus(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    def write_override(self) -> None:
        """The compressed story: the scenario and the rules five times faster, scraped
        every 2 s and evaluated every second (as tests/test_demo_story.py runs them)."""
        scenario = load_scenario("demo").compressed(FACTOR)
        data = {
            "name": scenario.name,
            "cluster": asdict(scenario.cluster),
            "rates": asdict(scenario.rates),
            "confounders": asdict(scenario.confounders),
            "episodes": scenario.episodes,
        }
        (self.workdir / "scenario.yaml").write_text(yaml.safe_dump(data))
        write_rules(self.workdir / "alerts", compressed_rules(FACTOR))
        config = (REPO / "deploy/prometheus/prometheus.yml").read_text()
        faster = config.replace("scrape_interval: 5s", "scrape_interval: 2s").replace(
            "evaluation_interval: 5s", "evaluation_interval: 1s"
        )
        assert faster.count("interval: 2s") + faster.count("interval: 1s") == 2, config
        (self.workdir / "prometheus.yml").write_text(faster)
        product = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
        command = list(product["simulator"]["command"])
        command[command.index("--scenario") + 1] = SCENARIO_IN_CONTAINER
        override = {
            "services": {
                "simulator": {
                    "command": command,
                    "volumes": [f"{self.workdir}/scenario.yaml:{SCENARIO_IN_CONTAINER}:ro"],
                },
                "prometheus": {
                    "volumes": [
                        f"{self.workdir}/alerts:/etc/gpufleet/alerts:ro",
                        f"{self.workdir}/prometheus.yml:"
                        "/etc/gpufleet/deploy/prometheus/prometheus.yml:ro",
                    ]
                },
            }
        }
        self.override.write_text(yaml.safe_dump(override))
        # Prometheus runs as nobody and the simulator as 10001: let them read these.
        for path in [self.workdir, *self.workdir.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)

    def compose(self, tool: list[str], *args: str, timeout: float = 300) -> str:
        files = [word for path in self.files for word in ("-f", str(path))]
        result = subprocess.run(
            [*tool, "-p", PROJECT, "--project-directory", str(REPO), *files, *args],
            capture_output=True, text=True, timeout=timeout, check=False, env=self.env,
            cwd=REPO,
        )  # fmt: skip
        if result.returncode != 0:
            pytest.fail(f"{' '.join(tool)} {' '.join(args)}: {result.stderr[-3000:]}")
        return result.stdout

    def logs(self, tool: list[str], service: str) -> str:
        return self.compose(tool, "logs", "--no-color", service, timeout=60)

    def container_ip(self, tool: list[str], service: str) -> str:
        (container,) = self.compose(tool, "ps", "-q", service).split()
        return docker(
            "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", container
        ).strip()

    def volumes(self) -> list[str]:
        listed = docker(
            "volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}"
        )
        return listed.split()


def ledger_get(url: str) -> Any:
    """A read of the compose ledger, with the demo token the compose file gives it."""
    token = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["fleet"][
        "environment"
    ]["GPUFLEET_FLEET_TOKEN"]
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def page_key(alertname: str, shown: str) -> tuple[str, str]:
    labels = dict(word.split("=", 1) for word in shown.split() if "=" in word)
    return alertname, labels.get("node") or labels.get("training_job", "-")


def fired(lines: str) -> set[tuple[str, str]]:
    """(alert, node or job) of every page the pager logged as firing."""
    return {
        page_key(match.group(2), match.group(3))
        for match in PAGE_LINE.finditer(lines)
        if match.group(1) == "firing"
    }


def first_firing(stack: Stack, t0: float) -> dict[tuple[str, str], float]:
    """When Prometheus first evaluated each alert as firing (its ALERTS series)."""
    query = urllib.parse.urlencode(
        {"query": 'ALERTS{alertstate="firing"}', "start": t0, "end": time.time(), "step": "1"}
    )
    found = http_json(f"{stack.prometheus}/api/v1/query_range?{query}")["data"]["result"]
    return {
        (s["metric"]["alertname"], s["metric"].get("node") or s["metric"].get("training_job", "-")):
        min(float(at) for at, _ in s["values"])
        for s in found
    }  # fmt: skip


def shipped_series() -> dict[str, str]:
    """major.minor of the Prometheus and Alertmanager the compose file pins (v3.5.3: 3.5);
    the local images must run the same series (Debian's builds add +ds1 and the like)."""
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    return {
        name: ".".join(services[name]["image"].split(":v", 1)[1].split(".")[:2])
        for name in ("prometheus", "alertmanager")
    }


def running_versions(stack: Stack) -> dict[str, str]:
    """major.minor of what the running containers report (build info, status)."""
    prometheus = http_json(f"{stack.prometheus}/api/v1/status/buildinfo")["data"]["version"]
    alertmanager = http_json(f"http://127.0.0.1:{stack.alertmanager_port}/api/v2/status")[
        "versionInfo"
    ]["version"]
    return {
        name: ".".join(version.split(".")[:2])
        for name, version in (("prometheus", prometheus), ("alertmanager", alertmanager))
    }


def tell_the_story(stack: Stack, tool: list[str]) -> dict[str, Any]:
    """One `up` of every service but Grafana; the story checked; figures returned."""
    began = time.monotonic()
    stack.compose(tool, "up", "-d", "--no-build", *SERVICES)
    t0 = float(
        wait_until(
            lambda: STARTED.search(stack.logs(tool, "simulator")),
            180,
            interval=1,
            what="the simulator to start its clock",
        ).group(1)
    )
    wait_until(
        lambda: (
            sum(
                target["health"] == "up"
                for target in http_json(f"{stack.prometheus}/api/v1/targets")["data"][
                    "activeTargets"
                ]
            )
            == NODES + 1
        ),
        120,
        interval=1,
        what="64 simulated nodes and the ledger up in Prometheus",
    )
    targets_up_s = time.time() - t0
    running = running_versions(stack)
    assert running == shipped_series(), f"running {running}, the compose file pins another"
    expected = {(name, subject) for names, subject, _ in PAGES for name in names}
    # The last page fires about 9:10 / FACTOR after t0 and reaches the pager 10 s later
    # (Alertmanager's group_wait, not compressed); be generous with a loaded machine.
    wait_until(
        lambda: fired(stack.logs(tool, "pager")) >= expected,
        max(30.0, t0 + 600 / FACTOR + 90 - time.time()),
        interval=2,
        what=f"the pages {sorted(expected)}",
    )
    # Anything else about to page has had time to: until 11:00 in story time, plus the
    # pager's group_wait.
    quiet_until = t0 + 660 / FACTOR + 12
    wait_until(lambda: time.time() >= quiet_until, 300, interval=1, what="a quiet spell")
    pager = stack.logs(tool, "pager")
    assert fired(pager) == expected, pager
    firing = first_firing(stack, t0)
    assert set(firing) == expected, f"firing in Prometheus: {sorted(firing)}"
    alerts = http_json(f"{stack.prometheus}/api/v1/alerts")["data"]["alerts"]
    assert not [a for a in alerts if a["labels"]["alertname"] == "GpuFleetJobHung"]
    times = [min(firing[(name, subject)] for name in names) - t0 for names, subject, _ in PAGES]
    story_s = [round(at * FACTOR) for at in times]
    assert times == sorted(times), f"pages at {story_s} s of the story"
    for (names, _, (earliest, latest)), at in zip(PAGES, story_s, strict=True):
        assert earliest * 60 <= at <= latest * 60, (names, at)
    # The ledger took every event of the simulator (none refused: this run's ledger).
    ledger = f"http://{stack.container_ip(tool, 'fleet')}:9406"
    exclusions = ledger_get(f"{ledger}/v1/exclusions")
    assert [(r["node"], r["reason"], r["source"]) for r in exclusions] == [
        ("node-040", "gpu_fell_off_bus", "auto")
    ]
    attempts = sorted(ledger_get(f"{ledger}/v1/attempts"), key=lambda r: r["attempt"])
    assert [(r["attempt"], r["trigger"], r["outcome"]) for r in attempts] == [
        (1, "initial", "failed"),
        (2, "auto", None),
    ]
    simulator_log = stack.logs(tool, "simulator")
    assert "refused" not in simulator_log and "unreachable" not in simulator_log, simulator_log
    return {
        "targets up (s after the clock started)": round(targets_up_s, 1),
        "pages (s of the uncompressed story)": story_s,
        "up to the last check (s)": round(time.monotonic() - began),
        "versions": running,
    }


@pytest.fixture(scope="module")
def product_image() -> Iterator[str]:
    """The product image as `docker compose build` makes it (the compose file's one
    build:), once for every test here: on a fresh engine nothing else has built it."""
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-build-"))
    stack = Stack(workdir)
    stack.write_override()
    name, tool = compose_variants()[0]
    started = time.monotonic()
    built = stack.compose(tool, "build", timeout=600)
    print(f"{name} build: {round(time.monotonic() - started)} s")
    assert image_exists(compose_image()), built
    try:
        yield compose_image()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def stack() -> Iterator[Stack]:
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-compose-"))
    stack = Stack(workdir)
    stack.write_override()
    tools = compose_variants()
    try:
        yield stack
    finally:
        for _, tool in tools[:1]:
            subprocess.run(
                [*tool, "-p", PROJECT, *[w for p in stack.files for w in ("-f", str(p))],
                 "down", "-v", "--remove-orphans"],
                cwd=REPO, env=stack.env, capture_output=True, timeout=180, check=False,
            )  # fmt: skip
        shutil.rmtree(workdir, ignore_errors=True)


def test_compose_builds_the_one_image_and_tells_the_story_twice(
    product_image: str, stack: Stack
) -> None:
    variants = compose_variants()
    first_name, first = variants[0]
    second_name, second = variants[-1]
    assert image_exists(product_image)
    try:
        print(f"run 1 ({first_name}):", tell_the_story(stack, first))
        stack.compose(first, "down")
        assert stack.volumes(), "down without -v keeps the named volumes"
        print(f"run 2 after down, volumes kept ({second_name}):", tell_the_story(stack, second))
    except BaseException:
        for service in SERVICES:
            print(f"--- {service} ---\n{stack.logs(first, service)[-3000:]}")
        raise
    stack.compose(second, "down", "-v")
    assert stack.volumes() == [], "down -v removes every volume of the project"
