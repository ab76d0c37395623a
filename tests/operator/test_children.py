"""Which deleted owned objects the observe timer creates again (rlog_operator.children), on the
objects the operator really builds for a log."""

from __future__ import annotations

from rlog_operator import children, netpol, specs

CONFIG = specs.OperatorConfig(operator_namespace="rlog-system")
BACKUP = {"endpoint": "http://s3.shop:7070", "bucket": "logs", "credentialsSecret": "s3-creds"}


def body(**spec):
    return {
        "metadata": {"name": "orders", "namespace": "shop", "uid": "u"},
        "spec": {"replicas": 3, "storage": {"size": "1Gi"}, **spec},
    }


def desired(b):
    return [*netpol.for_log(b, CONFIG), *specs.desired_objects(b, CONFIG)]


def keys(objects):
    return [(o["kind"], o["metadata"]["name"]) for o in objects]


LOG_UID = "u"


def child(kind, name, owners=(LOG_UID,)):
    return children.Child(kind, name, f"uid-{kind}-{name}", tuple(owners))


def everything_present(b):
    return {child(*k) for k in keys(desired(b)) if k[0] in children.WATCHED}


def without(present, gone):
    return {c for c in present if (c.kind, c.name) not in gone}


def decide(b, present, **kw):
    return children.decide(
        desired(b), present, LOG_UID, **{"built": True, "paused": False, "deleting": False, **kw}
    )


def test_nothing_when_every_owned_object_exists():
    b = body(networkPolicy={"clients": []}, backup=BACKUP)
    decision = decide(b, everything_present(b))
    assert decision.recreate == () and decision.remove == ()
    assert decision.reason() == "every owned object exists and is wanted"


def test_a_deleted_policy_service_and_budget_are_created_again_as_built():
    b = body(networkPolicy={"clients": []})
    gone = {("NetworkPolicy", "orders"), ("Service", "orders"), ("PodDisruptionBudget", "orders")}
    decision = decide(b, without(everything_present(b), gone))
    assert set(keys(decision.recreate)) == gone
    by_key = dict(zip(keys(desired(b)), desired(b), strict=True))
    for obj in decision.recreate:  # the very object the create handler applies
        assert obj == by_key[(obj["kind"], obj["metadata"]["name"])]
    assert decision.reason().startswith("deleted, created again: ")


def test_the_archiver_is_created_again_only_with_spec_backup():
    with_backup = body(backup=BACKUP)
    archiver = {k for k in keys(desired(with_backup)) if k[0] == "Deployment"}
    assert len(archiver) == 1
    decision = decide(with_backup, without(everything_present(with_backup), archiver))
    assert set(keys(decision.recreate)) == archiver
    # without spec.backup no archiver is wanted, so a missing one is not created
    assert decide(body(), everything_present(body())).recreate == ()


def test_the_statefulset_is_left_to_the_storage_plan():
    b = body()
    assert ("StatefulSet", "orders") in keys(desired(b))
    assert "StatefulSet" not in children.WATCHED
    assert decide(b, everything_present(b)).recreate == ()


def test_no_policy_is_created_for_a_log_without_the_spec_section():
    b = body()
    assert all(kind != "NetworkPolicy" for kind, _ in keys(decide(b, set()).recreate))


def test_nothing_before_the_log_is_built_while_paused_or_while_deleted():
    b = body(networkPolicy={"clients": []})
    for kw, why in (
        ({"built": False}, "not built yet"),
        ({"paused": True}, "paused"),
        ({"deleting": True}, "being deleted"),
    ):
        decision = decide(b, set(), **kw)
        assert decision.recreate == (), kw
        assert why in decision.reason()


def test_objects_the_spec_no_longer_asks_for_are_deleted():
    with_both = body(networkPolicy={"clients": []}, backup=BACKUP)
    left_over = everything_present(with_both)  # then both sections are removed from the spec
    decision = decide(body(), left_over)
    assert decision.recreate == ()
    assert {(c.kind, c.name) for c in decision.remove} == {
        ("NetworkPolicy", "orders"),
        ("Service", "orders-archiver"),
        ("Deployment", "orders-archiver"),
    }
    assert all(c.uid.startswith("uid-") for c in decision.remove)  # deleted by UID
    assert "no longer in the spec, deleted: " in decision.reason()


def test_only_objects_this_log_owns_are_deleted():
    stranger = child("NetworkPolicy", "orders", owners=("another-log",))
    unowned = child("Service", "orders-extra", owners=())
    present = everything_present(body()) | {stranger, unowned}
    assert decide(body(), present).remove == ()


def test_a_budget_is_never_deleted():
    present = everything_present(body()) | {child("PodDisruptionBudget", "orders-old")}
    assert decide(body(), present).remove == ()


def test_nothing_is_deleted_while_paused_or_before_the_log_is_built():
    left_over = everything_present(body(networkPolicy={"clients": []}))
    assert decide(body(), left_over, paused=True).remove == ()
    assert decide(body(), left_over, built=False).remove == ()


def test_the_index_record_of_an_object():
    obj = {
        "metadata": {
            "name": "orders",
            "uid": "x1",
            "ownerReferences": [{"kind": "ReplicatedLog", "uid": LOG_UID}],
        }
    }
    assert children.child_of("Service", obj) == children.Child("Service", "orders", "x1", ("u",))
    assert children.child_of("StatefulSet", obj) is None  # storage.py's
    assert children.child_of("Service", {"metadata": {}}) is None
