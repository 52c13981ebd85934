#!/usr/bin/env python3
"""Tests of the Helm chart, run by .ci/run.

Renders charts/berth with Helm's own engine (helm-python-sdk binds the Helm Go SDK; no
`helm` binary), lints it the way `helm lint --strict --kube-version 1.30` does, validates
every manifest strictly against the Kubernetes 1.30 schemas (kubernetes-validate), checks
the PrometheusRule's rules with promtool, compares the output with the golden files in
charts/berth/ci/golden/ and checks that misconfigurations an operator could make are
refused at render time.

    python3 charts/test.py                 # run
    BERTH_REGENERATE=1 python3 charts/test.py   # rewrite the golden files (or --regenerate)

Needs: pip install helm-python-sdk kubernetes-validate pyyaml; promtool (Debian: prometheus).
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "berth"
CI = CHART / "ci"
GOLDEN = CI / "golden"
KUBE = "1.30.0"
RELEASE, NAMESPACE = "berth", "berth"
VALUES = ["default", "ha", "edge"]
# Custom resources of prometheus-operator: no schema in kubernetes-validate; checked below.
CRDS = {"ServiceMonitor", "PrometheusRule"}
REGENERATE = os.environ.get("BERTH_REGENERATE") == "1" or "--regenerate" in sys.argv

results: list[tuple[str, str | None]] = []


def test(name):
    def wrap(f):
        try:
            f()
            results.append((name, None))
        except Exception as e:  # noqa: BLE001 - every failure is reported, then counted
            detail = str(e) if isinstance(e, AssertionError) else traceback.format_exc()
            results.append((name, detail))
        return f

    return wrap


def values(name: str) -> dict:
    return yaml.safe_load((CI / f"{name}-values.yaml").read_text())


def render(vals: dict, name: str = RELEASE, namespace: str = NAMESPACE) -> dict[str, str]:
    chart = helm.Chart.load(str(CHART))
    return chart.render(vals, name=name, namespace=namespace, is_install=True)


def manifests(rendered: dict[str, str]) -> list[dict]:
    docs = []
    for path in sorted(rendered):
        if path.endswith(".txt"):
            continue
        docs += [d for d in yaml.safe_load_all(rendered[path]) if d]
    return docs


def golden_text(rendered: dict[str, str]) -> str:
    parts = []
    for path in sorted(rendered):
        body = rendered[path].strip("\n")
        if body.strip():
            parts.append(f"# Source: {path}\n{body}\n")
    return "---\n".join(parts)


def refused(vals: dict, needle: str) -> None:
    try:
        render(vals)
    except helm.HelmError as e:
        assert needle in str(e), f"refused, but not for {needle!r}: {e}"
        return
    raise AssertionError(f"rendered although it should be refused ({needle!r})")


def find(docs: list[dict], kind: str, component: str | None = None) -> list[dict]:
    return [
        d
        for d in docs
        if d["kind"] == kind
        and (component is None or d["metadata"]["labels"].get("app.kubernetes.io/component") == component)
    ]


def container(docs: list[dict], kind: str, component: str) -> dict:
    (w,) = find(docs, kind, component)
    return w["spec"]["template"]["spec"]["containers"][0]


def env(c: dict) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in c.get("env", [])}


def promtool_check(groups: list) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump({"groups": groups}, f)
    try:
        out = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True, text=True)
        assert out.returncode == 0, f"promtool check rules: {out.stdout}{out.stderr}"
    finally:
        os.unlink(f.name)


def promtool_test(groups: list, tests: list) -> None:
    """`promtool test rules` with these unit tests against these rule groups. An expected alert
    without exp_annotations gets the rule's, with `{{ $labels.x }}` filled from its labels."""
    rules = {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}
    for t in tests:
        for case in t["alert_rule_test"]:
            for alert in case["exp_alerts"]:
                if "exp_annotations" in alert:
                    continue
                labels = alert["exp_labels"]
                fill = lambda text: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
                alert["exp_annotations"] = {k: fill(v) for k, v in rules[case["alertname"]]["annotations"].items()}
                assert not any("{{" in v for v in alert["exp_annotations"].values()), alert
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
        spec = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}
        (Path(d) / "test.yaml").write_text(yaml.safe_dump(spec))
        out = subprocess.run(["promtool", "test", "rules", "test.yaml"], capture_output=True, text=True, cwd=d)
        assert out.returncode == 0, f"promtool test rules: {out.stdout}{out.stderr}"


rendered = {}
for v in VALUES:

    @test(f"{v}: helm lint --strict --kube-version {KUBE}")
    def _(v=v):
        report = helm.lint(str(CHART), values(v), strict=True, kube_version=f"v{KUBE}")
        # Severity 1 is informational ("icon is recommended"); 2 warning, 3 error.
        bad = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        assert not bad, f"lint findings: {bad}"

    @test(f"{v}: renders with Helm's engine")
    def _(v=v):
        rendered[v] = render(values(v))

    @test(f"{v}: every manifest is valid Kubernetes {KUBE} (strict)")
    def _(v=v):
        docs = manifests(rendered[v])
        assert docs, "nothing rendered"
        for d in docs:
            if d["kind"] in CRDS:
                assert d["apiVersion"] == "monitoring.coreos.com/v1", d["apiVersion"]
                continue
            kubernetes_validate.validate(d, KUBE, strict=True)

    @test(f"{v}: golden file is current")
    def _(v=v):
        path = GOLDEN / f"{v}.yaml"
        text = golden_text(rendered[v])
        if REGENERATE:
            GOLDEN.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        assert path.exists(), f"{path} missing: run with BERTH_REGENERATE=1"
        if path.read_text() != text:
            import difflib

            diff = "".join(
                difflib.unified_diff(
                    path.read_text().splitlines(True), text.splitlines(True), str(path), "rendered", n=2
                )
            )
            raise AssertionError(f"{path} is stale (BERTH_REGENERATE=1 rewrites it):\n{diff[:6000]}")

    @test(f"{v}: Services, HPA, PDB and Ingress point at what exists")
    def _(v=v):
        docs = manifests(rendered[v])
        pods = [
            (w["spec"]["template"]["metadata"]["labels"], w["spec"]["template"]["spec"]["containers"])
            for w in docs
            if w["kind"] in ("Deployment", "StatefulSet")
        ]
        services = {s["metadata"]["name"]: s for s in find(docs, "Service")}
        for s in services.values():
            sel = s["spec"]["selector"]
            matching = [cs for labels, cs in pods if sel.items() <= labels.items()]
            assert matching, f"Service {s['metadata']['name']} selects no pod"
            names = {p["name"] for cs in matching for c in cs for p in c.get("ports", [])}
            for p in s["spec"].get("ports", []):
                assert p["targetPort"] in names, f"Service {s['metadata']['name']}: no port {p['targetPort']}"
        for pdb in find(docs, "PodDisruptionBudget"):
            sel = pdb["spec"]["selector"]["matchLabels"]
            assert any(sel.items() <= labels.items() for labels, _ in pods), "PDB selects no pod"
        for hpa in find(docs, "HorizontalPodAutoscaler"):
            target = hpa["spec"]["scaleTargetRef"]["name"]
            assert find(docs, "Deployment", "api")[0]["metadata"]["name"] == target
        for ing in find(docs, "Ingress"):
            for rule in ing["spec"]["rules"]:
                for p in rule["http"]["paths"]:
                    assert p["backend"]["service"]["name"] in services
        for sm in find(docs, "ServiceMonitor"):
            sel = sm["spec"]["selector"]["matchLabels"]
            assert any(sel.items() <= s["metadata"]["labels"].items() for s in services.values()), (
                "ServiceMonitor selects no Service"
            )

    @test(f"{v}: the PrometheusRule passes promtool check rules")
    def _(v=v):
        for rule in find(manifests(rendered[v]), "PrometheusRule"):
            promtool_check(rule["spec"]["groups"])


@test("default: API pods skip migrations, which the hook Job runs")
def _():
    docs = manifests(rendered["default"])
    api = container(docs, "Deployment", "api")
    assert "--no-migrate" in api["args"], api["args"]
    (job,) = find(docs, "Job", "migrate")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"]
    # Helm waits for a hook up to --timeout (default 5 m): the Job must give up first.
    assert job["spec"]["activeDeadlineSeconds"] < 300


@test("edge: without the hook Job the API pods migrate on start")
def _():
    docs = manifests(rendered["edge"])
    assert not find(docs, "Job"), "migration Job rendered although disabled"
    assert "--no-migrate" not in container(docs, "Deployment", "api")["args"]


@test("default: startupProbe, preStop drain and a shared JWT key")
def _():
    docs = manifests(rendered["default"])
    api = container(docs, "Deployment", "api")
    assert api["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert api["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    pod = find(docs, "Deployment", "api")[0]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > 5
    assert env(api)["BERTH_JWT_SECRET_FILE"] == "/etc/berth/jwt/jwt-secret"
    assert env(api)["BERTH_DATA_DIR"] == "/var/lib/berth"


@test("ha: the database CA is mounted and named by BERTH_DB_CA_FILE")
def _():
    api = container(manifests(rendered["ha"]), "Deployment", "api")
    assert env(api)["BERTH_DB_CA_FILE"] == "/etc/berth/db-ca/ca.crt"
    assert {"name": "db-ca", "mountPath": "/etc/berth/db-ca", "readOnly": True} in api["volumeMounts"]


@test("defaults match the image: user 10001, read-only root with writable /var/lib/berth and /tmp")
def _():
    docs = manifests(rendered["default"])
    pod = find(docs, "Deployment", "api")[0]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 10001
    api = container(docs, "Deployment", "api")
    assert api["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"] for m in api["volumeMounts"]}
    assert {"/var/lib/berth", "/tmp"} <= mounts, mounts
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "USER 10001:10001" in dockerfile
    assert "/usr/local/bin/berth" in dockerfile


@test("edge: workers get per-pod credentials, a PVC per workspace and probes")
def _():
    docs = manifests(rendered["edge"])
    (sts,) = find(docs, "StatefulSet", "worker")
    w = sts["spec"]["template"]["spec"]["containers"][0]
    i = w["args"].index("--token-file")
    assert w["args"][i + 1] == "/etc/berth/worker-token", w["args"]
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["ws-main", "ws-scratch"]
    assert "main=/workspaces/main" in w["args"] and "scratch=/workspaces/scratch" in w["args"]
    assert env(w)["BERTH_WORKER_HEALTH_LISTEN"] == "0.0.0.0:9465"
    assert w["ports"] == [{"name": "health", "containerPort": 9465, "protocol": "TCP"}]
    assert w["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert w["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}


@test("ha: the PrometheusRule selects this release's namespace and scrape job; the dashboard ConfigMap is the ops/ file")
def _():
    docs = manifests(rendered["ha"])
    (rule,) = find(docs, "PrometheusRule")
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert any('job=~"berth-metrics"' in e for e in exprs), exprs
    assert not any(".*berth.*" in e for e in exprs), "a rule kept a generic selector"
    for e in exprs:
        # Every selector of every rule: berth_* and up by job, kube-state-metrics by name.
        selectors = len(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*\{", e))
        assert selectors and e.count('namespace="berth", ') == selectors, f"a selector without the namespace: {e}"
    assert any('deployment="berth"' in e for e in exprs), exprs
    (cm,) = find(docs, "ConfigMap")
    assert cm["data"]["berth-dashboard.json"] == (ROOT / "ops/grafana/berth-dashboard.json").read_text().rstrip("\n")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"


@test("the chart's copies of the alert rules and the dashboard are ops/'s files")
def _():
    pairs = [
        ("charts/berth/files/alerts.yaml", "ops/prometheus/alerts.yaml"),
        ("charts/berth/files/berth-dashboard.json", "ops/grafana/berth-dashboard.json"),
    ]
    for copy_, src in pairs:
        if REGENERATE:
            (ROOT / copy_).write_text((ROOT / src).read_text())
        assert (ROOT / copy_).read_text() == (ROOT / src).read_text(), f"{copy_} differs from {src}"


def pod_spec(docs: list[dict], kind: str, component: str) -> dict:
    (w,) = find(docs, kind, component)
    return w["spec"]["template"]["spec"]


def with_workers(**worker) -> dict:
    """The default values plus in-cluster workers sharing one credential."""
    vals = values("default")
    vals["worker"] = {"enabled": True, "token": {"existingSecret": "berth-worker"}, **worker}
    return vals


def selects(selector: dict, labels: dict) -> bool:
    return selector["matchLabels"].items() <= labels.items()


@test("workers run under their own ServiceAccount, without a token, never the API's")
def _():
    for docs in (manifests(rendered["edge"]), manifests(render(with_workers()))):
        api = pod_spec(docs, "Deployment", "api")
        worker = pod_spec(docs, "StatefulSet", "worker")
        (sa,) = find(docs, "ServiceAccount", "worker")
        assert sa["automountServiceAccountToken"] is False
        assert not sa["metadata"].get("annotations"), "the workers' account carries annotations"
        assert worker["serviceAccountName"] == sa["metadata"]["name"]
        assert worker["automountServiceAccountToken"] is False
        assert worker["serviceAccountName"] != api.get("serviceAccountName")
    # The operator's account (IRSA…) stays the API pods' and the Job's.
    docs = manifests(rendered["edge"])
    assert pod_spec(docs, "Deployment", "api")["serviceAccountName"] == "berth-s3-access"
    assert find(docs, "ServiceAccount") == find(docs, "ServiceAccount", "worker")
    assert not find(manifests(rendered["default"]), "ServiceAccount"), "a ServiceAccount without workers"


@test("workers: default-deny egress, open only to the API pods' public port and DNS")
def _():
    docs = manifests(render(with_workers()))
    (pol,) = find(docs, "NetworkPolicy", "worker")
    spec = pol["spec"]
    assert selects(spec["podSelector"], find(docs, "StatefulSet", "worker")[0]["spec"]["template"]["metadata"]["labels"])
    assert spec["policyTypes"] == ["Egress"], spec["policyTypes"]
    api_rule, dns_rule = spec["egress"]  # nothing else
    (peer,) = api_rule["to"]
    assert set(peer) == {"podSelector"}, peer
    assert selects(peer["podSelector"], find(docs, "Deployment", "api")[0]["spec"]["template"]["metadata"]["labels"])
    assert api_rule["ports"] == [{"port": 8790, "protocol": "TCP"}], api_rule["ports"]
    (peer,) = dns_rule["to"]
    assert peer["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}, peer
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}, peer
    assert sorted((p["port"], p["protocol"]) for p in dns_rule["ports"]) == [(53, "TCP"), (53, "UDP")]
    # The operator's rules come after, and only when given; disabled means no policy.
    docs = manifests(rendered["edge"])
    (pol,) = find(docs, "NetworkPolicy", "worker")
    assert len(pol["spec"]["egress"]) == 4
    assert pol["spec"]["egress"][2]["ports"] == [{"port": 443, "protocol": "TCP"}]
    docs = manifests(render(with_workers(networkPolicy={"enabled": False})))
    assert not find(docs, "NetworkPolicy", "worker")


@test("workers get worker.extraEnv, never the API's extraEnv")
def _():
    vals = with_workers(extraEnv=[{"name": "WORKER_ONLY", "value": "1"}])
    vals["extraEnv"] = [{"name": "API_ONLY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    docs = manifests(render(vals))
    api, worker = env(container(docs, "Deployment", "api")), env(container(docs, "StatefulSet", "worker"))
    assert "API_ONLY" in api and "WORKER_ONLY" not in api
    assert "WORKER_ONLY" in worker and "API_ONLY" not in worker, worker
    for name in ("DATABASE_URL", "BERTH_MODEL_API_KEY", "BERTH_JWT_SECRET_FILE", "AWS_SECRET_ACCESS_KEY"):
        assert name not in worker, name
    assert "envFrom" not in container(docs, "StatefulSet", "worker")
    # edge sets RUST_LOG for both: each gets its own.
    docs = manifests(rendered["edge"])
    assert env(container(docs, "Deployment", "api"))["RUST_LOG"] == "info,berth_api=debug"
    assert env(container(docs, "StatefulSet", "worker"))["RUST_LOG"] == "info,berth_worker=debug"


@test("workers: the token volume holds the pod's own key only")
def _():
    docs = manifests(render(with_workers(token={"existingSecret": "berth-worker", "existingSecretKey": "tok"})))
    spec = pod_spec(docs, "StatefulSet", "worker")
    assert "initContainers" not in spec
    secrets = [v for v in spec["volumes"] if "secret" in v]
    assert secrets == [
        {
            "name": "worker-token",
            "secret": {
                "secretName": "berth-worker",
                "defaultMode": 0o400,
                "items": [{"key": "tok", "path": "worker-token"}],
            },
        }
    ], secrets
    w = spec["containers"][0]
    assert {"name": "worker-token", "mountPath": "/etc/berth", "readOnly": True} in w["volumeMounts"]
    # perPod: the Secret (every pod's key) is mounted in the init container only, which copies
    # this pod's key into a memory-backed emptyDir that the worker container mounts.
    spec = pod_spec(manifests(rendered["edge"]), "StatefulSet", "worker")
    (init,) = spec["initContainers"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    secret_volumes = {n for n, v in volumes.items() if "secret" in v}
    assert secret_volumes == {"worker-tokens"}, secret_volumes
    assert volumes["worker-token"]["emptyDir"]["medium"] == "Memory"
    assert not secret_volumes & {m["name"] for m in spec["containers"][0]["volumeMounts"]}
    assert {m["name"] for m in init["volumeMounts"]} == {"worker-tokens", "worker-token"}
    script = init["command"][-1]
    assert '"/run/berth/worker-tokens/$POD_NAME"' in script and "/etc/berth/worker-token" in script
    assert env(init).keys() == {"POD_NAME"}


@test("the internal port: declared on the API pods, in no Service and not in the Ingress")
def _():
    for v in VALUES:
        docs = manifests(rendered[v])
        internal = values(v).get("api", {}).get("internalPort", 8791)
        api = container(docs, "Deployment", "api")
        assert {"name": "internal", "containerPort": internal, "protocol": "TCP"} in api["ports"]
        for s in find(docs, "Service"):
            for p in s["spec"].get("ports", []):
                assert p["targetPort"] not in ("internal", internal), f"{v}: Service {s['metadata']['name']}: {p}"
                assert p["port"] != internal, f"{v}: Service {s['metadata']['name']}: {p}"
        for ing in find(docs, "Ingress"):
            for rule in ing["spec"]["rules"]:
                for p in rule["http"]["paths"]:
                    assert p["backend"]["service"]["port"] == {"name": "http"}, p


@test("BERTH_INTERNAL_LISTEN and BERTH_INTERNAL_URL name the same internal port")
def _():
    for v in VALUES:
        docs = manifests(rendered[v])
        internal = values(v).get("api", {}).get("internalPort", 8791)
        api = container(docs, "Deployment", "api")
        e = env(api)
        assert e["BERTH_INTERNAL_LISTEN"] == f"0.0.0.0:{internal}", e["BERTH_INTERNAL_LISTEN"]
        assert e["BERTH_INTERNAL_URL"] == f"http://$(POD_IP):{internal}", e["BERTH_INTERNAL_URL"]
        assert e["BERTH_LISTEN"] != e["BERTH_INTERNAL_LISTEN"] != e["BERTH_METRICS_LISTEN"]
        names = [x["name"] for x in api["env"]]
        assert names.index("POD_IP") < names.index("BERTH_INTERNAL_URL"), "$(POD_IP) defined after its use"
        for job in find(docs, "Job", "migrate"):
            assert "BERTH_INTERNAL_LISTEN" not in env(job["spec"]["template"]["spec"]["containers"][0])


@test("API pods' NetworkPolicy: the internal port admits the API pods only")
def _():
    docs = manifests(rendered["default"])
    (pol,) = find(docs, "NetworkPolicy", "api")
    labels = find(docs, "Deployment", "api")[0]["spec"]["template"]["metadata"]["labels"]
    assert selects(pol["spec"]["podSelector"], labels)
    assert pol["spec"]["policyTypes"] == ["Ingress"]
    by_port = {r["ports"][0]["port"]: r for r in pol["spec"]["ingress"]}
    assert all(len(r["ports"]) == 1 for r in pol["spec"]["ingress"])
    assert set(by_port) == {8790, 8791, 9464}, by_port
    assert "from" not in by_port[8790], "the public port is restricted"
    (peer,) = by_port[8791]["from"]
    assert set(peer) == {"podSelector"} and selects(peer["podSelector"], labels), peer
    assert "from" not in by_port[9464]
    (pol,) = find(manifests(rendered["edge"]), "NetworkPolicy", "api")
    (metrics,) = [r for r in pol["spec"]["ingress"] if r["ports"][0]["port"] == 9090]
    assert metrics["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}
    vals = values("default")
    vals["api"] = {"networkPolicy": {"enabled": False}}
    assert not find(manifests(render(vals)), "NetworkPolicy")


@test("BERTH_DB_SSLMODE=require by default, for the API pods and the migration Job")
def _():
    docs = manifests(rendered["default"])
    (job,) = find(docs, "Job", "migrate")
    for c in (container(docs, "Deployment", "api"), job["spec"]["template"]["spec"]["containers"][0]):
        assert env(c)["BERTH_DB_SSLMODE"] == "require", env(c).get("BERTH_DB_SSLMODE")
        assert env(c)["BERTH_DB_CA_FILE"] == "/etc/berth/db-ca/ca.crt"
    assert env(container(manifests(rendered["edge"]), "Deployment", "api"))["BERTH_DB_SSLMODE"] == "prefer"


@test("refused: a database without a CA, unless allowUnverifiedTls says so")
def _():
    vals = values("default")
    del vals["database"]["caSecret"]
    refused(vals, "database.caSecret is empty")
    vals["database"]["allowUnverifiedTls"] = False
    refused(vals, "database.allowUnverifiedTls=true")
    vals["database"]["allowUnverifiedTls"] = True
    api = container(manifests(render(vals)), "Deployment", "api")
    assert "BERTH_DB_CA_FILE" not in env(api) and env(api)["BERTH_DB_SSLMODE"] == "require"
    vals["database"]["sslmode"] = "verify-full"  # libpq's name; Berth's floor has three values
    refused(vals, "at '/database/sslmode'")


@test("refused: the internal port shared with the public or the metrics port")
def _():
    for port in (8790, 9464):
        vals = values("default")
        vals["api"] = {"internalPort": port}
        refused(vals, "must be three different ports")


@test("refused: api.port == api.metricsPort")
def _():
    vals = values("default")
    vals["api"] = {"metricsPort": 8790}
    refused(vals, "api.port and api.metricsPort are both 8790")
    vals["api"] = {"port": 9464, "metricsPort": 9464}
    refused(vals, "api.port and api.metricsPort are both 9464")
    vals["api"] = {"port": 9464, "metricsPort": 8790}
    manifests(render(vals))


def without_jwt(base: dict) -> dict:
    vals = copy.deepcopy(base)
    vals["jwt"] = {"existingSecret": ""}
    return vals


@test("refused: no JWT Secret while the autoscaler may run several replicas")
def _():
    refused(without_jwt(values("default")), "jwt.existingSecret is required")


@test("refused: no JWT Secret with api.replicaCount 2")
def _():
    vals = without_jwt(values("default"))
    vals["api"] = {"replicaCount": 2, "autoscaling": {"enabled": False}}
    refused(vals, "jwt.existingSecret is required")


@test("accepted: one replica without a JWT Secret")
def _():
    vals = without_jwt(values("default"))
    vals["api"] = {"replicaCount": 1, "autoscaling": {"enabled": False}, "pdb": {"enabled": False}}
    docs = manifests(render(vals))
    assert "BERTH_JWT_SECRET_FILE" not in env(container(docs, "Deployment", "api"))


@test("refused: no database Secret")
def _():
    vals = values("default")
    del vals["database"]
    refused(vals, "database.existingSecret is required")


@test("refused: more database connections than the server allows")
def _():
    vals = values("default")
    # 8 pods + 1 surge, 8 + 1 LISTEN + 1 readiness probe connections each, + 1 for the
    # migration Job = 91 fit in 97; 10 pods (111) do not.
    docs = manifests(render(vals))
    assert env(container(docs, "Deployment", "api"))["BERTH_DB_POOL_SIZE"] == "8"
    vals["api"] = {"autoscaling": {"maxReplicas": 10}}
    refused(vals, "may open 111 database connections")
    vals["database"]["connectionLimit"] = 111
    manifests(render(vals))
    vals["api"] = {"replicaCount": 4, "autoscaling": {"enabled": False}}
    vals["database"].update({"poolSize": 32, "connectionLimit": 150})
    refused(vals, "may open 171 database connections")


@test("refused: a file:// object store shared by several replicas")
def _():
    vals = values("default")
    vals["objectStore"] = {"url": "file:///var/lib/berth/blobs"}
    refused(vals, "objectStore.url is a file:// URL")


@test("the drain after SIGTERM ends within the grace period, before the kill")
def _():
    vals = values("default")
    e = env(container(manifests(render(vals)), "Deployment", "api"))
    # 60 s grace - 5 s preStop - 10 s margin.
    assert e["BERTH_DRAIN_TIMEOUT_SECS"] == "45", e
    vals["api"] = {"preStopDelaySeconds": 0, "terminationGracePeriodSeconds": 300}
    e = env(container(manifests(render(vals)), "Deployment", "api"))
    assert e["BERTH_DRAIN_TIMEOUT_SECS"] == "290", e
    vals["api"] = {"preStopDelaySeconds": 5, "terminationGracePeriodSeconds": 10}
    e = env(container(manifests(render(vals)), "Deployment", "api"))
    assert e["BERTH_DRAIN_TIMEOUT_SECS"] == "1", e


@test("refused: a preStop delay as long as the grace period")
def _():
    vals = values("default")
    vals["api"] = {"preStopDelaySeconds": 60, "terminationGracePeriodSeconds": 60}
    refused(vals, "api.preStopDelaySeconds must be shorter")


@test("refused: several worker pods sharing one credential")
def _():
    vals = values("default")
    vals["worker"] = {"enabled": True, "replicas": 2, "token": {"existingSecret": "w"}}
    refused(vals, "worker.token.perPod=true")


@test("refused: workers without a credential Secret")
def _():
    vals = values("default")
    vals["worker"] = {"enabled": True}
    refused(vals, "worker.token.existingSecret is required")


def release_rules(name: str, namespace: str, **prometheus_rule) -> list:
    vals = values("default")
    vals["metrics"] = {"prometheusRule": {"enabled": True, **prometheus_rule}}
    (rule,) = find(manifests(render(vals, name=name, namespace=namespace)), "PrometheusRule")
    return rule["spec"]["groups"]


@test("two releases in one cluster never fire each other's alerts (promtool test rules)")
def _():
    # Release "berth" in namespace team-a, next to: the same release name in team-b, and a
    # release "berth-staging" (fullname berth-staging) in team-a itself.
    groups = release_rules("berth", "team-a")
    listen = "berth_db_listen_up{namespace=\"%s\", job=\"%s\", instance=\"%s\"}"
    ready = "kube_pod_status_ready{namespace=\"%s\", pod=\"%s\", condition=\"true\"}"
    available = "kube_deployment_status_replicas_available{namespace=\"%s\", deployment=\"%s\"}"
    spec = "kube_deployment_spec_replicas{namespace=\"%s\", deployment=\"%s\"}"
    others = [
        (listen % ("team-b", "berth-metrics", "10.1.0.1:9464"), "0x15"),
        (listen % ("team-a", "berth-staging-metrics", "10.0.0.9:9464"), "0x15"),
        (ready % ("team-b", "berth-7d9fbc5c4-x2b9q"), "0x15"),
        (ready % ("team-a", "berth-staging-7d9fbc5c4-x2b9q"), "0x15"),
        (ready % ("team-a", "berth-staging-worker-0"), "0x15"),
        (available % ("team-b", "berth"), "0x15"),
        (spec % ("team-b", "berth"), "2x15"),
        (available % ("team-a", "berth-staging"), "0x15"),
        (spec % ("team-a", "berth-staging"), "2x15"),
    ]
    ours = [
        (listen % ("team-a", "berth-metrics", "10.0.0.1:9464"), "1x15"),
        (ready % ("team-a", "berth-7d9fbc5c4-h8k2m"), "1x15"),
        (ready % ("team-a", "berth-worker-0"), "1x15"),
        # The migration Job's pod is never ready, by design.
        (ready % ("team-a", "berth-migrate-x2b9q"), "0x15"),
        (available % ("team-a", "berth"), "2x15"),
        (spec % ("team-a", "berth"), "2x15"),
    ]
    quiet = [
        {"eval_time": "15m", "alertname": a, "exp_alerts": []}
        for a in ("BerthDbListenDown", "BerthReplicaNotReady", "BerthApiUnavailable")
    ]
    series = [{"series": s, "values": v} for s, v in others + ours]
    promtool_test(groups, [{"interval": "1m", "input_series": series, "alert_rule_test": quiet}])
    # And the same rules do fire for this release's own series.
    down = [
        (listen % ("team-a", "berth-metrics", "10.0.0.1:9464"), "0x15"),
        (ready % ("team-a", "berth-worker-1"), "0x15"),
        (available % ("team-a", "berth"), "0x15"),
        (spec % ("team-a", "berth"), "2x15"),
    ]
    firing = [
        {"eval_time": "15m", "alertname": "BerthDbListenDown", "exp_alerts": [{"exp_labels": {
            "severity": "critical", "namespace": "team-a", "job": "berth-metrics", "instance": "10.0.0.1:9464"}}]},
        {"eval_time": "15m", "alertname": "BerthReplicaNotReady", "exp_alerts": [{"exp_labels": {
            "severity": "warning", "namespace": "team-a", "pod": "berth-worker-1"}}]},
        {"eval_time": "15m", "alertname": "BerthApiUnavailable", "exp_alerts": [{"exp_labels": {
            "severity": "critical", "namespace": "team-a", "deployment": "berth"}}]},
    ]
    series = [{"series": s, "values": v} for s, v in down]
    promtool_test(groups, [{"interval": "1m", "input_series": series, "alert_rule_test": firing}])


@test("BerthDbListenDown in the PrometheusRule: fires after 3 minutes at 0, never at 1")
def _():
    groups = release_rules("berth", "berth")
    (rule,) = [r for g in groups for r in g["rules"] if r["alert"] == "BerthDbListenDown"]
    assert rule["expr"] == 'berth_db_listen_up{namespace="berth", job=~"berth-metrics"} == 0', rule["expr"]
    assert rule["for"] == "3m", rule["for"]
    down = 'berth_db_listen_up{namespace="berth", job="berth-metrics", instance="10.0.0.1:9464"}'
    up = 'berth_db_listen_up{namespace="berth", job="berth-metrics", instance="10.0.0.2:9464"}'
    fired = {"severity": "critical", "namespace": "berth", "job": "berth-metrics", "instance": "10.0.0.1:9464"}
    promtool_test(groups, [{
        "interval": "1m",
        "input_series": [{"series": down, "values": "1 1 0x10"}, {"series": up, "values": "1x12"}],
        "alert_rule_test": [
            {"eval_time": "4m", "alertname": "BerthDbListenDown", "exp_alerts": []},
            {"eval_time": "5m", "alertname": "BerthDbListenDown", "exp_alerts": [{"exp_labels": fired}]},
        ],
    }])


@test("trustedProxies: BERTH_TRUSTED_PROXIES on the API pods only, comma-joined")
def _():
    docs = manifests(rendered["ha"])
    assert env(container(docs, "Deployment", "api"))["BERTH_TRUSTED_PROXIES"] == "10.244.0.0/16,fd00:10:244::/56"
    for job in find(docs, "Job", "migrate"):
        assert "BERTH_TRUSTED_PROXIES" not in env(job["spec"]["template"]["spec"]["containers"][0])
    assert "BERTH_TRUSTED_PROXIES" not in env(container(manifests(rendered["default"]), "Deployment", "api"))
    docs = manifests(rendered["edge"])
    assert "BERTH_TRUSTED_PROXIES" not in env(container(docs, "StatefulSet", "worker"))
    # Without the Ingress it is optional, and rendered when given (a proxy outside the chart).
    vals = values("default")
    vals["trustedProxies"] = ["192.0.2.10"]
    api = container(manifests(render(vals)), "Deployment", "api")
    assert env(api)["BERTH_TRUSTED_PROXIES"] == "192.0.2.10"


@test("refused: the Ingress without trustedProxies, or with one that trusts everyone")
def _():
    vals = values("ha")
    del vals["trustedProxies"]
    try:
        render(vals)
    except helm.HelmError as e:
        msg = str(e)
        for needle in ("trustedProxies is empty while the Ingress is enabled", "X-Forwarded-For", "login rate limits"):
            assert needle in msg, f"{needle!r} not in {msg}"
    else:
        raise AssertionError("rendered an Ingress without trustedProxies")
    vals["trustedProxies"] = []
    refused(vals, "trustedProxies is empty while the Ingress is enabled")
    for everyone in ("0.0.0.0/0", "::/0"):
        vals["trustedProxies"] = ["10.244.0.0/16", everyone]
        refused(vals, f"trustedProxies holds {everyone}, which trusts every address")
    vals["trustedProxies"] = ["10.244.0.0/16"]
    vals["extraEnv"] = [{"name": "BERTH_TRUSTED_PROXIES", "value": "10.0.0.0/8"}]
    refused(vals, "extraEnv sets BERTH_TRUSTED_PROXIES: set the trustedProxies value instead")
    vals = values("default")
    vals["trustedProxies"] = ["10.0.0.0/33"]
    refused(vals, "at '/trustedProxies/0'")
    vals["trustedProxies"] = "10.0.0.0/8"
    refused(vals, "at '/trustedProxies': got string, want array")


def pdbs(vals: dict) -> list[dict]:
    return find(manifests(render(vals)), "PodDisruptionBudget")


@test("no PodDisruptionBudget that blocks drains: none with one API replica, every one rendered allows an eviction")
def _():
    vals = values("default")
    vals["api"] = {"autoscaling": {"minReplicas": 1}}
    assert not pdbs(vals), "a PDB over an autoscaler that may run one pod"
    vals["api"] = {"replicaCount": 1, "autoscaling": {"enabled": False}}
    out = render(vals)
    assert not find(manifests(out), "PodDisruptionBudget"), "a PDB over one replica"
    assert "No PodDisruptionBudget" in out["berth/templates/NOTES.txt"]
    vals["api"] = {"replicaCount": 2, "autoscaling": {"enabled": False}}
    (pdb,) = pdbs(vals)
    assert pdb["spec"]["minAvailable"] == 1
    vals["api"] = {"replicaCount": 3, "autoscaling": {"enabled": False}, "pdb": {"enabled": True, "maxUnavailable": 1}}
    (pdb,) = pdbs(vals)
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": pdb["spec"]["selector"],
    }, pdb["spec"]
    vals["api"] = {"replicaCount": 3, "autoscaling": {"enabled": False}, "pdb": {"enabled": False}}
    assert not pdbs(vals)
    for v in VALUES:
        vals = values(v)
        api = {**yaml.safe_load((CHART / "values.yaml").read_text())["api"], **vals.get("api", {})}
        hpa = {**yaml.safe_load((CHART / "values.yaml").read_text())["api"]["autoscaling"], **api["autoscaling"]}
        floor = hpa["minReplicas"] if hpa["enabled"] else api["replicaCount"]
        for pdb in find(manifests(rendered[v]), "PodDisruptionBudget"):
            assert floor > 1, f"{v}: a PDB with {floor} replica"
            if "minAvailable" in pdb["spec"]:
                assert pdb["spec"]["minAvailable"] < floor, f"{v}: {pdb['spec']} with {floor} replicas"


@test("refused: a PodDisruptionBudget that could never allow an eviction")
def _():
    vals = values("default")
    vals["api"] = {"pdb": {"enabled": True, "minAvailable": 2}}  # autoscaler floor 2
    refused(vals, "api.pdb.minAvailable (2) is not below the fewest API replicas (2, api.autoscaling.minReplicas)")
    vals["api"] = {"replicaCount": 3, "autoscaling": {"enabled": False}, "pdb": {"enabled": True, "minAvailable": 3}}
    refused(vals, "api.pdb.minAvailable (3) is not below the fewest API replicas (3, api.replicaCount)")
    vals["api"] = {"replicaCount": 3, "autoscaling": {"enabled": False}, "pdb": {"enabled": True, "minAvailable": "100%"}}
    refused(vals, "api.pdb.minAvailable is 100%")
    for zero in (0, "0%"):
        vals["api"] = {"pdb": {"enabled": True, "maxUnavailable": zero}}
        refused(vals, "api.pdb.maxUnavailable is 0")
    vals["api"] = {"replicaCount": 3, "autoscaling": {"enabled": False}, "pdb": {"enabled": True, "minAvailable": 2}}
    (pdb,) = pdbs(vals)
    assert pdb["spec"]["minAvailable"] == 2


@test("refused: autoscaling.minReplicas above maxReplicas")
def _():
    vals = values("default")
    vals["api"] = {"autoscaling": {"minReplicas": 5, "maxReplicas": 4}}
    refused(vals, "api.autoscaling.minReplicas (5) is greater than api.autoscaling.maxReplicas (4)")
    vals["api"] = {"autoscaling": {"minReplicas": 4, "maxReplicas": 4}}
    (hpa,) = find(manifests(render(vals)), "HorizontalPodAutoscaler")
    assert hpa["spec"]["minReplicas"] == hpa["spec"]["maxReplicas"] == 4
    # Without the autoscaler its bounds are unused: not checked.
    vals["api"] = {"replicaCount": 2, "autoscaling": {"enabled": False, "minReplicas": 5, "maxReplicas": 4}}
    assert not find(manifests(render(vals)), "HorizontalPodAutoscaler")


@test("refused by values.schema.json: an enabled Ingress without hosts")
def _():
    vals = values("ha")
    vals["ingress"]["hosts"] = []
    refused(vals, "at '/ingress/hosts': minItems: got 0, want 1")
    vals["ingress"]["hosts"] = None  # null removes the chart's default list
    refused(vals, "at '/ingress': missing property 'hosts'")
    vals = values("default")
    vals["ingress"] = {"enabled": False, "hosts": []}
    assert not find(manifests(render(vals)), "Ingress")


@test("refused by values.schema.json: a port that is not a number, a misspelt key")
def _():
    vals = values("default")
    vals["api"] = {"port": "http"}
    refused(vals, "at '/api/port': got string, want integer")
    vals = values("default")
    vals["replicas"] = 3  # api.replicaCount is meant
    refused(vals, "additional properties 'replicas' not allowed")


failed = [(n, d) for n, d in results if d]
for name, detail in results:
    print(f"{'ok  ' if detail is None else 'FAIL'} {name}")
for name, detail in failed:
    print(f"\n--- {name}\n{detail}", file=sys.stderr)
print(f"chart: {len(results) - len(failed)} passed, {len(failed)} failed")
sys.exit(1 if failed else 0)
