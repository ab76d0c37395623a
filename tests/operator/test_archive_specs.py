"""spec.backup and spec.bootstrap.fromArchive as manifests (rlog_operator.archive_specs via
specs.desired_objects), the archiver's metrics into status.archive, and the CRD schema."""

import datetime
from pathlib import Path

import yaml

from rlog_operator import archive_specs, pki, specs
from rlog_operator import constants as c
from rlog_operator.specs import OperatorConfig

CONFIG = OperatorConfig()
UID = "0b6f3c2e-1111-2222-3333-444455556666"
ROOT = Path(__file__).resolve().parents[2]


def body(**spec):
    return {
        "apiVersion": "rlog.io/v1alpha1",
        "kind": "ReplicatedLog",
        "metadata": {"name": "orders", "namespace": "shop", "uid": UID, "generation": 1},
        "spec": {"replicas": 3, "storage": {"size": "1Gi"}, **spec},
    }


def after(args, flag):
    return args[args.index(flag) + 1]


BACKUP = {
    "endpoint": "http://s3.shop:7070",
    "bucket": "logs",
    "credentialsSecret": "s3-creds",
    "retention": {"maxAgeSeconds": 86400, "keepFromPosition": 0, "keepSegments": 3},
    "flushIntervalSeconds": 5,
}


def test_no_backup_no_archiver_no_init_container():
    objects = specs.desired_objects(body(), CONFIG)
    assert [o["kind"] for o in objects] == [
        "Service",
        "Service",
        "PodDisruptionBudget",
        "StatefulSet",
    ]
    assert "initContainers" not in objects[-1]["spec"]["template"]["spec"]


def test_backup_adds_one_archiver_deployment_and_its_service():
    objects = specs.desired_objects(body(backup=BACKUP), CONFIG)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    service = objects[-2]
    assert deployment["metadata"]["name"] == service["metadata"]["name"] == "orders-archiver"
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # never two archivers
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["labels"][c.LABEL_COMPONENT] == "archiver"
    # not selected by the replicas' Services, StatefulSet and PDB
    assert specs.selector_labels(body()).items() - pod["metadata"]["labels"].items()
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    (ctr,) = pod["spec"]["containers"]
    args = ctr["args"]
    assert ctr["command"] == ["rlog"] and args[:2] == ["archive", "run"]
    assert after(args, "--endpoint") == f"orders:{CONFIG.grpc_port}"
    assert after(args, "--bucket") == "logs"
    assert after(args, "--prefix") == "shop/orders"  # the default prefix
    assert after(args, "--s3-endpoint") == "http://s3.shop:7070"
    assert after(args, "--retention-max-age") == "86400"
    assert after(args, "--retention-keep-from") == "0"
    assert after(args, "--flush-interval") == "5"
    assert after(args, "--retention-keep-segments") == "3"
    assert after(args, "--metrics-port") == str(archive_specs.ARCHIVER_METRICS_PORT)
    # the flush is taken on the control port (the operator's certificate only), which the
    # Service carries for the operator's calls
    assert after(args, "--control-port") == str(archive_specs.ARCHIVER_CONTROL_PORT)
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "metrics": archive_specs.ARCHIVER_METRICS_PORT,
        "control": archive_specs.ARCHIVER_CONTROL_PORT,
    }
    assert {p["name"] for p in ctr["ports"]} == {"metrics", "control"}
    secrets = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in ctr["env"] if "valueFrom" in e}
    assert secrets == {
        "AWS_ACCESS_KEY_ID": {"name": "s3-creds", "key": "AWS_ACCESS_KEY_ID"},
        "AWS_SECRET_ACCESS_KEY": {"name": "s3-creds", "key": "AWS_SECRET_ACCESS_KEY"},
    }  # no delete credentials: it deletes with these
    # a new log is mutual TLS: the archiver reads as itself (role read), its certificate
    # mounted and named to rlog through RLOG_*
    tls = {e["name"]: e["value"] for e in ctr["env"] if "value" in e}
    assert tls == {
        "RLOG_CA": "/etc/rlog/tls/ca.crt",
        "RLOG_CERT": "/etc/rlog/tls/tls.crt",
        "RLOG_KEY": "/etc/rlog/tls/tls.key",
    }
    assert {"name": "tls", "mountPath": "/etc/rlog/tls"} in ctr["volumeMounts"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "orders-tls-archiver"
    assert pki.roles(body(backup=BACKUP))["subjects"]["orders-archiver"] == "read"
    assert "orders-archiver" not in pki.roles(body())["subjects"]
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert ctr["securityContext"]["readOnlyRootFilesystem"] is True


def test_delete_credentials_come_from_their_own_secret():
    split = body(backup={**BACKUP, "deleteCredentialsSecret": "s3-delete"})
    deployment = next(o for o in specs.desired_objects(split, CONFIG) if o["kind"] == "Deployment")
    (ctr,) = deployment["spec"]["template"]["spec"]["containers"]
    secrets = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in ctr["env"] if "valueFrom" in e}
    assert secrets["AWS_ACCESS_KEY_ID"] == {"name": "s3-creds", "key": "AWS_ACCESS_KEY_ID"}
    assert secrets["RLOG_ARCHIVE_DELETE_ACCESS_KEY_ID"] == {
        "name": "s3-delete",
        "key": "AWS_ACCESS_KEY_ID",
    }
    assert secrets["RLOG_ARCHIVE_DELETE_SECRET_ACCESS_KEY"] == {
        "name": "s3-delete",
        "key": "AWS_SECRET_ACCESS_KEY",
    }


def test_a_workload_identity_replaces_the_credentials_secret():
    """spec.backup.serviceAccountName without credentialsSecret: the archiver runs as that
    ServiceAccount with no key variables (it takes its keys from the identity the cloud's
    webhook names in its environment) and still without the API token."""
    identity = {k: v for k, v in BACKUP.items() if k != "credentialsSecret"}
    identity["serviceAccountName"] = "orders-archiver-s3"
    deployment = next(
        o for o in specs.desired_objects(body(backup=identity), CONFIG) if o["kind"] == "Deployment"
    )
    pod = deployment["spec"]["template"]["spec"]
    (ctr,) = pod["containers"]
    assert pod["serviceAccountName"] == "orders-archiver-s3"
    assert pod["automountServiceAccountToken"] is False
    assert not [e for e in ctr["env"] if e["name"].startswith("AWS_")]
    # both: the keys are given and the pod runs as the account (the keys win, in the archiver)
    both = next(
        o for o in specs.desired_objects(body(backup={**BACKUP, **identity}), CONFIG)
        if o["kind"] == "Deployment"
    )  # fmt: skip
    (ctr,) = both["spec"]["template"]["spec"]["containers"]
    assert {e["name"] for e in ctr["env"]} >= {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    # neither: the default ServiceAccount, as before
    plain = next(
        o for o in specs.desired_objects(body(backup=BACKUP), CONFIG) if o["kind"] == "Deployment"
    )
    assert "serviceAccountName" not in plain["spec"]["template"]["spec"]


def test_bootstrap_adds_a_restore_init_container_that_defers_to_a_running_log():
    source = {
        "bucket": "logs",
        "prefix": "shop/old",
        "credentialsSecret": "s3-creds",
        "toPosition": 1234,
    }
    sts = next(
        o
        for o in specs.desired_objects(body(bootstrap={"fromArchive": source}), CONFIG)
        if o["kind"] == "StatefulSet"
    )
    (init,) = sts["spec"]["template"]["spec"]["initContainers"]
    args = init["args"]
    assert init["name"] == c.RESTORE_CONTAINER and args[0] == "restore"
    assert "--if-fresh" in args and "--starting" in args  # never VOTING without the permit
    assert after(args, "--unless-peers-voting") == ",".join(specs.peers(body(), CONFIG))
    assert after(args, "--data-dir") == c.DATA_DIR
    assert after(args, "--prefix") == "shop/old" and after(args, "--to-position") == "1234"
    assert {"name": c.DATA_VOLUME, "mountPath": c.DATA_MOUNT} in init["volumeMounts"]
    # it asks the peers' Status as the replica itself: a TLS log refuses a plaintext call,
    # and a refused call must not read as "no replica runs the log"
    (replica,) = sts["spec"]["template"]["spec"]["containers"]
    tls_env = [e for e in init["env"] if e["name"].startswith("RLOG_")]
    assert tls_env and tls_env == [
        e for e in replica["env"] if e["name"] in ("RLOG_CA", "RLOG_CERT", "RLOG_KEY")
    ]
    assert {"name": "tls", "mountPath": specs.TLS_MOUNT, "readOnly": True} in init["volumeMounts"]
    assert "auth" not in {m["name"] for m in init["volumeMounts"]}


def test_a_plaintext_log_gives_the_archiver_and_the_restore_no_certificate():
    plain = body(backup=BACKUP, bootstrap={"fromArchive": BACKUP}, tls={"mode": "disabled"})
    objects = specs.desired_objects(plain, CONFIG)
    (archiver,) = [o for o in objects if o["kind"] == "Deployment"]
    (ctr,) = archiver["spec"]["template"]["spec"]["containers"]
    assert not [e for e in ctr["env"] if e["name"].startswith("RLOG_")]
    assert [v["name"] for v in archiver["spec"]["template"]["spec"]["volumes"]] == ["tmp"]
    (sts,) = [o for o in objects if o["kind"] == "StatefulSet"]
    (init,) = sts["spec"]["template"]["spec"]["initContainers"]
    assert not [e for e in init["env"] if e["name"].startswith("RLOG_")]
    assert pki.plan_secrets(plain, CONFIG, {}, datetime.datetime.now(datetime.UTC)) == []


def test_the_archiver_gets_its_own_certificate_and_keeps_it():
    now = datetime.datetime.now(datetime.UTC)
    log = body(backup=BACKUP)
    written = {s["metadata"]["name"]: s for s in pki.plan_secrets(log, CONFIG, {}, now)}
    assert "orders-tls-archiver" in written
    # it serves the control port as its Service's name, which the operator checks
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(
        pki.secret_bytes(written["orders-tls-archiver"], specs.CERT_KEY) or b""
    )
    alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert archive_specs.archiver_host(log) == "orders-archiver.shop.svc"
    assert "orders-archiver.shop.svc" in alt.get_values_for_type(x509.DNSName)
    # an archiver certificate issued before it had those names is issued again
    cert, key = _unnamed(written, log)
    peer_ca = pki.secret_bytes(written["orders-tls-peer-ca"], specs.CA_KEY) or b""
    data = {specs.CA_KEY: peer_ca, specs.CERT_KEY: cert, pki.KEY_KEY: key}
    old = {**written, "orders-tls-archiver": pki._secret(log, "orders-tls-archiver", data)}
    again = pki.plan_secrets(log, CONFIG, old, now)
    assert [s["metadata"]["name"] for s in again] == ["orders-tls-archiver"]
    # nothing to renew the next time round: the archiver's Secret is not issued again
    assert pki.plan_secrets(log, CONFIG, written, now) == []


def _unnamed(written, log):
    from rlog import certs

    ca = written["orders-tls-peer-ca"]
    pem = certs.issue(
        certs.Pem(pki.secret_bytes(ca, specs.CA_KEY), pki.secret_bytes(ca, pki.CA_PRIVATE_KEY)),
        pki.archiver_common_name(log),
    )
    return pem.cert, pem.key


def test_cert_manager_issues_the_archiver_a_server_certificate_too():
    log = body(backup=BACKUP, tls={"mode": "certManager", "issuerRef": {"name": "ca"}})
    (archiver,) = [
        r
        for r in pki.certificate_requests(log, CONFIG)
        if r["spec"]["secretName"] == "orders-tls-archiver"
    ]
    assert "server auth" in archiver["spec"]["usages"]
    assert "orders-archiver.shop.svc" in archiver["spec"]["dnsNames"]


def test_archive_status_from_metrics():
    text = """# HELP rlog_archive_archived_position x
# TYPE rlog_archive_archived_position gauge
rlog_archive_archived_position 900.0
rlog_archive_log_learned_position 1000.0
rlog_archive_lag_positions 100.0
rlog_archive_last_segment_timestamp_seconds 1.7672256e+09
rlog_archive_segments_total 4.0
"""
    status = archive_specs.archive_status(archive_specs.parse_archive_metrics(text))
    assert status == {
        "archivedPosition": 900,
        "logLearnedPosition": 1000,
        "lag": 100,
        "lastSegmentTime": "2026-01-01T00:00:00Z",
        "message": "",
    }
    assert archive_specs.archive_status(None, "cannot read x")["message"] == "cannot read x"


def test_crd_schema_has_backup_bootstrap_and_archive_status():
    for path in (
        ROOT / "crds/replicatedlog.yaml",
        ROOT / "helm/rlog-operator/crds/replicatedlog.yaml",
    ):
        crd = yaml.safe_load(path.read_text())
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
        spec = schema["spec"]["properties"]
        assert spec["backup"]["required"] == ["bucket"]  # keys or an identity (CEL)
        assert "serviceAccountName" in spec["backup"]["properties"]
        (rule,) = spec["backup"]["x-kubernetes-validations"]
        assert rule["rule"] == "has(self.credentialsSecret) || has(self.serviceAccountName)"
        assert set(spec["backup"]["properties"]["retention"]["properties"]) == {
            "maxAgeSeconds",
            "keepFromPosition",
            "keepSegments",
        }
        assert "deleteCredentialsSecret" in spec["backup"]["properties"]
        source = spec["bootstrap"]["properties"]["fromArchive"]
        assert "toPosition" in source["properties"]
        assert spec["bootstrap"]["x-kubernetes-validations"][0]["rule"] == "self == oldSelf"
        assert set(schema["status"]["properties"]["archive"]["properties"]) >= {
            "archivedPosition",
            "lag",
        }
