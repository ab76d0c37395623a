"""The records the operator's indexes keep of watched objects (rlog_operator.observed)."""

from __future__ import annotations

from rlog_operator import observed
from rlog_operator.observed import PvcInfo
from rlog_operator.rolling import volume_lost

CLAIM = {
    "metadata": {"name": "data-orders-0", "uid": "u-0", "labels": {}},
    "spec": {"volumeName": "pv-a"},
    "status": {"phase": "Bound"},
}


def test_log_key_needs_a_namespace_and_an_instance_label() -> None:
    assert observed.log_key("ns", {"app.kubernetes.io/instance": "orders"}) == ("ns", "orders")
    assert observed.log_key("ns", {}) is None
    assert observed.log_key(None, {"app.kubernetes.io/instance": "orders"}) is None


def test_selector_matches_the_labels_the_builders_put_on_replicas() -> None:
    from rlog_operator import specs

    body = {"metadata": {"name": "orders", "namespace": "ns", "uid": "x"}, "spec": {}}
    labels = specs.labels(body)
    for key, value in observed.REPLICA_LABELS.items():
        assert labels[key] == value
    assert observed.REPLICA_SELECTOR == (
        "app.kubernetes.io/component=replica,app.kubernetes.io/name=rlog"
    )


def test_claim_record() -> None:
    record = observed.claim_record(CLAIM)
    assert record == PvcInfo(
        name="data-orders-0",
        uid="u-0",
        phase="Bound",
        deletionTimestamp=None,
        volume="pv-a",
        storageClass="",
        size="",
        capacity="",
    )
    sized = observed.claim_record(
        {
            **CLAIM,
            "spec": {"storageClassName": "fast", "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": "Bound", "capacity": {"storage": "2Gi"}},
        }
    )
    assert (sized["storageClass"], sized["size"], sized["capacity"]) == ("fast", "1Gi", "2Gi")
    pending = observed.claim_record({"metadata": {"name": "c"}, "status": {"phase": "Pending"}})
    assert pending["volume"] == "" and pending["phase"] == "Pending"


def volumes(*names: str) -> dict[str, list[observed.VolumeInfo]]:
    """The persistent_volumes index as kopf holds it: name -> its records."""
    return {name: [observed.VolumeInfo(name=name, node="")] for name in names}


def test_bound_claim_whose_volume_is_gone_is_lost() -> None:
    claims = [observed.claim_record(CLAIM)]
    kept = observed.claims_by_name(claims, volumes("pv-a", "pv-b"))
    assert kept["data-orders-0"]["volumeLost"] is False
    gone = observed.claims_by_name(claims, volumes("pv-b"))
    assert gone["data-orders-0"]["volumeLost"] is True
    assert volume_lost(None, gone["data-orders-0"])


def test_unknown_volumes_or_unbound_claims_are_never_lost() -> None:
    claims = [observed.claim_record(CLAIM)]
    assert observed.claims_by_name(claims, None)["data-orders-0"]["volumeLost"] is False
    pending = observed.claim_record({"metadata": {"name": "c"}, "status": {"phase": "Pending"}})
    assert observed.claims_by_name([pending], volumes("pv-b"))["c"]["volumeLost"] is False


def test_statefulset_record() -> None:
    sts = {"spec": {"replicas": 3}, "status": {"updateRevision": "orders-7f"}}
    record = observed.statefulset_record(sts)
    assert (record["updateRevision"], record["replicas"]) == ("orders-7f", 3)
    empty = observed.statefulset_record({})
    assert (empty["updateRevision"], empty["replicas"], empty["claimSize"]) == ("", 0, "")


def test_statefulset_record_keeps_the_claim_template() -> None:
    from rlog_operator import specs

    body = {
        "metadata": {"name": "orders", "namespace": "ns", "uid": "u"},
        "spec": {"replicas": 3, "storage": {"size": "1Gi", "storageClassName": "fast"}},
    }
    record = observed.statefulset_record(specs.statefulset(body, specs.OperatorConfig()))
    assert (record["claimSize"], record["claimClass"]) == ("1Gi", "fast")


def test_a_replicas_change_is_refused_and_the_log_observed_as_built() -> None:
    assert observed.replicas_changed(3, 3) == ""
    assert observed.replicas_changed(0, 5) == ""  # no StatefulSet yet: nothing to refuse
    message = observed.replicas_changed(3, 5)
    assert "cannot change (3 -> 5)" in message and "no reconfiguration" in message
    body = {"metadata": {"name": "orders"}, "spec": {"replicas": 5, "storage": {"size": "1Gi"}}}
    built = observed.as_built(body, 3)
    assert built["spec"] == {"replicas": 3, "storage": {"size": "1Gi"}}
    assert body["spec"]["replicas"] == 5  # the CR itself is left alone


def test_a_refused_change_shows_as_failed_with_the_message() -> None:
    from rlog_operator import status as st

    body = {"metadata": {"name": "orders", "namespace": "ns", "uid": "u", "generation": 2}}
    built = observed.as_built({**body, "spec": {"replicas": 5}}, 3)
    pods = [
        observed.pod_info({"metadata": {"name": f"orders-{i}", "uid": f"p{i}"}, "status": {}})
        for i in range(3)
    ]
    voting = {"status": "VOTING", "role": "follower", "log_id": "u"}
    statuses = {f"orders-{i}": voting for i in range(3)}
    message = observed.replicas_changed(3, 5)
    result = st.compute_status(built, pods, statuses, "", {}, "2026-01-01T00:00:00Z", error=message)
    assert result.status["phase"] == "Failed" and result.status["message"] == message
    assert [r["name"] for r in result.status["replicas"]] == ["orders-0", "orders-1", "orders-2"]
