"""Smoke suite: proves the cluster of the current context can run what rlog needs.

A 3-pod StatefulSet from a locally built image with one PVC each, headless-Service DNS for
not-ready pods, pod-to-pod TCP, PVC data surviving a pod's deletion, a fresh volume after a
PVC is deleted, the API server through the `kubernetes` Service, RBAC, and helm.
"""

from __future__ import annotations

import functools
import json
import subprocess
import textwrap
import uuid
from pathlib import Path

import pytest
from e2elib import SMOKE_IMAGE, Kubectl, delete_and_wait, wait_until

STS = "smoke"
REPLICAS = 3

MANIFEST = f"""
apiVersion: v1
kind: ServiceAccount
metadata: {{name: smoke}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: pod-reader}}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: smoke-pod-reader}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: pod-reader}}
subjects:
- {{kind: ServiceAccount, name: smoke}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: no-role}}
---
apiVersion: v1
kind: Service
metadata: {{name: {STS}}}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector: {{app: {STS}}}
  ports:
  - {{name: tcp, port: 8080}}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: {STS}}}
spec:
  serviceName: {STS}
  replicas: {REPLICAS}
  podManagementPolicy: Parallel
  selector:
    matchLabels: {{app: {STS}}}
  template:
    metadata:
      labels: {{app: {STS}}}
    spec:
      serviceAccountName: smoke
      terminationGracePeriodSeconds: 2
      securityContext:
        runAsNonRoot: true
        runAsUser: 10001
        runAsGroup: 10001
        fsGroup: 10001
        seccompProfile: {{type: RuntimeDefault}}
      containers:
      - name: smoke
        image: {SMOKE_IMAGE}
        imagePullPolicy: IfNotPresent
        ports:
        - {{containerPort: 8080, name: tcp}}
        readinessProbe:
          tcpSocket: {{port: 8080}}
          periodSeconds: 2
        securityContext:
          allowPrivilegeEscalation: false
          capabilities: {{drop: [ALL]}}
        resources:
          requests: {{cpu: 10m, memory: 32Mi}}
          limits: {{memory: 128Mi}}
        volumeMounts:
        - {{name: data, mountPath: /data}}
  volumeClaimTemplates:
  - metadata: {{name: data}}
    spec:
      accessModes: [ReadWriteOnce]
      resources:
        requests: {{storage: 64Mi}}
"""


def pod_names() -> list[str]:
    return [f"{STS}-{i}" for i in range(REPLICAS)]


def pod_ready(kube: Kubectl, name: str, not_uid: str | None = None) -> dict | None:
    p = kube.run("get", "pod", name, "-o", "json", check=False)
    if p.returncode != 0:
        return None
    pod = json.loads(p.stdout)
    if not_uid and pod["metadata"]["uid"] == not_uid:
        return None
    if pod["metadata"].get("deletionTimestamp"):
        return None
    conds = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
    return pod if conds.get("Ready") == "True" else None


def wait_sts_ready(kube: Kubectl, timeout: float = 240) -> None:
    def ready() -> bool:
        sts = kube.json("get", "statefulset", STS)
        return sts.get("status", {}).get("readyReplicas", 0) == REPLICAS

    try:
        wait_until(f"StatefulSet {STS} ready", ready, timeout, 2)
    except AssertionError:
        print(kube("get", "pods,pvc,events", "-o", "wide", check=False))
        raise


@pytest.fixture(scope="module")
def sts(kube: Kubectl) -> Kubectl:
    kube.apply(MANIFEST)
    wait_sts_ready(kube)
    return kube


def test_node_ready(cluster: Kubectl) -> None:
    nodes = cluster.json("get", "nodes", namespaced=False)["items"]
    assert nodes, "no nodes"
    for n in nodes:
        conds = {c["type"]: c["status"] for c in n["status"]["conditions"]}
        assert conds.get("Ready") == "True", f"node {n['metadata']['name']} not Ready: {conds}"


def test_default_storage_class(cluster: Kubectl) -> None:
    scs = cluster.json("get", "storageclass", namespaced=False)["items"]
    default = [
        s["metadata"]["name"]
        for s in scs
        if s["metadata"].get("annotations", {}).get("storageclass.kubernetes.io/is-default-class")
        == "true"
    ]
    assert len(default) == 1, f"want exactly one default StorageClass, got {default}"


def test_statefulset_one_bound_pvc_per_pod(sts: Kubectl) -> None:
    volumes = set()
    for pod in pod_names():
        pvc = sts.json("get", "pvc", f"data-{pod}")
        assert pvc["status"]["phase"] == "Bound", pvc["status"]
        volumes.add(pvc["spec"]["volumeName"])
        # non-root (uid 10001) can write its volume
        out = sts.exec_py(
            pod,
            "import os; open('/data/w', 'w').write('ok'); "
            "print(os.getuid(), open('/data/w').read())",
        )
        assert out.split() == ["10001", "ok"]
    assert len(volumes) == REPLICAS, f"PVCs share volumes: {volumes}"


def test_headless_service_dns(sts: Kubectl, namespace: str) -> None:
    ips = {p: sts.json("get", "pod", p)["status"]["podIP"] for p in pod_names()}
    names = {p: f"{p}.{STS}.{namespace}.svc.cluster.local" for p in pod_names()}
    code = textwrap.dedent(f"""
        import json, socket
        print(json.dumps({{p: socket.gethostbyname(n) for p, n in {names!r}.items()}}))
    """)

    def lookup(pod: str) -> dict[str, str]:
        return dict(json.loads(sts.exec_py(pod, code)))

    for pod in pod_names():
        resolved = wait_until("headless DNS records", functools.partial(lookup, pod), 60, 2)
        assert resolved == ips, f"from {pod}: {resolved} != {ips}"
    # short names through the pod's search path, too
    assert (
        sts.exec_py(
            pod_names()[0], f"import socket; print(socket.gethostbyname('{pod_names()[1]}.{STS}'))"
        ).strip()
        == ips[pod_names()[1]]
    )


def test_pod_to_pod_tcp(sts: Kubectl) -> None:
    code = textwrap.dedent("""
        import socket, sys
        s = socket.create_connection((sys.argv[1], 8080), timeout=5)
        print(s.makefile().readline().strip())
    """)
    for src in pod_names():
        for dst in pod_names():
            out = sts.run("exec", src, "--", "python3", "-c", code, f"{dst}.{STS}").stdout.strip()
            assert out == dst, f"{src} -> {dst}: got {out!r}"


def test_deleted_pod_comes_back_with_its_pvc_and_data(sts: Kubectl) -> None:
    pod = pod_names()[1]
    marker = uuid.uuid4().hex
    sts.exec_py(pod, f"open('/data/marker','w').write('{marker}')")
    volume = sts.json("get", "pvc", f"data-{pod}")["spec"]["volumeName"]
    uid = sts.json("get", "pod", pod)["metadata"]["uid"]
    delete_and_wait(sts, "pod", pod)
    wait_until(f"{pod} recreated and Ready", lambda: pod_ready(sts, pod, not_uid=uid), 180, 2)
    assert sts.json("get", "pvc", f"data-{pod}")["spec"]["volumeName"] == volume
    assert sts.exec_py(pod, "print(open('/data/marker').read())").strip() == marker


def test_deleted_pvc_and_pod_give_a_fresh_empty_volume(sts: Kubectl, cluster: Kubectl) -> None:
    pod = pod_names()[2]
    sts.exec_py(pod, "open('/data/marker','w').write('old')")
    old_volume = sts.json("get", "pvc", f"data-{pod}")["spec"]["volumeName"]
    uid = sts.json("get", "pod", pod)["metadata"]["uid"]
    sts("delete", "pvc", f"data-{pod}", "--wait=false")
    delete_and_wait(sts, "pod", pod)
    wait_until(f"{pod} recreated and Ready", lambda: pod_ready(sts, pod, not_uid=uid), 180, 2)
    new_volume = sts.json("get", "pvc", f"data-{pod}")["spec"]["volumeName"]
    assert new_volume != old_volume
    assert sts.exec_py(pod, "import os; print(sorted(os.listdir('/data')))").strip() == "[]"
    # reclaimPolicy Delete: the old volume is really deleted by the provisioner
    wait_until(
        f"PV {old_volume} deleted",
        lambda: cluster.run("get", "pv", old_volume, check=False, namespaced=False).returncode != 0,
        120,
        2,
    )


API_CODE = textwrap.dedent("""
    import json, ssl, sys, urllib.error, urllib.request
    sa = '/var/run/secrets/kubernetes.io/serviceaccount'
    token = sys.argv[2] if len(sys.argv) > 2 else open(sa + '/token').read()
    ns = open(sa + '/namespace').read()
    ctx = ssl.create_default_context(cafile=sa + '/ca.crt')
    req = urllib.request.Request('https://kubernetes.default.svc' + sys.argv[1].replace('NS', ns),
                                 headers={'Authorization': 'Bearer ' + token})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            print(json.dumps({'code': r.status, 'body': json.load(r)}))
    except urllib.error.HTTPError as e:
        print(json.dumps({'code': e.code, 'body': None}))
""")


def api_get(kube: Kubectl, pod: str, path: str, token: str | None = None) -> dict:
    args = ["exec", pod, "--", "python3", "-c", API_CODE, path] + ([token] if token else [])
    return json.loads(kube.run(*args).stdout)


def test_pod_reaches_api_server_with_its_service_account(sts: Kubectl) -> None:
    r = api_get(sts, pod_names()[0], "/api/v1/namespaces/NS/pods")
    assert r["code"] == 200
    names = {p["metadata"]["name"] for p in r["body"]["items"]}
    assert set(pod_names()) <= names


def test_rbac_refuses_a_service_account_without_role(sts: Kubectl, namespace: str) -> None:
    token = sts("create", "token", "no-role", "--duration=10m").strip()
    r = api_get(sts, pod_names()[0], "/api/v1/namespaces/NS/pods", token)
    assert r["code"] == 403
    can = sts.run(
        "auth",
        "can-i",
        "list",
        "pods",
        f"--as=system:serviceaccount:{namespace}:no-role",
        check=False,
    ).stdout.strip()
    assert can == "no"
    # the bound service account may read pods but not secrets
    assert api_get(sts, pod_names()[0], "/api/v1/namespaces/NS/secrets")["code"] == 403


def test_helm_install_small_chart(kube: Kubectl, namespace: str, tmp_path: Path) -> None:
    chart = tmp_path / "smoke-chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: smoke-chart\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text(f"image: {SMOKE_IMAGE}\ngreeting: hello\n")
    (chart / "templates" / "all.yaml").write_text(
        textwrap.dedent("""\
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "{{ .Release.Name }}-config"}
        data: {greeting: "{{ .Values.greeting }}"}
        ---
        apiVersion: apps/v1
        kind: Deployment
        metadata: {name: "{{ .Release.Name }}"}
        spec:
          replicas: 1
          selector: {matchLabels: {app: "{{ .Release.Name }}"}}
          template:
            metadata: {labels: {app: "{{ .Release.Name }}"}}
            spec:
              securityContext: {runAsNonRoot: true, runAsUser: 10001}
              containers:
              - name: app
                image: "{{ .Values.image }}"
                imagePullPolicy: IfNotPresent
                readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 2}
        """)
    )
    helm = ["helm", "--namespace", namespace]
    p = subprocess.run(
        [*helm, "install", "smoke", str(chart), "--wait", "--timeout", "3m"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert p.returncode == 0, p.stderr
    try:
        assert (
            kube("get", "configmap", "smoke-config", "-o", "jsonpath={.data.greeting}") == "hello"
        )
        assert kube.json("get", "deployment", "smoke")["status"].get("readyReplicas") == 1
        ls = subprocess.run(
            [*helm, "list", "-o", "json"], capture_output=True, text=True, check=True
        )
        assert [r["status"] for r in json.loads(ls.stdout) if r["name"] == "smoke"] == ["deployed"]
    finally:
        subprocess.run([*helm, "uninstall", "smoke", "--wait"], capture_output=True, timeout=120)
