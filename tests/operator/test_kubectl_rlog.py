"""`kubectl rlog` (rlog_operator.plugin): arguments, request builders, the status
table, and the errors of a real run without a cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlog_operator import constants as c
from rlog_operator.plugin import cli, cluster, patches, views

NOW = "2026-01-01T00:00:00Z"


def log(phase="Ready", leader="orders-1", replicas=3, items=(), **status):
    return {
        "metadata": {"name": "orders", "namespace": "shop", "uid": "u-1"},
        "spec": {"replicas": replicas},
        "status": {
            "phase": phase,
            "leader": leader,
            "votingReplicas": replicas,
            "replicas": list(items),
            **status,
        },
    }


# ---- arguments --------------------------------------------------------------------------------


def test_arguments_of_every_command():
    args = cli.parse_args(["-n", "shop", "replace-volume", "orders", "2"])
    assert (args.namespace, args.command, args.name, args.ordinal) == (
        "shop",
        "replace-volume",
        "orders",
        2,
    )
    for command in ("status", "reinitialize", "step-down", "pause", "resume"):
        args = cli.parse_args([command, "orders", "--context", "kind"])
        assert (args.command, args.name, args.context) == (command, "orders", "kind")
    # kubectl passes flags where the user put them: before or after the command
    before = cli.parse_args(["-n", "shop", "--kubeconfig", "k", "status", "orders"])
    after = cli.parse_args(["status", "orders", "-n", "shop", "--kubeconfig", "k"])
    assert (before.namespace, before.kubeconfig) == (after.namespace, after.kubeconfig)
    assert (after.namespace, after.kubeconfig, after.context) == ("shop", "k", None)


@pytest.mark.parametrize(
    "argv",
    [[], ["logs"], ["replace-volume", "orders"], ["replace-volume", "orders", "-1"],
     ["replace-volume", "orders", "x"], ["explode", "orders"]],
)  # fmt: skip
def test_bad_arguments_exit_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as exit:
        cli.parse_args(argv)
    assert exit.value.code == 2
    assert "usage: kubectl rlog" in capsys.readouterr().err


# ---- request builders -------------------------------------------------------------------------


def test_replace_volume_annotates_the_replicas_pod():
    request = patches.replace_volume_request(log(), 2, NOW)
    assert (request.kind, request.name) == ("Pod", "orders-2")
    assert request.patch == {"metadata": {"annotations": {c.ANNOTATION_REPLACE_VOLUME: NOW}}}


def test_replace_volume_refuses_an_ordinal_out_of_range():
    with pytest.raises(
        patches.PluginError,
        match=r"ordinal 3 is out of range: orders has 3 replicas \(ordinals 0..2\)",
    ):
        patches.replace_volume_request(log(), 3, NOW)
    assert patches.replace_volume_request(log(replicas=5), 4, NOW).name == "orders-4"


def test_reinitialize_writes_the_uid_only_in_data_loss():
    request = patches.reinitialize_request(log(phase="DataLoss"))
    assert (request.kind, request.name) == ("ReplicatedLog", "orders")
    assert request.patch == {"metadata": {"annotations": {c.ANNOTATION_REINITIALIZE: "u-1"}}}
    with pytest.raises(patches.PluginError, match="is Ready, not DataLoss"):
        patches.reinitialize_request(log())


def test_step_down_needs_a_leader():
    request = patches.step_down_request(log(), NOW)
    assert request.patch == {"metadata": {"annotations": {c.ANNOTATION_STEP_DOWN: NOW}}}
    assert "orders-1" in request.done
    with pytest.raises(patches.PluginError, match="no leader"):
        patches.step_down_request(log(leader=""), NOW)


def test_pause_and_resume_set_and_remove_the_annotation():
    assert patches.pause_request(log(), True).patch == {
        "metadata": {"annotations": {c.ANNOTATION_PAUSED: "true"}}
    }
    assert patches.pause_request(log(), False).patch == {
        "metadata": {"annotations": {c.ANNOTATION_PAUSED: None}}  # merge patch: removed
    }


def test_the_operator_reads_the_same_annotations():
    """The plugin's pause is the operator's pause; its step-down the operator's request."""
    from rlog_operator import observed, specs

    body = {
        **log(),
        "metadata": {**log()["metadata"], "annotations": {c.ANNOTATION_PAUSED: "true"}},
    }
    assert specs.paused(body)
    asked = patches.step_down_request(log(), NOW).patch["metadata"]["annotations"]
    assert observed.step_down_requested(asked, "orders-1") == "orders-1"
    assert observed.step_down_requested(asked, "") == ""  # waits for a leader
    assert observed.step_down_requested({}, "orders-1") == ""


# ---- the status table -------------------------------------------------------------------------


def test_status_table_lists_every_replica():
    replicas = [
        {"name": "orders-0", "status": "VOTING", "role": "follower", "begin": 1, "end": 90,
         "learned": 90, "ready": True},
        {"name": "orders-1", "status": "VOTING", "role": "leader", "begin": 1, "end": 90,
         "learned": 90, "ready": True},
        {"name": "orders-2", "status": "RECOVERING", "role": "follower", "begin": 0, "end": 40,
         "learned": 40, "ready": False, "catchup": "40/90", "reason": "catching up"},
    ]  # fmt: skip
    table = views.status_table(log(phase="Recovering", replicas=3, paused=True, items=replicas))
    lines = table.splitlines()
    assert lines[0].startswith("orders: Recovering (leader orders-1")
    assert "PAUSED" in lines[0]
    header = next(line for line in lines if line.startswith("REPLICA"))
    assert header.split() == list(views.COLUMNS)
    row = next(line for line in lines if line.startswith("orders-2"))
    assert row.split()[:8] == ["orders-2", "RECOVERING", "follower", "0", "40", "40", "40/90", "no"]
    assert row.endswith("catching up")


def test_status_table_of_a_log_not_yet_observed():
    table = views.status_table({"metadata": {"name": "orders"}, "spec": {"replicas": 3}})
    assert table.splitlines()[0].startswith("orders: not observed yet")


def test_status_table_shows_the_archive():
    archive = {"archivedPosition": 880, "lag": 20, "lastSegmentTime": NOW, "message": ""}
    lines = views.status_table(log(archive=archive)).splitlines()
    assert lines[1] == f"  archive: position 880, lag 20, last segment {NOW}"


def test_status_table_shows_storage_trouble():
    degraded = {"type": "StorageDegraded", "status": "True", "reason": "StorageLost",
                "message": "orders-2 found its storage lost"}  # fmt: skip
    lines = views.status_table(log(conditions=[degraded])).splitlines()
    assert lines[1] == "  storage: StorageLost: orders-2 found its storage lost"
    healthy = {**degraded, "status": "False", "reason": "AllHealthy"}
    assert "storage:" not in views.status_table(log(conditions=[healthy]))


def test_status_table_shows_a_lost_node():
    lost = {"type": "NodeLost", "status": "True", "reason": "NodeNotReady",
            "message": "orders-1 is on node w2, not Ready (Unknown) since T: ..."}  # fmt: skip
    lines = views.status_table(log(conditions=[lost])).splitlines()
    assert lines[1] == "  node lost: orders-1 is on node w2, not Ready (Unknown) since T: ..."
    ready = {**lost, "status": "False", "reason": "NodesReady"}
    assert "node lost:" not in views.status_table(log(conditions=[ready]))


# ---- restore (pure) ---------------------------------------------------------------------------

BACKUP = {
    "endpoint": "http://s3.shop:7070",
    "bucket": "logs",
    "credentialsSecret": "s3-creds",
    "retention": {"maxAgeSeconds": 86400},
}


def source(**spec):
    body = log()
    body["spec"] = {"replicas": 5, "storage": {"size": "2Gi"}, "autoInitialize": True, **spec}
    return body


def test_restore_writes_a_new_log_bootstrapped_from_the_archive():
    manifest = patches.restore_manifest(
        source(backup=BACKUP, tls={"mode": "disabled"}, catchUpRate="100Mi"), "orders2", 1234
    )
    assert manifest["metadata"] == {"name": "orders2", "namespace": "shop"}
    spec = manifest["spec"]
    assert spec["bootstrap"]["fromArchive"] == {
        "endpoint": "http://s3.shop:7070",
        "bucket": "logs",
        "prefix": "shop/orders",  # the source's default prefix
        "credentialsSecret": "s3-creds",
        "toPosition": 1234,
    }
    # the source's shape, not its archive (it would write into the source's prefix) nor
    # its TLS mode (a new log gets the default)
    assert (spec["replicas"], spec["storage"], spec["autoInitialize"]) == (5, {"size": "2Gi"}, True)
    assert spec["catchUpRate"] == "100Mi"
    assert "backup" not in spec and "tls" not in spec
    whole = patches.restore_manifest(source(backup={**BACKUP, "prefix": "p/x"}), "orders2", None)
    assert whole["spec"]["bootstrap"]["fromArchive"]["prefix"] == "p/x"
    assert "toPosition" not in whole["spec"]["bootstrap"]["fromArchive"]


def test_restore_refuses_a_log_without_archive_or_the_same_name():
    with pytest.raises(patches.PluginError, match=r"no spec\.backup"):
        patches.restore_manifest(source(), "orders2", None)
    with pytest.raises(patches.PluginError, match="a name of its own"):
        patches.restore_manifest(source(backup=BACKUP), "orders", None)


def test_restore_arguments():
    args = cli.parse_args(["restore", "orders", "orders2", "--to-position", "7", "--dry-run"])
    assert (args.name, args.new, args.to_position, args.dry_run) == ("orders", "orders2", 7, True)
    with pytest.raises(SystemExit):
        cli.parse_args(["restore", "orders", "orders2", "--to-position", "-1"])


# ---- a real run: no cluster -------------------------------------------------------------------


def test_no_cluster_is_a_one_line_error(tmp_path: Path):
    env = dict(os.environ, KUBECONFIG=str(tmp_path / "missing"))
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    out = subprocess.run(
        [sys.executable, "-m", "rlog_operator.plugin", "status", "orders"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert out.returncode == cli.EXIT_ERROR
    assert out.stderr.startswith("kubectl rlog: no cluster:"), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_an_unreachable_cluster_is_a_one_line_error(tmp_path: Path):
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:9"}}]
users: [{name: u, user: {}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: shop}}]
current-context: x
"""
    )
    env = dict(os.environ, KUBECONFIG=str(kubeconfig), PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run(
        [sys.executable, "-m", "rlog_operator.plugin", "pause", "orders"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert out.returncode == cli.EXIT_ERROR
    assert out.stderr.startswith("kubectl rlog: no cluster: ReplicatedLog shop/orders"), out.stderr


# ---- backup -----------------------------------------------------------------------------------


def test_backup_annotates_the_log_and_the_operator_reads_it():
    from rlog_operator import backups

    request = patches.backup_request(source(backup=BACKUP), NOW)
    assert (request.kind, request.name) == ("ReplicatedLog", "orders")
    assert request.patch == {"metadata": {"annotations": {c.ANNOTATION_BACKUP: NOW}}}
    body = {**source(backup=BACKUP), "metadata": {"name": "orders", **request.patch["metadata"]}}
    step = backups.backup_step(body, 90, 40, None, NOW)
    assert (step.kind, step.through) == ("flush", 90)
    args = cli.parse_args(["backup", "orders", "--wait", "--timeout", "30"])
    assert (args.command, args.name, args.wait, args.timeout) == ("backup", "orders", True, 30.0)


def test_backup_refuses_a_log_without_an_archive():
    with pytest.raises(patches.PluginError, match=r"orders has no spec\.backup"):
        patches.backup_request(source(), NOW)


def test_backup_outcome_waits_for_its_own_request():
    def with_backup(**backup):
        return log(archive={"archivedPosition": 95, "backup": backup})

    assert patches.backup_outcome(log(), NOW) is None  # not observed yet
    assert patches.backup_outcome(with_backup(request="older", state="Completed"), NOW) is None
    assert (
        patches.backup_outcome(with_backup(request=NOW, state="Running", through=90), NOW) is None
    )
    done = with_backup(request=NOW, state="Completed", through=90, archivedPosition=95)
    assert patches.backup_outcome(done, NOW) == (
        "orders: the archive covers the log through position 95 (asked: 90)"
    )
    refused = with_backup(request=NOW, state="Refused", message="the log has no spec.backup")
    with pytest.raises(patches.PluginError, match=r"backup refused: the log has no spec\.backup"):
        patches.backup_outcome(refused, NOW)
    lines = views.status_table(done).splitlines()
    assert lines[2] == f"  last backup request {NOW}: Completed, through position 90"


@pytest.mark.parametrize("argv", [["backup"], ["backup", "orders", "--timeout", "0"],
                                  ["backup", "orders", "--timeout", "x"]])  # fmt: skip
def test_backup_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as exit:
        cli.parse_args(argv)
    assert exit.value.code == 2


# ---- certificate ------------------------------------------------------------------------------


def test_certificate_adds_changes_and_revokes_a_client_identity():
    """The plugin only edits spec.auth.clients (no CA key, no Secret read): what the
    operator issues from (identities.clients_of reads the same list), guarded by the
    resourceVersion read (the list is replaced whole)."""
    from rlog_operator import identities

    body = log()
    body["metadata"]["resourceVersion"] = "7"
    body["spec"]["auth"] = {"clients": [{"name": "gc", "role": "owner"}]}
    args = cli.parse_args(["certificate", "orders", "--name", "spark", "--role", "read"])
    added = cli.request_for(args, body, NOW)
    assert added.patch["metadata"] == {"resourceVersion": "7"}
    assert "orders-client-spark" in added.done
    body["spec"]["auth"] = added.patch["spec"]["auth"]
    clients, problems = identities.clients_of(body)
    assert [(c.name, c.role, c.secret) for c in clients] == [
        ("gc", "owner", "orders-client-gc"),
        ("spark", "read", "orders-client-spark"),
    ] and not problems
    changed = patches.certificate_request(body, "spark", "append", days=7, secret="mine")
    assert changed.patch["spec"]["auth"]["clients"][-1] == {
        "name": "spark", "role": "append", "days": 7, "secretName": "mine"
    }  # fmt: skip
    args = cli.parse_args(["certificate", "orders", "--revoke", "spark"])
    revoked = cli.request_for(args, body, NOW)
    assert revoked.patch["spec"]["auth"]["clients"] == [{"name": "gc", "role": "owner"}]
    with pytest.raises(patches.PluginError, match="no client identity"):
        patches.certificate_request(body, "nobody", None, revoke=True)
    with pytest.raises(patches.PluginError, match="--role"):
        patches.certificate_request(body, "spark", None)


@pytest.mark.parametrize(
    "argv",
    [["certificate", "orders", "--name", "x", "--role", "admin"],
     ["certificate", "orders", "--name", "x", "--role", "peer"],
     ["certificate", "orders", "--name", "x", "--revoke", "x"],
     ["certificate", "orders"]],
)  # fmt: skip
def test_certificate_never_for_a_peer_or_admin(argv, capsys):
    with pytest.raises(SystemExit) as exit:
        cli.parse_args(argv)
    assert exit.value.code == 2


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ('{"kind": "Status", "reason": "Conflict", "code": 409}', "Conflict"),
        ('{"kind": "Status", "reason": "AlreadyExists", "code": 409}', "AlreadyExists"),
        ("not json", ""),
        ("[]", ""),
        (None, ""),
    ],
)
def test_a_conflict_is_told_from_an_existing_name(body, reason):
    """Both are HTTP 409: only a Conflict (a write since the read) is read and built again
    (`apply_fresh`); AlreadyExists stays an error."""
    from kubernetes.client.exceptions import ApiException

    error = ApiException(status=409, reason="Conflict")
    error.body = body
    assert cluster._status_reason(error) == reason


# ---- the list, -o json|yaml, version (pure views; the calls: e2e/operator/test_kubectl_rlog.py)


def test_status_as_json_and_yaml_carries_what_the_table_shows():
    log = {
        "metadata": {"name": "orders", "namespace": "team-a"},
        "spec": {"replicas": 3},
        "status": {"phase": "Ready", "leader": "orders-1", "votingReplicas": 3},
    }
    document = views.status_document(log)
    assert document == {
        "name": "orders",
        "namespace": "team-a",
        "replicas": 3,
        "status": {"phase": "Ready", "leader": "orders-1", "votingReplicas": 3},
    }
    assert json.loads(views.rendered(document, "json")) == document
    assert yaml.safe_load(views.rendered(document, "yaml")) == document


def test_the_list_of_logs_has_a_row_each_and_says_when_there_is_none():
    logs = [
        {
            "metadata": {"name": "orders", "namespace": "a"},
            "spec": {"replicas": 3},
            "status": {"phase": "Ready", "leader": "orders-0", "votingReplicas": 3},
        },
        {
            "metadata": {"name": "events", "namespace": "b"},
            "spec": {"replicas": 5},
            "status": {"phase": "Degraded", "votingReplicas": 4, "paused": True,
                       "archive": {"lag": 12}},
        },
    ]  # fmt: skip
    table = views.logs_table(logs).splitlines()
    assert table[0].split() == list(views.LIST_COLUMNS)
    assert table[1].split() == ["a", "orders", "Ready", "orders-0", "3/3", "-", "no"]
    assert table[2].split() == ["b", "events", "Degraded", "-", "4/5", "12", "yes"]
    assert views.logs_table([]) == "no ReplicatedLogs found"


def test_version_names_every_build_and_a_roll_in_progress():
    document = views.version_document(
        "0.2.0.dev0",
        1,
        {"rlog-system/rlog-operator-abc": ["docker.io/rlog/rlog-operator:0.2.0-dev.0"]},
        {"a/orders": {"r:0.1.0": 1, "r:0.2.0-dev.0": 2}, "b/events": {}},
    )
    text = views.version_text(document).splitlines()
    assert text[0] == "kubectl-rlog 0.2.0.dev0 (peer protocol 1)"
    operator = "operator rlog-system/rlog-operator-abc: docker.io/rlog/rlog-operator:0.2.0-dev.0"
    assert operator in text
    assert "replicas of a/orders: r:0.1.0 x1, r:0.2.0-dev.0 x2" in text
    assert "replicas of b/events: no pods" in text
    hidden = views.version_document("0.2.0.dev0", 1, None, {})
    assert "operator: not visible" in views.version_text(hidden)


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["status", "-A", "-n", "x"], "-A and -n exclude each other"),
        (["version", "-A", "-n", "x"], "-A and -n exclude each other"),
        (["status", "orders", "-A"], "-A lists every namespace's logs: it takes no NAME"),
    ],
)
def test_contradictory_scopes_are_refused_before_any_call(argv, why):
    with pytest.raises(patches.PluginError, match=why):
        cli.run(cli.parse_args(argv))


def test_bad_output_format_and_since_are_usage_errors():
    for argv in (["status", "-o", "xml"], ["logs", "orders", "--since", "0"]):
        with pytest.raises(SystemExit) as exit:
            cli.parse_args(argv)
        assert exit.value.code == 2


def test_without_the_kubernetes_client_the_plugin_says_what_to_install():
    code = (
        "import sys; sys.modules['kubernetes'] = None; "
        "from rlog_operator.plugin.cli import main; sys.exit(main(['status', 'orders']))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == cli.EXIT_ERROR
    assert out.stderr.strip() == (
        "kubectl rlog: the kubernetes client is not installed: pip install 'rlog-paxos[kubectl]'"
    )


def test_the_plugin_runs_without_kopf():
    """`pip install 'rlog-paxos[kubectl]'` brings the kubernetes client and PyYAML, not kopf: no
    module of the plugin may need it."""
    code = (
        "import sys; sys.modules['kopf'] = None\n"
        "import rlog_operator.plugin.cli, rlog_operator.plugin.completion\n"
        "from rlog_operator.plugin.cli import main\n"
        "sys.exit(main(['--version']))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("kubectl-rlog ")
