"""deploy/kubernetes/: every manifest lints (yamllint) and validates against the Kubernetes API
schemas (kubernetes-validate, strict), and the pieces agree with each other and with the code:
ports, probes, the drain, the model config, the metric names."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")
yamllint_config = pytest.importorskip("yamllint.config")
yamllint_linter = pytest.importorskip("yamllint.linter")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402 - after the importorskips

from rtvideo.backend.runtime import metrics as model_metrics  # noqa: E402 - after the importorskips
from rtvideo.cli import build_parser  # noqa: E402 - after the importorskips: skipped without yamllint
from rtvideo.proxy.app import SHUTDOWN_SECONDS  # noqa: E402 - after the importorskips
from rtvideo.proxy.observability.metrics import ProxyMetrics  # noqa: E402 - after the importorskips
from rtvideo.triton.model_repo import MODEL_DIR, read_parameters  # noqa: E402 - after the importorskips
from tests.support.paths import REPO_ROOT  # noqa: E402 - after the importorskips

DEPLOY = REPO_ROOT / "deploy" / "kubernetes"
FILES = sorted(DEPLOY.rglob("*.yaml"))
LINT = yamllint_config.YamlLintConfig("{extends: default, rules: {line-length: {max: 120}, document-start: disable}}")
KUBERNETES_VERSION = "1.30.0"  # the oldest API the manifests are meant for (autoscaling/v2, policy/v1)


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def resources() -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) → resource, for every Kubernetes resource in deploy/kubernetes."""
    found = {}
    for path in FILES:
        for doc in documents(path):
            if "kind" in doc and not doc.get("apiVersion", "").startswith("kustomize."):
                found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def flags(args: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)


def test_there_are_manifests() -> None:
    names = {p.name for p in FILES}
    assert {
        "kustomization.yaml",
        "triton.yaml",
        "triton-service.yaml",
        "proxy.yaml",
        "proxy-service.yaml",
        "pdb.yaml",
        "hpa.yaml",
        "values.yaml",
        "configmap.yaml",
    } <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_yamllint(path: Path) -> None:
    problems = list(yamllint_linter.run(path.read_text(), LINT, str(path)))
    assert not problems, "\n".join(f"{path}:{p.line}:{p.column} {p.desc} ({p.rule})" for p in problems)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_resources_validate_against_the_api(path: Path) -> None:
    for doc in documents(path):
        if "kind" not in doc or doc["apiVersion"].startswith("kustomize."):
            continue  # the kustomization; prometheus-adapter's Helm values
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_manifest_here() -> None:
    (kustomization,) = documents(DEPLOY / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml"
    )
    assert [i["name"] for i in kustomization["images"]] == ["rtvideo"]


def test_proxy_deployment_drains_within_its_grace_and_reaches_triton_by_the_headless_service() -> None:
    r = resources()
    proxy = r[("Deployment", "rtvideo-proxy")]
    c = container(proxy)
    args = build_parser().parse_args(["serve", *c["args"]])  # every flag is one `rtvideo serve` knows
    grace = proxy["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > float(args.drain_seconds) + SHUTDOWN_SECONDS
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz" and c["livenessProbe"]["httpGet"]["path"] == "/livez"
    # The probes and the scrapes go to the health listener, which idle client connections cannot starve.
    assert c["readinessProbe"]["httpGet"]["port"] == "health" and c["livenessProbe"]["httpGet"]["port"] == "health"
    (url,) = args.triton_url
    host, port = url.rsplit(":", 1)
    service = r[("Service", host)]
    assert service["spec"]["clusterIP"] == "None"  # headless: one address per Triton pod
    assert [p["port"] for p in service["spec"]["ports"]] == [int(port)]
    assert service["spec"]["selector"] == r[("Deployment", "rtvideo-triton")]["spec"]["selector"]["matchLabels"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert sorted(ports) == ["health", "http"]
    assert int(flags(c["args"])["port"]) == ports["http"] and int(args.health_port) == ports["health"]
    assert proxy["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(ports["health"])
    front = r[("Service", "rtvideo-proxy")]
    assert [p["targetPort"] for p in front["spec"]["ports"]] == ["http"]  # the health listener is not published


def test_triton_deployment_ports_probes_and_model_config() -> None:
    r = resources()
    triton = r[("Deployment", "rtvideo-triton")]
    c = container(triton)
    f = flags(c["args"])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert f["allow-http"] == "true" and int(f["http-port"]) == ports["http"]  # for the probes
    assert int(f["grpc-port"]) == ports["grpc"] and int(f["metrics-port"]) == ports["metrics"]
    assert triton["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(ports["metrics"])
    probes = {k: c[k]["httpGet"] for k in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert {k: v["path"] for k, v in probes.items()} == {
        "startupProbe": "/v2/health/ready",
        "readinessProbe": "/v2/health/ready",
        "livenessProbe": "/v2/health/live",
    }
    assert all(v["port"] == "http" for v in probes.values())
    assert c["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert triton["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > int(f["exit-timeout-secs"])
    # The model config: mounted where --model-config-name looks for it.
    mount = next(m for m in c["volumeMounts"] if m["name"] == "model-config")
    assert mount["mountPath"] == f"{f['model-repository']}/realtime_video/configs"
    volume = next(v for v in triton["spec"]["template"]["spec"]["volumes"] if v["name"] == "model-config")
    config_map = r[("ConfigMap", volume["configMap"]["name"])]
    assert list(config_map["data"]) == [f"{f['model-config-name']}.pbtxt"]


def test_triton_and_proxy_pods_share_the_triton_key_from_a_secret() -> None:
    """Triton's pods are reached by the proxies over the network: every protocol but health is
    behind the key (as `rtvideo serve` starts its own Triton), which both take from one Secret
    (not optional: a Triton pod without it does not start open)."""
    from rtvideo.triton.access import KEY_ENV, restricted_http_flag, restricted_protocol_flag

    r = resources()
    refs = {}
    for name in ("rtvideo-triton", "rtvideo-proxy"):
        env = {e["name"]: e for e in container(r[("Deployment", name)]).get("env", [])}
        ref = env[KEY_ENV]["valueFrom"]["secretKeyRef"]
        assert not ref.get("optional", False), name
        refs[name] = (ref["name"], ref["key"])
    assert refs["rtvideo-triton"] == refs["rtvideo-proxy"]
    args = container(r[("Deployment", "rtvideo-triton")])["args"]
    key = f"$({KEY_ENV})"  # expanded by the kubelet from the container's environment
    assert restricted_protocol_flag(key) in args and restricted_http_flag(key) in args
    assert "--grpc-infer-allocation-pool-size=0" in args


def test_the_cluster_model_config_is_the_shipped_one_on_gpus() -> None:
    """Only the instance group and parameter values differ from model_repository/'s config.pbtxt."""
    (text,) = resources()[("ConfigMap", "rtvideo-triton-model")]["data"].values()
    shipped = (MODEL_DIR / "config.pbtxt").read_text()
    group = re.compile(r"^instance_group \[\n.*?^\]\n", re.S | re.M)
    value = re.compile(r'(parameters: \{ key: "[^"]+" value: \{ string_value: )"[^"]*"')
    assert "kind: KIND_GPU" in group.search(text).group(0)
    assert value.sub(r"\1", group.sub("", text)) == value.sub(r"\1", group.sub("", shipped))
    params = dict(re.findall(r'^parameters: \{ key: "([^"]+)" value: \{ string_value: "([^"]*)" \} \}', text, re.M))
    assert params.keys() == read_parameters().keys()
    assert int(params["max_sessions"]) >= 1 and params["device"] == "auto"  # auto: each instance its own GPU


def test_autoscalers_use_the_metrics_the_adapter_rules_make() -> None:
    r = resources()
    (values,) = documents(DEPLOY / "prometheus-adapter" / "values.yaml")
    rules = values["rules"]["custom"]
    adapter_config = yaml.safe_load(r[("ConfigMap", "adapter-config")]["data"]["config.yaml"])
    assert adapter_config["rules"] == rules  # the Helm values and the plain ConfigMap say the same
    made = {rule["name"]["as"] for rule in rules}
    assert "rtvideo_proxy_sessions_active" in made
    for name, target in (("rtvideo-proxy", "rtvideo-proxy"), ("rtvideo-triton", "rtvideo-triton")):
        hpa = r[("HorizontalPodAutoscaler", name)]
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": target}
        for metric in hpa["spec"]["metrics"]:
            assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] in made
    # a series the code exports: a family on a proxy's /metrics, or one the model registers with Triton
    proxy = {family.name for family in text_string_to_metric_families(ProxyMetrics().render())}
    model = set(model_metrics.FAMILIES) | set(model_metrics.HISTOGRAMS)
    for rule in rules:
        series = rule["name"]["as"]
        assert series in (proxy if "proxy" in series else model), series


def test_disruption_budgets_cover_both() -> None:
    r = resources()
    for name in ("rtvideo-proxy", "rtvideo-triton"):
        pdb = r[("PodDisruptionBudget", name)]
        assert pdb["spec"]["selector"]["matchLabels"] == r[("Deployment", name)]["spec"]["selector"]["matchLabels"]
