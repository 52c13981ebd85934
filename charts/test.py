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


def render(vals: dict) -> dict[str, str]:
    chart = helm.Chart.load(str(CHART))
    return chart.render(vals, name=RELEASE, namespace=NAMESPACE, is_install=True)


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


@test("ha: the PrometheusRule selects this release's scrape job; the dashboard ConfigMap is the ops/ file")
def _():
    docs = manifests(rendered["ha"])
    (rule,) = find(docs, "PrometheusRule")
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert any('job=~"berth-metrics"' in e for e in exprs), exprs
    assert not any('job=~".*berth.*"' in e for e in exprs), "a rule kept the generic job selector"
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
    vals = values("default")
    vals["api"] = {"metricsPort": 8790}
    refused(vals, "must be three different ports")


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
    # 8 pods + 1 surge, 8 + 1 connections each, + 1 for the migration Job = 82 fit in 97;
    # 10 pods (100) do not.
    docs = manifests(render(vals))
    assert env(container(docs, "Deployment", "api"))["BERTH_DB_POOL_SIZE"] == "8"
    vals["api"] = {"autoscaling": {"maxReplicas": 10}}
    refused(vals, "may open 100 database connections")
    vals["database"]["connectionLimit"] = 100
    manifests(render(vals))
    vals["api"] = {"replicaCount": 4, "autoscaling": {"enabled": False}}
    vals["database"].update({"poolSize": 32, "connectionLimit": 150})
    refused(vals, "may open 166 database connections")


@test("refused: a file:// object store shared by several replicas")
def _():
    vals = values("default")
    vals["objectStore"] = {"url": "file:///var/lib/berth/blobs"}
    refused(vals, "objectStore.url is a file:// URL")


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
