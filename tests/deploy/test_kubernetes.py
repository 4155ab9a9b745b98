"""deploy/kubernetes/: every manifest lints (yamllint) and validates against the Kubernetes API
schemas (kubernetes-validate, strict), and the pieces agree with each other and with the code:
ports, probes, the drain and the handoff within the grace, the session store's wiring, the model
config, the metric names."""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")
yamllint_config = pytest.importorskip("yamllint.config")
yamllint_linter = pytest.importorskip("yamllint.linter")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402 - after the importorskips

from rtvideo import settings_text  # noqa: E402 - after the importorskips
from rtvideo.backend.runtime import metrics as model_metrics  # noqa: E402 - after the importorskips
from rtvideo.cli import build_parser  # noqa: E402 - after the importorskips: skipped without yamllint
from rtvideo.proxy.app import SHUTDOWN_SECONDS  # noqa: E402 - after the importorskips
from rtvideo.proxy.observability.metrics import ProxyMetrics  # noqa: E402 - after the importorskips
from rtvideo.proxy.placement.bridge import END_GRACE_SECONDS  # noqa: E402 - after the importorskips
from rtvideo.proxy.settings import ProxySettings  # noqa: E402 - after the importorskips
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
        "networkpolicy.yaml",
        "redis.yaml",
        "redis-service.yaml",
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


def test_proxy_deployment_probes_ports_and_reaches_triton_by_the_headless_service() -> None:
    r = resources()
    proxy = r[("Deployment", "rtvideo-proxy")]
    c = container(proxy)
    args = build_parser().parse_args(["serve", *c["args"]])  # every flag is one `rtvideo serve` knows
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


# --- replicas and their session store (docs/operations.md "Rolling updates") ------------------------


def store_field() -> Any:
    (field,) = [f for f in dataclasses.fields(ProxySettings) if f.name == "session_store"]
    return field


def test_the_proxy_gets_sigterm_after_the_pre_stop_and_ends_within_its_grace() -> None:
    """The kubelet runs the preStop, then sends SIGTERM, and kills the container when the grace
    (counted from the start, the preStop included) is over. After SIGTERM (proxy/app.py `drain`,
    then `stop`): the handoffs run inside the drain's time (its deadline is set before them), each
    within its store calls, its sequence's end and twice SHUTDOWN_SECONDS (`closed_within`); the
    sessions left then (not resumable) end within twice SHUTDOWN_SECONDS; the pool's stop waits
    for sequence ends END_GRACE_SECONDS + 1 more. All of it must fit, or a session is cut."""
    from rtvideo.proxy.store.redis_store import CALL_SECONDS  # the redis extra: a part of `test`

    proxy = resources()[("Deployment", "rtvideo-proxy")]
    spec = proxy["spec"]["template"]["spec"]
    c = container(proxy)
    args = build_parser().parse_args(["serve", *c["args"]])
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pre_stop >= 5  # endpoints, kube-proxies and ingress controllers catch up before the 1012s
    hand_off = 2 * CALL_SECONDS + END_GRACE_SECONDS + 2 * SHUTDOWN_SECONDS  # its writes and release, then the rest
    after_sigterm = max(float(args.drain_seconds), hand_off) + 2 * SHUTDOWN_SECONDS + END_GRACE_SECONDS + 1
    assert spec["terminationGracePeriodSeconds"] > pre_stop + after_sigterm


def test_rollouts_keep_replicas_to_resume_on() -> None:
    """Every session can be continued on another copy only while there is one: at least two
    copies, an old one goes only after its successor is ready, and disruptions take one at a time."""
    r = resources()
    proxy = r[("Deployment", "rtvideo-proxy")]
    assert (
        proxy["spec"]["replicas"] >= 2 and r[("HorizontalPodAutoscaler", "rtvideo-proxy")]["spec"]["minReplicas"] >= 2
    )
    assert proxy["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert r[("PodDisruptionBudget", "rtvideo-proxy")]["spec"]["minAvailable"] >= 1


def test_the_proxies_read_the_store_url_from_a_secret_never_from_the_command_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The URL may carry the store's password: a secret setting, given in the environment from a
    Secret (not optional: a copy without it keeps its sessions in its own memory, and a rollout
    ends them), and no `--session-store` flag; `rtvideo serve` reads that variable."""
    field = store_field()
    assert field.metadata["secret"]
    c = container(resources()[("Deployment", "rtvideo-proxy")])
    assert not any(a.startswith(settings_text.flag_name(field)) for a in c["args"])
    env = {e["name"]: e for e in c["env"]}
    ref = env[settings_text.env_name(field)]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "rtvideo-session-store", "key": "url"}  # no `optional`
    url = "redis://:pw@rtvideo-redis:6379/0"
    monkeypatch.setenv(settings_text.env_name(field), url)
    assert build_parser().parse_args(["serve", *c["args"]]).session_store == url


def test_the_store_runs_without_persistence_its_password_in_a_file_from_the_same_secret() -> None:
    r = resources()
    redis = r[("StatefulSet", "rtvideo-redis")]
    spec = redis["spec"]["template"]["spec"]
    c = container(redis)
    assert redis["spec"]["replicas"] == 1  # one authority for the leases
    image, _, tag = c["image"].rpartition(":")
    assert image in ("redis", "valkey/valkey") and re.fullmatch(r"\d+\.\d+(\.\d+)?", tag), c["image"]
    args = c["args"]
    assert args[args.index("--save") + 1] == "" and args[args.index("--appendonly") + 1] == "no"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"  # never evict a live session's lease
    assert not any("pass" in a for a in args)  # the password is in the config file, not on the command line
    # the config file: the first argument after the server, mounted from the proxies' Secret
    mount = next(m for m in c["volumeMounts"] if args[1].startswith(m["mountPath"] + "/"))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    proxy_env = {e["name"]: e for e in container(r[("Deployment", "rtvideo-proxy")])["env"]}
    secret = proxy_env[settings_text.env_name(store_field())]["valueFrom"]["secretKeyRef"]["name"]
    assert volume["secret"]["secretName"] == secret
    assert volume["secret"]["items"] == [{"key": "redis.conf", "path": args[1].rsplit("/", 1)[1]}]
    assert c["securityContext"]["readOnlyRootFilesystem"] and spec["securityContext"]["runAsNonRoot"]


def test_the_store_url_the_docs_give_names_its_service() -> None:
    """The URL in the Secret the docs (and redis.yaml) tell the operator to create reaches the
    store: the ClusterIP Service of the StatefulSet's pods, on the port the container listens on;
    the StatefulSet is governed by the headless one."""
    r = resources()
    redis = r[("StatefulSet", "rtvideo-redis")]
    pods = redis["spec"]["selector"]["matchLabels"]
    ports = {p["name"]: p["containerPort"] for p in container(redis)["ports"]}
    governing = r[("Service", redis["spec"]["serviceName"])]
    assert governing["spec"]["clusterIP"] == "None" and governing["spec"]["selector"] == pods
    texts = [(REPO_ROOT / "docs" / "operations.md").read_text(), (DEPLOY / "redis.yaml").read_text()]
    for text in texts:
        urls = set(re.findall(r'url="redis://:\$\{password\}@([\w-]+):(\d+)/0"', text))
        assert len(urls) == 1, urls
        ((host, port),) = urls
        service = r[("Service", host)]
        assert service["spec"].get("clusterIP") != "None" and service["spec"]["selector"] == pods
        (published,) = service["spec"]["ports"]
        assert published["port"] == int(port) and ports[published["targetPort"]] == int(port)
        assert 'redis.conf="requirepass ${password}"' in text


def test_only_the_proxies_reach_the_store_and_nothing_else_was_opened() -> None:
    r = resources()
    policies = {name: doc["spec"] for (kind, name), doc in r.items() if kind == "NetworkPolicy"}
    assert set(policies) == {"rtvideo-triton", "rtvideo-redis"}
    proxies = {"podSelector": {"matchLabels": r[("Deployment", "rtvideo-proxy")]["spec"]["selector"]["matchLabels"]}}
    redis = r[("StatefulSet", "rtvideo-redis")]
    store = policies["rtvideo-redis"]
    assert store["podSelector"]["matchLabels"] == redis["spec"]["selector"]["matchLabels"]
    assert store["policyTypes"] == ["Ingress"]
    (port,) = (p["containerPort"] for p in container(redis)["ports"])
    assert store["ingress"] == [{"from": [proxies], "ports": [{"port": port, "protocol": "TCP"}]}]
    triton = policies["rtvideo-triton"]
    assert triton["ingress"] == [
        {"from": [proxies], "ports": [{"port": 8001, "protocol": "TCP"}, {"port": 8002, "protocol": "TCP"}]},
        {"ports": [{"port": 8002, "protocol": "TCP"}]},  # metrics scrapes
    ]


def test_the_proxy_advertises_its_own_pod_address_to_the_other_copies() -> None:
    """A watch or steer link that lands on a copy which does not hold its session is forwarded to
    the one that does, at the address that one advertises: its pod's, on the clients' port (the
    Service's address would reach any copy). The kubelet expands `$(POD_IP)` only from a variable
    defined before it."""
    c = container(resources()[("Deployment", "rtvideo-proxy")])
    env = {e["name"]: e for e in c["env"]}
    names = [e["name"] for e in c["env"]]
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert names.index("POD_IP") < names.index("RTVIDEO_ADVERTISE_URL")
    url = urllib.parse.urlsplit(env["RTVIDEO_ADVERTISE_URL"]["value"].replace("$(POD_IP)", "10.1.2.3"))
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert (url.scheme, url.hostname, url.port, url.path) == ("http", "10.1.2.3", ports["http"], "")
