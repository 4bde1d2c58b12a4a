"""The Helm chart: lint, render every ci/*-values.yaml, validate each object offline
(built-in kinds with kubernetes-validate --strict, Prometheus Operator kinds against the
operator's CRD schemas in tests/fixtures/), and assert what each object must say."""

from __future__ import annotations

import base64
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from deploy_tools import CHART, REPO, helm

CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
# The Prometheus Operator's CRDs, copied with their licence (see the README there).
OPERATOR_SCHEMAS = REPO / "tests" / "fixtures" / "prometheus-operator-v0.93.0"
OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
# The chart's floor (Chart.yaml kubeVersion) and the newest schemas the validator has.
KUBERNETES_VERSIONS = ("1.28.0", kubernetes_validate.latest_version())
NAMESPACE = "gpufleet"


def render(*args: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [str(helm()), "template", "gpufleet", str(CHART), "--namespace", NAMESPACE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_error(*args: str) -> str:
    result = subprocess.run(
        [str(helm()), "template", "gpufleet", str(CHART), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0, "helm template accepted values it should refuse"
    return result.stderr


def values_file(name: str) -> list[str]:
    return ["-f", str(CHART / "ci" / f"{name}-values.yaml")]


def objects(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, component: str | None = None) -> dict[str, Any]:
    found = [
        doc
        for doc in objects(docs, kind)
        if component is None
        or doc["metadata"]["labels"].get("app.kubernetes.io/component") == component
    ]
    assert len(found) == 1, f"{len(found)} {kind} objects for {component}"
    return found[0]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


def operator_schema(kind: str) -> dict[str, Any]:
    plural = {"ServiceMonitor": "servicemonitors", "PodMonitor": "podmonitors"}.get(
        kind, "prometheusrules"
    )
    path = OPERATOR_SCHEMAS / f"monitoring.coreos.com_{plural}.yaml"
    if not path.is_file():
        pytest.fail(f"{path} is missing: the repository ships it (tests/fixtures/)")
    crd = yaml.safe_load(path.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def crd_validator(kind: str) -> jsonschema.Draft7Validator:
    # The CRDs hold Go regexes (`^(?i)...`) that Python's `re` refuses as a schema
    # check; validating instances needs only the patterns of fields that are present.
    return jsonschema.Draft7Validator(operator_schema(kind))


def test_ci_values_cover_the_issue_scenarios() -> None:
    names = {path.name for path in CI_VALUES}
    assert names >= {
        "default-values.yaml",
        "monitoring-values.yaml",
        "hostport-values.yaml",
        "privileged-values.yaml",
        "pod-attribution-values.yaml",
        "kube-watch-values.yaml",
    }


def test_helm_lint_strict_passes_for_every_ci_values_file() -> None:
    for path in CI_VALUES:
        result = subprocess.run(
            [str(helm()), "lint", "--strict", str(CHART), "-f", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, f"{path.name}:\n{result.stdout}\n{result.stderr}"


@pytest.fixture(scope="module", params=[path.name for path in CI_VALUES])
def rendered(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    name: str = request.param
    yield name, render("-f", str(CHART / "ci" / name))


def test_every_builtin_object_validates_strictly(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    name, docs = rendered
    builtin = [doc for doc in docs if doc["kind"] not in OPERATOR_KINDS]
    assert builtin, name
    for doc in builtin:
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                pytest.fail(
                    f"{name}: {doc['kind']} {doc['metadata']['name']} on {version}: {error}"
                )


def test_operator_objects_validate_against_the_crd_schemas(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    name, docs = rendered
    for doc in docs:
        if doc["kind"] in OPERATOR_KINDS:
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            try:
                crd_validator(doc["kind"]).validate(doc)
            except jsonschema.ValidationError as error:
                pytest.fail(f"{name}: {doc['kind']} {doc['metadata']['name']}: {error.message}")


def test_the_crd_schema_check_can_fail() -> None:
    broken = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "x"},
        "spec": {"endpoints": [{"port": 9405}], "selector": {}},  # port must be a name
    }
    with pytest.raises(jsonschema.ValidationError):
        crd_validator("ServiceMonitor").validate(broken)


def test_every_container_is_least_privilege_unless_privileged_mode(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    name, docs = rendered
    privileged_mode = name == "privileged-values.yaml"
    # The kubelet's pod-resources socket is root's alone: with pod attribution the agent
    # container (only it) runs as uid 0, still without any capability.
    root_agent = name == "pod-attribution-values.yaml"
    for workload in objects(docs, "DaemonSet") + objects(docs, "Deployment"):
        spec = pod_spec(workload)
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] > 0
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert "hostNetwork" not in spec and "hostPID" not in spec and "hostIPC" not in spec
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True
            if root_agent and workload["kind"] == "DaemonSet":
                assert (context["runAsNonRoot"], context["runAsUser"]) == (False, 0)
            else:
                assert context["runAsNonRoot"] is True
                assert "runAsUser" not in context
            if privileged_mode and workload["kind"] == "DaemonSet":
                assert context["privileged"] is True
                continue
            assert context["privileged"] is False
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert container["resources"]["requests"] and container["resources"]["limits"]
    for account in objects(docs, "ServiceAccount"):
        assert account["automountServiceAccountToken"] is False
    assert not objects(docs, "Role")
    # The one grant the chart may make: kube-watch reading nodes (tested below).
    for role in objects(docs, "ClusterRole"):
        assert name == "kube-watch-values.yaml"
        verbs = {verb for rule in role["rules"] for verb in rule["verbs"]}
        assert verbs <= {"get", "list", "watch"}


def test_only_privileged_mode_renders_a_privileged_container() -> None:
    default = pod_spec(one(render(), "DaemonSet"))["containers"][0]["securityContext"]
    privileged = pod_spec(one(render(*values_file("privileged")), "DaemonSet"))
    assert default["privileged"] is False
    assert privileged["containers"][0]["securityContext"]["privileged"] is True


def test_agent_daemonset_targets_gpu_nodes_and_tolerates_the_gpu_taint() -> None:
    daemonset = one(render(), "DaemonSet", "agent")
    spec = pod_spec(daemonset)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    assert daemonset["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }
    container = spec["containers"][0]
    assert container["args"] == ["agent"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = env_of(container)
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert env["GPUFLEET_LISTEN"] == "0.0.0.0:9405"
    assert "nvidia.com/gpu" not in str(container["resources"]), "the agent requests no GPU"
    assert "runtimeClassName" not in spec
    # as dcgm-exporter's chart: the node's monitor is evicted last
    assert spec["priorityClassName"] == "system-node-critical"
    # Measured figures the requests are sized from (values.yaml, chart README).
    assert container["resources"]["requests"]["memory"] == "96Mi"
    assert container["resources"]["limits"]["memory"] == "256Mi"


def test_runtime_class_priority_and_hostport_are_values() -> None:
    docs = render(*values_file("hostport"))
    spec = pod_spec(one(docs, "DaemonSet", "agent"))
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["priorityClassName"] == "system-node-critical"
    (port,) = spec["containers"][0]["ports"]
    assert port == {"name": "http", "containerPort": 9405, "protocol": "TCP", "hostPort": 9405}
    assert env_of(spec["containers"][0])["GPUFLEET_EXPECTED_GPUS"] == "8"
    default_ports = pod_spec(one(render(), "DaemonSet", "agent"))["containers"][0]["ports"]
    assert "hostPort" not in default_ports[0]


def test_agent_service_keeps_traffic_on_the_node() -> None:
    service = one(render(), "Service", "agent")
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    assert service["spec"]["selector"] == {
        "app.kubernetes.io/name": "gpufleet",
        "app.kubernetes.io/instance": "gpufleet",
        "app.kubernetes.io/component": "agent",
    }


def test_tokens_come_from_secrets_mounted_as_files_never_from_plain_values() -> None:
    docs = render()
    secret = one(docs, "Secret", "agent")
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(token) == 40 and token.isalnum()
    for workload, variable, mount in (
        (one(docs, "DaemonSet", "agent"), "GPUFLEET_INGEST_TOKEN_FILE", "ingest-token"),
        (one(docs, "Deployment", "fleet"), "GPUFLEET_FLEET_TOKEN_FILE", "fleet-token"),
    ):
        spec = pod_spec(workload)
        container = spec["containers"][0]
        env = env_of(container)
        assert env[variable] == f"/etc/gpufleet/{mount}/token"
        assert not {"GPUFLEET_INGEST_TOKEN", "GPUFLEET_FLEET_TOKEN"} & set(env)
        assert not any(name.startswith("GPUFLEET_ALLOW_UNAUTHENTICATED") for name in env)
        volume = next(v for v in spec["volumes"] if v["name"] == mount)
        assert volume["secret"]["secretName"].endswith("token")
        assert {"name": mount, "mountPath": f"/etc/gpufleet/{mount}", "readOnly": True} in (
            container["volumeMounts"]
        )
    # The secret's value appears in the Secret alone.
    rendered_elsewhere = yaml.safe_dump([doc for doc in docs if doc["kind"] != "Secret"])
    assert token not in rendered_elsewhere
    assert secret["data"]["token"] not in rendered_elsewhere


def test_an_existing_secret_is_referenced_not_created() -> None:
    docs = render(*values_file("hostport"))
    assert not objects(docs, "Secret")
    volumes = pod_spec(one(docs, "DaemonSet", "agent"))["volumes"]
    assert any(v.get("secret", {}).get("secretName") == "gpufleet-ingest-token" for v in volumes)


def test_no_token_needs_an_explicit_unauthenticated_switch() -> None:
    error = render_error("--set", "agent.ingestToken.create=false")
    assert "agent.allowUnauthenticatedIngest=true" in error
    error = render_error("--set", "fleet.token.create=false")
    assert "fleet.allowUnauthenticatedWrites=true" in error
    docs = render(
        "--set", "agent.ingestToken.create=false", "--set", "agent.allowUnauthenticatedIngest=true"
    )  # fmt: skip
    env = env_of(pod_spec(one(docs, "DaemonSet", "agent"))["containers"][0])
    assert env["GPUFLEET_ALLOW_UNAUTHENTICATED_INGEST"] == "true"
    assert "GPUFLEET_INGEST_TOKEN_FILE" not in env


def test_values_schema_rejects_typos_and_bad_choices() -> None:
    assert "Additional property acess is not allowed" in render_error("--set", "agent.acess=x")
    assert "agent.access" in render_error("--set", "agent.access=nodePort")
    assert "gpuSource" in render_error("--set", "agent.gpuSource=dcgm")


def test_fleet_ledger_is_one_recreated_replica_on_a_volume() -> None:
    docs = render()
    deployment = one(docs, "Deployment", "fleet")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    claim = one(docs, "PersistentVolumeClaim", "fleet")
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    volumes = pod_spec(deployment)["volumes"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]}} in (
        volumes
    )
    assert env_of(pod_spec(deployment)["containers"][0])["GPUFLEET_FLEET_DB"].startswith(
        "/var/lib/gpufleet/"
    )
    assert one(docs, "Service", "fleet")["spec"]["ports"][0]["port"] == 9406


def test_operator_objects_are_off_by_default() -> None:
    kinds = {doc["kind"] for doc in render()}
    assert not kinds & (OPERATOR_KINDS | {"ConfigMap", "NetworkPolicy"})


def test_service_monitors_set_the_job_names_the_rules_select() -> None:
    docs = render(*values_file("monitoring"))
    jobs = {}
    for monitor in objects(docs, "ServiceMonitor"):
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        (endpoint,) = monitor["spec"]["endpoints"]
        (job,) = [
            r["replacement"] for r in endpoint["relabelings"] if r.get("targetLabel") == "job"
        ]
        jobs[monitor["metadata"]["labels"]["app.kubernetes.io/component"]] = job
    assert jobs == {"agent": "gpufleet-agent", "fleet": "gpufleet-fleet"}
    rules_text = "".join(path.read_text() for path in (REPO / "alerts").glob("*.rules.yaml"))
    for job in jobs.values():
        assert f'job="{job}"' in rules_text


def test_prometheus_rules_equal_alerts_directory() -> None:
    docs = render(*values_file("monitoring"))
    rendered_groups = {
        rule["metadata"]["annotations"]["gpufleet.io/source"]: rule["spec"]
        for rule in objects(docs, "PrometheusRule")
    }
    sources = sorted((REPO / "alerts").glob("*.rules.yaml"))
    assert sources
    assert rendered_groups == {
        f"alerts/{path.name}": yaml.safe_load(path.read_text()) for path in sources
    }
    for rule in objects(docs, "PrometheusRule"):
        assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_dashboard_configmaps_carry_every_dashboard_for_the_sidecar() -> None:
    docs = render(*values_file("monitoring"))
    maps = objects(docs, "ConfigMap")
    shipped = {}
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert config_map["metadata"]["namespace"] == "monitoring"
        shipped.update(config_map["data"])
    sources = {path.name: path.read_text() for path in (REPO / "dashboards").glob("*.json")}
    assert {name: text.rstrip("\n") for name, text in shipped.items()} == {
        name: text.rstrip("\n") for name, text in sources.items()
    }


def test_network_policies_admit_prometheus_and_the_named_peers_only() -> None:
    docs = render(*values_file("monitoring"))
    policies = {p["metadata"]["labels"]["app.kubernetes.io/component"]: p for p in objects(
        docs, "NetworkPolicy"
    )}  # fmt: skip
    assert set(policies) == {"agent", "fleet"}
    agent = policies["agent"]["spec"]
    assert agent["policyTypes"] == ["Ingress"]
    (rule,) = agent["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert rule["from"][0]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
    }
    assert rule["from"][1] == {
        "namespaceSelector": {"matchLabels": {"gpufleet.io/training": "true"}}
    }
    (fleet_rule,) = policies["fleet"]["spec"]["ingress"]
    assert len(fleet_rule["from"]) == 2


def test_kube_watch_is_off_by_default_and_grants_nothing() -> None:
    docs = render()
    assert not objects(docs, "ClusterRole") and not objects(docs, "ClusterRoleBinding")
    spec = pod_spec(one(docs, "Deployment", "fleet"))
    assert [c["name"] for c in spec["containers"]] == ["fleet"]
    assert spec["automountServiceAccountToken"] is False


def test_kube_watch_reads_nodes_only_and_gets_the_token_alone() -> None:
    """Issue 36: the Node watch runs in the ledger's pod with a read-only ClusterRole on
    nodes; the service account token reaches the watcher's container, not the ledger's."""
    from gpufleet.cli.kube import KUBE_WATCH_OPTIONS

    docs = render(*values_file("kube-watch"))
    (role,) = objects(docs, "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}
    ]
    (binding,) = objects(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    deployment = one(docs, "Deployment", "fleet")
    spec = pod_spec(deployment)
    assert spec["automountServiceAccountToken"] is False
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": spec["serviceAccountName"], "namespace": NAMESPACE}
    ]
    ledger, watcher = spec["containers"]
    assert watcher["args"] == ["kube-watch"]
    token_dir = "/var/run/secrets/kubernetes.io/serviceaccount"
    assert token_dir in {m["mountPath"] for m in watcher["volumeMounts"]}
    assert token_dir not in {m["mountPath"] for m in ledger["volumeMounts"]}
    (api,) = [v for v in spec["volumes"] if v["name"] == "kube-api-access"]
    kinds = [next(iter(source)) for source in api["projected"]["sources"]]
    assert kinds == ["serviceAccountToken", "configMap", "downwardAPI"]
    env = env_of(watcher)
    assert env["GPUFLEET_FLEET_URL"] == "http://127.0.0.1:9406"
    assert env["GPUFLEET_FLEET_TOKEN_FILE"] == "/etc/gpufleet/fleet-token/token"
    assert env["GPUFLEET_KUBE_WATCH_TAINTS"] == "nvidia.com/*,nvsentinel.dgxc.nvidia.com/*"
    assert not {n for n in env if n.startswith("GPUFLEET_")} - {
        option.env for option in KUBE_WATCH_OPTIONS
    }
    ports = {p["name"]: p["port"] for p in one(docs, "Service", "fleet")["spec"]["ports"]}
    assert ports == {"http": 9406, "watch-metrics": 9407}
    monitor = one(docs, "ServiceMonitor", "fleet")
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["http", "watch-metrics"]
    policy = one(docs, "NetworkPolicy", "fleet")
    assert [[p["port"] for p in rule["ports"]] for rule in policy["spec"]["ingress"]] == [
        ["http"],
        ["watch-metrics"],
    ]


def test_kube_watch_chart_defaults_are_the_cli_defaults() -> None:
    from gpufleet.cli import kube

    values = yaml.safe_load((CHART / "values.yaml").read_text())["fleet"]["kubeWatch"]
    assert values["taints"] == kube.DEFAULT_TAINTS
    assert values["ignoreTaints"] == kube.DEFAULT_IGNORED_TAINTS
    assert values["conditions"] == kube.DEFAULT_CONDITIONS
    assert values["cordon"] is True


def test_pod_attribution_reads_the_pod_resources_socket_read_only() -> None:
    spec = pod_spec(one(render(*values_file("pod-attribution")), "DaemonSet", "agent"))
    (volume,) = [v for v in spec["volumes"] if v["name"] == "pod-resources"]
    assert volume["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}
    (container,) = spec["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "pod-resources")
    assert mount == {
        "name": "pod-resources",
        "mountPath": "/var/lib/kubelet/pod-resources",
        "readOnly": True,
    }
    env = env_of(container)
    assert env["GPUFLEET_KUBERNETES"] == "true"
    assert env["GPUFLEET_POD_RESOURCES_KUBELET_SOCKET"] == (
        "/var/lib/kubelet/pod-resources/kubelet.sock"
    )
    assert env["GPUFLEET_KUBERNETES_GPU_ID_TYPE"] == "uid"
    assert env["GPUFLEET_NVIDIA_RESOURCE_NAMES"] == "nvidia.com/a100"
    # root for the socket, and nothing more: no capability, no API access
    context = container["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"], context["runAsNonRoot"]) == (0, 0, False)
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["allowPrivilegeEscalation"] is False
    assert context["privileged"] is False
    assert spec["automountServiceAccountToken"] is False

    default = pod_spec(one(render(), "DaemonSet", "agent"))
    assert "pod-resources" not in str(default["volumes"])
    assert not {"GPUFLEET_KUBERNETES", "GPUFLEET_HPC_JOB_MAPPING_DIR"} & set(
        env_of(default["containers"][0])
    )
    device_names = pod_spec(
        one(
            render(
                "--set", "agent.podAttribution.enabled=true",
                "--set", "agent.podAttribution.gpuIdType=device-name",
                "--set", "agent.podAttribution.runAsUser=4242",
            ),
            "DaemonSet",
            "agent",
        )
    )["containers"][0]  # fmt: skip
    assert env_of(device_names)["GPUFLEET_KUBERNETES_GPU_ID_TYPE"] == "device-name"
    assert "GPUFLEET_NVIDIA_RESOURCE_NAMES" not in env_of(device_names)
    context = device_names["securityContext"]
    assert (context["runAsUser"], context["runAsNonRoot"]) == (4242, True)
    assert "runAsGroup" not in context
    assert "gpuIdType" in render_error("--set", "agent.podAttribution.gpuIdType=index")


def test_hpc_job_mapping_dir_is_mounted_read_only() -> None:
    spec = pod_spec(one(render(*values_file("pod-attribution")), "DaemonSet", "agent"))
    (volume,) = [v for v in spec["volumes"] if v["name"] == "hpc-jobs"]
    assert volume["hostPath"] == {"path": "/run/gpufleet/hpc-jobs", "type": "DirectoryOrCreate"}
    (container,) = spec["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "hpc-jobs")
    assert mount == {"name": "hpc-jobs", "mountPath": "/run/gpufleet/hpc-jobs", "readOnly": True}
    assert env_of(container)["GPUFLEET_HPC_JOB_MAPPING_DIR"] == "/run/gpufleet/hpc-jobs"
    assert "hpcJobMappingDir" in render_error("--set", "agent.hpcJobMappingDir=relative/dir")


def test_the_agent_service_monitor_honors_the_agent_s_pod_labels() -> None:
    docs = render(*values_file("monitoring"))
    monitor = next(
        doc
        for doc in objects(docs, "ServiceMonitor")
        if doc["metadata"]["labels"]["app.kubernetes.io/component"] == "agent"
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    # Without it Prometheus renames the exposed pod / namespace to exported_pod / ...
    assert endpoint["honorLabels"] is True
    # ...and the agent pod's own target labels go, so a GPU no pod holds carries none.
    assert endpoint["relabelings"][0] == {
        "action": "labeldrop",
        "regex": "(namespace|pod|container)",
    }
    fleet = next(
        doc
        for doc in objects(docs, "ServiceMonitor")
        if doc["metadata"]["labels"]["app.kubernetes.io/component"] == "fleet"
    )
    assert "honorLabels" not in fleet["spec"]["endpoints"][0]


def test_the_chart_links_the_generated_rules_and_dashboards_and_packages_them(
    tmp_path: Path,
) -> None:
    # One committed copy: files/rules, files/dashboards and files/sharding are links to
    # alerts/, dashboards/ and deploy/sharding/, and `helm package` follows them (without
    # the runbook and promtool tests).
    links = (("rules", "alerts"), ("dashboards", "dashboards"), ("sharding", "deploy/sharding"))
    for link, source in links:
        path = CHART / "files" / link
        assert path.is_symlink() and path.resolve() == (REPO / source).resolve()
    result = subprocess.run(
        [str(helm()), "package", str(CHART), "--destination", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (package,) = tmp_path.glob("gpufleet-*.tgz")
    with tarfile.open(package) as archive:
        packaged = {
            member.name.removeprefix("gpufleet/"): archive.extractfile(member).read()
            for member in archive.getmembers()
            if member.name.startswith("gpufleet/files/")
        }
    expected = (
        {
            f"files/rules/{path.name}": path.read_bytes()
            for path in sorted((REPO / "alerts").glob("*.rules.yaml"))
        }
        | {
            f"files/dashboards/{path.name}": path.read_bytes()
            for path in sorted((REPO / "dashboards").glob("*.json"))
        }
        | {
            f"files/sharding/{path.name}": path.read_bytes()
            for path in sorted((REPO / "deploy" / "sharding").glob("*.yaml"))
        }
    )
    assert packaged == expected


def value_paths(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    # Free-form maps (selectors, resources, labels) are documented as one value.
    free_form = {"nodeSelector", "affinity", "resources", "commonLabels", "additionalLabels",
                 "podAnnotations", "podLabels", "namespaceSelector", "podSelector",
                 "shardRuleLabels", "globalRuleLabels"}  # fmt: skip
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in free_form:
            yield from value_paths(value, f"{path}.")
        else:
            yield path


def test_chart_readme_documents_every_value() -> None:
    readme = (CHART / "README.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = [path for path in value_paths(values) if f"`{path}`" not in readme]
    assert not missing, f"values missing from helm/gpufleet/README.md: {missing}"


def test_defaults_meet_the_restricted_pod_security_standard() -> None:
    # The restricted profile's volume types and host access; the container settings are
    # asserted for every values file above.
    allowed_volumes = {"emptyDir", "secret", "persistentVolumeClaim", "configMap", "projected"}
    for workload in objects(render(), "DaemonSet") + objects(render(), "Deployment"):
        spec = pod_spec(workload)
        for volume in spec["volumes"]:
            assert set(volume) - {"name"} <= allowed_volumes, volume
        for container in spec["containers"]:
            assert all("hostPort" not in port for port in container["ports"])


def test_every_gpufleet_variable_the_chart_sets_is_one_the_cli_reads() -> None:
    from gpufleet.cli import AGENT_OPTIONS, FLEET_OPTIONS

    docs = render(*values_file("pod-attribution"))
    fleet_docs = render()
    agent_env = set(env_of(pod_spec(one(docs, "DaemonSet", "agent"))["containers"][0]))
    agent_env |= set(env_of(pod_spec(one(fleet_docs, "DaemonSet", "agent"))["containers"][0]))
    fleet_env = set(env_of(pod_spec(one(fleet_docs, "Deployment", "fleet"))["containers"][0]))
    fleet_env |= set(env_of(pod_spec(one(docs, "Deployment", "fleet"))["containers"][0]))
    unknown_fleet = {n for n in fleet_env if n.startswith("GPUFLEET_")} - {
        option.env for option in FLEET_OPTIONS
    }
    assert not unknown_fleet
    assert {"GPUFLEET_KUBERNETES", "GPUFLEET_HPC_JOB_MAPPING_DIR"} <= agent_env
    unknown_agent = {n for n in agent_env if n.startswith("GPUFLEET_")} - {
        option.env for option in AGENT_OPTIONS
    }
    assert not unknown_agent
