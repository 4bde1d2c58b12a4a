"""docker-compose.yml, the Dockerfile and the deploy/ files, checked without a Docker engine
(none exists on these machines): Debian's docker-compose validates the file, promtool and
amtool check the configurations, and every path a configuration names inside a container
is one that the compose file mounts from a file that exists."""

from __future__ import annotations

import configparser
import json
import posixpath
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy_tools import REPO, build_wheel, tool
from gpufleet.cli import COMMAND_EXTRAS, parse
from gpufleet.lab.deploytree import DeployTree

COMPOSE = REPO / "docker-compose.yml"
DEPLOY = REPO / "deploy"


def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return document


def service(name: str) -> dict[str, Any]:
    # The x-gpufleet anchor is merged by PyYAML as compose merges it.
    found: dict[str, Any] = compose()["services"][name]
    return found


def bind_mounts(name: str) -> dict[str, Path]:
    """Container path -> file or directory of this checkout, for a service's bind mounts."""
    mounts = {}
    for volume in service(name).get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            mounts[target] = REPO / source[2:]
    return mounts


def named_volumes(name: str) -> dict[str, str]:
    return {
        volume.split(":")[1]: volume.split(":")[0]
        for volume in service(name).get("volumes", [])
        if not volume.startswith("./")
    }


def flag(args: list[str], name: str) -> str:
    (value,) = [arg.split("=", 1)[1] for arg in args if arg.startswith(f"{name}=")]
    return value


def resolve_in_container(mounts: dict[str, Path], path: str) -> Path | None:
    """The checkout file behind a container path, through the longest mount that holds it."""
    for target in sorted(mounts, key=len, reverse=True):
        if path == target or path.startswith(target + "/"):
            return mounts[target] / path[len(target) :].lstrip("/")
    return None


def compose_config(file: Path) -> subprocess.CompletedProcess[str]:
    """``docker-compose config -q`` on ``file``: docker compose's own validation."""
    docker_compose = tool("docker-compose", "apt-get install -y docker-compose (make deploy-tools)")
    return subprocess.run(
        [docker_compose, "-f", str(file), "config", "-q"],
        cwd=file.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_docker_compose_config_is_valid() -> None:
    result = compose_config(COMPOSE)
    assert result.returncode == 0, result.stderr


def test_docker_compose_config_rejects_a_broken_file(tmp_path: Path) -> None:
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE.read_text().replace("    depends_on:", "    depends_onn:", 1))
    assert compose_config(broken).returncode != 0


def test_every_service_is_pinned_and_published_on_loopback_only() -> None:
    services = compose()["services"]
    assert set(services) == {"fleet", "simulator", "prometheus", "alertmanager", "pager", "grafana"}
    for name, spec in services.items():
        image = spec["image"]
        assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", image), f"{name}: {image} is not pinned"
        for port in spec.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
        assert spec["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in spec["security_opt"], name
        assert not spec.get("privileged"), name


def test_gpufleet_commands_parse_with_the_real_cli() -> None:
    fleet = parse(service("fleet")["command"])
    assert fleet.listen == ("0.0.0.0", 9406)
    simulator = parse(service("simulator")["command"])
    assert (simulator.scenario, simulator.nodes) == ("demo", 64)
    assert simulator.listen == ("simulator", 9500)
    assert service("simulator")["hostname"] == "simulator"
    assert simulator.fleet_url == "http://fleet:9406"
    assert simulator.fleet_token == service("fleet")["environment"]["GPUFLEET_FLEET_TOKEN"]
    # The simulator writes its file_sd list into the volume Prometheus reads as agents/.
    targets_dir = posixpath.dirname(simulator.targets_file)
    sim_volume = named_volumes("simulator")[targets_dir]
    assert (
        named_volumes("prometheus")["/etc/gpufleet/deploy/prometheus/targets/agents"] == sim_volume
    )
    pager = service("pager")
    assert pager["entrypoint"] == ["python", "-m", "gpufleet.lab.pager"]
    assert pager["network_mode"] == "service:alertmanager"
    assert pager["command"] == ["--listen", "{}:{}".format(*DeployTree(REPO).pager_address())]


def test_prometheus_config_paths_resolve_to_mounted_checkout_files() -> None:
    mounts = bind_mounts("prometheus")
    config_path = flag(service("prometheus")["command"], "--config.file")
    assert resolve_in_container(mounts, config_path) == DEPLOY / "prometheus/prometheus.yml"
    config = yaml.safe_load((DEPLOY / "prometheus/prometheus.yml").read_text())
    config_dir = posixpath.dirname(config_path)
    (rules,) = config["rule_files"]
    rules_in_container = posixpath.normpath(posixpath.join(config_dir, rules))
    assert resolve_in_container(mounts, posixpath.dirname(rules_in_container)) == REPO / "alerts"
    file_sd = [
        sd["files"][0]
        for block in [*config["scrape_configs"], *config["alerting"]["alertmanagers"]]
        for sd in block["file_sd_configs"]
    ]
    volumes = named_volumes("prometheus")
    for pattern in file_sd:
        directory = posixpath.dirname(posixpath.normpath(posixpath.join(config_dir, pattern)))
        source = resolve_in_container(mounts, directory)
        assert source is not None or directory in volumes, f"{directory} is not mounted"
        if source is not None:
            assert source.is_dir() and list(source.glob("*.json")), source


def test_compose_target_lists_name_the_compose_services() -> None:
    fleet = json.loads((DEPLOY / "compose/targets/fleet/fleet.json").read_text())
    assert fleet[0]["targets"] == ["fleet:9406"]
    assert parse(service("fleet")["command"]).listen == ("0.0.0.0", 9406)
    alertmanager = json.loads(
        (DEPLOY / "compose/targets/alertmanager/alertmanager.json").read_text()
    )
    assert alertmanager[0]["targets"] == ["alertmanager:9093"]


def test_alertmanager_config_is_mounted_and_amtool_accepts_it() -> None:
    config_path = flag(service("alertmanager")["command"], "--config.file")
    path = resolve_in_container(bind_mounts("alertmanager"), config_path)
    assert path == DEPLOY / "alertmanager/alertmanager.yml"
    amtool = tool("amtool", "apt-get install -y prometheus-alertmanager")
    result = subprocess.run(
        [amtool, "check-config", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 receivers" in result.stdout


def promtool_check(config: Path) -> subprocess.CompletedProcess[str]:
    promtool = tool("promtool", "apt-get install -y prometheus")
    return subprocess.run(
        [promtool, "check", "config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_promtool_checks_the_config_and_every_rule_file_in_the_compose_layout(
    tmp_path: Path,
) -> None:
    tree = DeployTree(tmp_path).prepare()
    for job in ("fleet", "alertmanager"):
        for source in (DEPLOY / "compose/targets" / job).glob("*.json"):
            (tree.targets_dir(job) / source.name).write_text(source.read_text())
    tree.write_targets("agents", ["simulator:9500"])
    result = promtool_check(tree.prometheus_config)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "does not exist" not in output, output
    for path in (REPO / "alerts").glob("*.rules.yaml"):
        assert f"Checking {tmp_path}/alerts/{path.name}" in output
        assert output.count("SUCCESS") >= 2


def test_promtool_check_config_fails_on_a_broken_rule_reference(tmp_path: Path) -> None:
    broken = tmp_path / "deploy/prometheus/prometheus.yml"
    broken.parent.mkdir(parents=True)
    broken.write_text(
        (DEPLOY / "prometheus/prometheus.yml")
        .read_text()
        .replace("scrape_interval", "scrape_intervl")
    )
    assert promtool_check(broken).returncode != 0


def test_grafana_provisioning_points_at_what_compose_mounts() -> None:
    mounts = bind_mounts("grafana")
    provisioning = resolve_in_container(mounts, "/etc/grafana/provisioning")
    assert provisioning == DEPLOY / "grafana/provisioning"
    (datasource,) = yaml.safe_load((provisioning / "datasources/gpufleet.yaml").read_text())[
        "datasources"
    ]
    assert datasource["uid"] == "gpufleet-prometheus"
    assert datasource["type"] == "prometheus" and datasource["isDefault"] is True
    assert datasource["url"] == "http://prometheus:9090"
    assert "0.0.0.0:9090" in flag(service("prometheus")["command"], "--web.listen-address")
    (provider,) = yaml.safe_load((provisioning / "dashboards/gpufleet.yaml").read_text())[
        "providers"
    ]
    dashboards_dir = provider["options"]["path"]
    assert resolve_in_container(mounts, dashboards_dir) == REPO / "dashboards"
    assert provider["allowUiUpdates"] is False

    ini = configparser.ConfigParser()
    ini.read(resolve_in_container(mounts, "/etc/grafana/grafana.ini") or "")
    assert ini["auth.anonymous"]["enabled"] == "true"
    assert ini["auth.anonymous"]["org_role"] == "Viewer"
    home = ini["dashboards"]["default_home_dashboard_path"]
    assert posixpath.dirname(home) == dashboards_dir
    # The home page is the fleet overview, whichever dashboards exist.
    overview = [
        path.name
        for path in (REPO / "dashboards").glob("*.json")
        if json.loads(path.read_text()).get("uid") == "gpufleet-overview"
    ]
    if list((REPO / "dashboards").glob("*.json")):
        assert overview == [posixpath.basename(home)]


def test_dockerfile_builds_from_files_that_exist_and_runs_as_non_root() -> None:
    text = (REPO / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+)(?: AS (\w+))?$", text, flags=re.MULTILINE)
    assert len(stages) == 2 and stages[0][1] == "build"
    for source in re.findall(r"^COPY (?!--from)(.+) \S+$", text, flags=re.MULTILINE):
        for path in source.split():
            assert (REPO / path).exists(), f"COPY {path}: no such file"
    final = text.split("\nFROM ", 2)[2]
    assert "COPY --from=build /opt/gpufleet /opt/gpufleet" in final
    assert re.search(r"^USER 10001:10001$", final, flags=re.MULTILINE)
    # Named volumes inherit this mode; Prometheus (another user) reads the simulator's list.
    assert "install -d -o 10001 -g 10001 -m 0755 /var/lib/gpufleet" in final
    assert 'ENTRYPOINT ["gpufleet"]' in final
    assert "NVIDIA_VISIBLE_DEVICES=all" in final
    assert "NVIDIA_DRIVER_CAPABILITIES=utility" in final
    assert not re.search(r"apt-get|gcc|build-essential", final), "no compilers in the final stage"
    # The services' extras at the pins CI runs; the image serves agent, fleet and simulate.
    (extras,) = re.findall(r"pip install -c constraints\.txt '\.\[([\w,]+)\]'$", text, re.MULTILINE)
    needed = {COMMAND_EXTRAS[command] for command in ("agent", "fleet", "simulate")}
    assert needed <= set(extras.split(","))
    ignore = [
        line for line in (REPO / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]  # fmt: skip
    assert ignore[0] == "*"
    assert {"!pyproject.toml", "!README.md", "!constraints.txt", "!exporter/"} <= set(ignore)


def test_the_build_context_holds_what_the_packages_links_point_to() -> None:
    # gpufleet/deploy/'s configurations are links to deploy/ (one committed copy): the
    # Dockerfile's build stage must copy their targets, and .dockerignore admit them.
    text = (REPO / "Dockerfile").read_text().split("\nFROM ", 2)[1]
    copied = [
        path.rstrip("/")
        for source in re.findall(r"^COPY (?!--from)(.+) \S+$", text, flags=re.MULTILINE)
        for path in source.split()
    ]
    admitted = [
        line[1:].rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    links = [path for path in (REPO / "exporter").rglob("*") if path.is_symlink()]
    assert links, "gpufleet/deploy/ links to deploy/'s demo configurations"
    for link in links:
        target = link.resolve().relative_to(REPO).as_posix()
        assert any(target == path or target.startswith(f"{path}/") for path in copied), target
        assert any(target == path or target.startswith(f"{path}/") for path in admitted), target


def test_the_image_install_ships_every_command_and_its_data(tmp_path: Path) -> None:
    # The Dockerfile installs this project's wheel: build it here (extras change no file).
    wheel = build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "gpufleet/lab/pager.py" in names
    assert "gpufleet/simulate/scenarios/demo.yaml" in names
    assert "gpufleet/gpu/fixtures/h100-sxm-8gpu.json" in names
    # `gpufleet demo` from a wheel copies these (tests/test_packaging.py runs it).
    assert "gpufleet/deploy/prometheus/prometheus.yml" in names
    assert "gpufleet/deploy/alertmanager/alertmanager.yml" in names
    entry_points = next(name for name in names if name.endswith("entry_points.txt"))
    assert "gpufleet = gpufleet.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_image_commands_need_only_the_images_extras() -> None:
    # The image installs the agent and sim extras: the agent, ledger, simulator and pager
    # must not import what only the dev, report or adapters extras bring.
    script = """
import sys
BLOCKED = {"pandas", "matplotlib", "torch", "lightning", "pytorch_lightning",
           "transformers", "accelerate", "hypothesis", "pytest", "httpx", "jsonschema",
           "kubernetes_validate"}
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not in the image")
sys.meta_path.insert(0, Block())
import gpufleet.agent.app, gpufleet.fleet.app, gpufleet.simulate.serve, gpufleet.lab.pager
from gpufleet.cli import main
main(["simulate", "--list-scenarios"])
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "demo" in result.stdout


@pytest.mark.parametrize("name", ["fleet", "simulator", "pager"])
def test_gpufleet_services_run_read_only_with_tmpfs(name: str) -> None:
    spec = service(name)
    assert spec["read_only"] is True and spec["tmpfs"][0] == "/tmp"
    assert spec["image"].startswith("gpufleet:")


def test_one_service_builds_the_image_the_others_run() -> None:
    services = compose()["services"]
    builders = {name for name, spec in services.items() if "build" in spec}
    assert builders == {"fleet"} and services["fleet"]["build"] == "."
    image = services["fleet"]["image"]
    assert [name for name, spec in services.items() if spec["image"] == image] == [
        "fleet", "simulator", "pager"
    ]  # fmt: skip


def tmpfs_mounts(name: str) -> dict[str, dict[str, str]]:
    """Container path -> the tmpfs options a service mounts there."""
    mounts = {}
    for entry in service(name).get("tmpfs", []):
        path, _, options = entry.partition(":")
        mounts[path] = dict(option.split("=", 1) for option in options.split(",") if option)
    return mounts


def test_every_run_starts_the_story_afresh_the_demo_state_is_on_tmpfs() -> None:
    # Kept series fire the last run's alerts, a kept notification log swallows the next
    # run's pages and a kept ledger refuses its exclusion (409): each lives for one run,
    # on a tmpfs owned by the user of its image (10001: the Dockerfile; nobody: prom/*).
    dockerfile_user = re.search(r"^USER (\d+):(\d+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert dockerfile_user is not None
    state = {
        "fleet": (posixpath.dirname(parse(service("fleet")["command"]).db), dockerfile_user[1]),
        "prometheus": (flag(service("prometheus")["command"], "--storage.tsdb.path"), "65534"),
        "alertmanager": (flag(service("alertmanager")["command"], "--storage.path"), "65534"),
    }
    for name, (path, uid) in state.items():
        assert tmpfs_mounts(name)[path] == {"uid": uid, "gid": uid}, name
        assert path not in named_volumes(name), name
    assert set(compose()["volumes"]) == {"sim-targets", "grafana-data"}


def test_the_dockerfile_needs_no_frontend_image() -> None:
    # A `# syntax=` line makes BuildKit pull a frontend image first: offline, that fails.
    first = (REPO / "Dockerfile").read_text().splitlines()[0]
    assert not re.match(r"#\s*syntax\s*=", first, re.IGNORECASE), first


LOCAL = DEPLOY / "compose/local-images.yml"


def test_the_local_images_override_is_valid_and_names_what_build_py_builds() -> None:
    docker_compose = tool("docker-compose", "apt-get install -y docker-compose (make deploy-tools)")
    result = subprocess.run(
        [docker_compose, "-f", str(COMPOSE), "-f", str(LOCAL), "config"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    merged = yaml.safe_load(result.stdout)["services"]
    build_py = (DEPLOY / "compose/local-images/build.py").read_text()
    constants = dict(re.findall(r'^([A-Z]+) = "(\S+)"$', build_py, re.MULTILINE))
    assert merged["fleet"]["build"]["args"] == {"PYTHON_IMAGE": constants["BASE"]}
    assert merged["prometheus"]["image"] == constants["PROMETHEUS"]
    assert merged["alertmanager"]["image"] == constants["ALERTMANAGER"]
    assert merged["grafana"]["profiles"] == ["grafana"]
    # The stand-ins keep the official images' layout the compose file relies on.
    stand_ins = (DEPLOY / "compose/local-images/monitoring.Dockerfile").read_text()
    for target, data in (("prometheus", "/prometheus"), ("alertmanager", "/alertmanager")):
        stage = stand_ins.split(f" AS {target}\n", 1)[1].split("\nFROM ", 1)[0]
        assert "USER nobody" in stage and f"WORKDIR {data}" in stage, target


def test_the_printed_timeline_and_the_scenario_text_say_what_the_tests_measure() -> None:
    from gpufleet.rules.config import RulesConfig
    from gpufleet.simulate.config import load_scenario
    from gpufleet.simulate.story import PAGES, STORY

    pages = [(minute, what) for minute, what in STORY if what.startswith("page")]
    assert len(pages) == len(PAGES)
    for (minute, what), (names, subject, (earliest, latest)) in zip(pages, PAGES, strict=True):
        first = re.search(r"(\d+):(\d\d)", minute)
        assert first is not None
        assert earliest * 60 <= int(first[1]) * 60 + int(first[2]) <= latest * 60, minute
        assert all(name in what for name in names) and subject in what
    rules = RulesConfig()
    scenario = load_scenario("demo")
    hang_minutes = rules.hang_min_seconds / 60
    down_s = scenario.rates.auto_restart_minutes_max * 60
    assert down_s < rules.hang_min_seconds
    assert f"down {down_s:g} s, not {hang_minutes:g} min" in STORY[-1][1]
    assert f"job-hung alert's {hang_minutes:g} minutes" in scenario.description
    assert f"after the rule's {rules.straggler_for.removesuffix('m')} minutes" in (
        scenario.description
    )
    assert "straggler page at ~4:30" in scenario.description and pages[0][0] == "~4:30"
    timeline = (REPO / "docs/quickstart.md").read_text()
    assert f"the alert waits {hang_minutes:g} min" in timeline
    for minute, _ in pages:
        assert f"| {minute} | **page" in timeline, minute


def test_the_simulator_logs_its_clock_and_the_demo_timeline() -> None:
    # `docker compose logs simulator` (serve_live prints this when it starts serving).
    from gpufleet.simulate.story import announce

    text = announce("demo", 64, 8, start=3600.0)
    assert text.startswith(
        "gpufleet simulate: 64 nodes x 8 GPUs, scenario demo; its clock started at "
        "1970-01-01 01:00:00 UTC (unix 3600.000)\n"
    )
    assert "  01:08:00        8:00  GPU 3 of node-040 falls off the bus" in text
    assert "  01:04:30       ~4:30  page: GpuFleetStragglerNode" in text
    assert announce("realistic-week", 16, 8, start=0.0).count("\n") == 1
