"""The records the operator's indexes keep of watched objects (rlog_operator.observed)."""

from __future__ import annotations

from rlog_operator import observed
from rlog_operator.rolling import PvcInfo, volume_lost

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
        name="data-orders-0", uid="u-0", phase="Bound", deletionTimestamp=None, volume="pv-a"
    )
    pending = observed.claim_record({"metadata": {"name": "c"}, "status": {"phase": "Pending"}})
    assert pending["volume"] == "" and pending["phase"] == "Pending"


def test_bound_claim_whose_volume_is_gone_is_lost() -> None:
    claims = [observed.claim_record(CLAIM)]
    kept = observed.claims_by_name(claims, ["pv-a", "pv-b"])
    assert kept["data-orders-0"]["volumeLost"] is False
    gone = observed.claims_by_name(claims, ["pv-b"])
    assert gone["data-orders-0"]["volumeLost"] is True
    assert volume_lost(None, gone["data-orders-0"])


def test_unknown_volumes_or_unbound_claims_are_never_lost() -> None:
    claims = [observed.claim_record(CLAIM)]
    assert observed.claims_by_name(claims, None)["data-orders-0"]["volumeLost"] is False
    pending = observed.claim_record({"metadata": {"name": "c"}, "status": {"phase": "Pending"}})
    assert observed.claims_by_name([pending], ["pv-b"])["c"]["volumeLost"] is False


def test_update_revision() -> None:
    assert observed.update_revision({"status": {"updateRevision": "orders-7f"}}) == "orders-7f"
    assert observed.update_revision({}) == ""
