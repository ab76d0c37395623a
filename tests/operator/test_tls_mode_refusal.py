"""A running log's TLS mode never changes (rlog_operator.observed.tls_mode_changed): the
operator's own refusal behind the CRD's CEL rule, for an API server that did not enforce it.

`spec.tls.mode: disabled` patched into a default log (no spec.tls, built in mode operator)
must not render a plaintext StatefulSet with authorization off: the change is refused, and
the log is observed, certified and called in the mode it was built with."""

from __future__ import annotations

from typing import Any

from helpers import facts

from rlog_operator import observed, permits, pki, plan, specs
from rlog_operator import status as st
from rlog_operator.rolling import Action
from rlog_operator.storage import Step

CONFIG = specs.OperatorConfig()
BUILT_TLS = {"mode": "operator", "transport": "mutual-tls", "authorization": "roles"}


def log(tls: dict[str, Any] | None = None, status: dict[str, Any] | None = None) -> dict:
    spec: dict[str, Any] = {"replicas": 3, "storage": {"size": "1Gi"}}
    if tls is not None:
        spec["tls"] = tls
    body: dict[str, Any] = {
        "metadata": {"name": "orders", "namespace": "shop", "uid": "u-1", "generation": 2},
        "spec": spec,
    }
    if status is not None:
        body["status"] = status
    return body


RUNNING = {"initialized": True, "tls": BUILT_TLS}  # a default log the operator built


def replica_args(body: dict) -> list[str]:
    (sts,) = [o for o in specs.desired_objects(body, CONFIG) if o["kind"] == "StatefulSet"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    return [*container.get("command", []), *container.get("args", [])]


def test_disabled_patched_into_a_running_default_log_is_refused() -> None:
    patched = log({"mode": "disabled"}, RUNNING)
    message = observed.tls_mode_changed(patched)
    assert "spec.tls.mode cannot change (operator -> disabled)" in message, message
    assert "set spec.tls.mode back to operator" in message
    # what rendering the spec would do: the hole this closes
    assert "--tls-cert" not in replica_args(patched)
    assert pki.tls_status(patched)["authorization"] == "off"


def test_the_observe_view_of_a_log_refusing_both_changes() -> None:
    """observe's view (observed.built_view): both refusals reported, both undone in the view;
    with nothing refused, the body itself."""
    running = log(None, RUNNING)
    assert observed.built_view(running, 3) == (running, "")
    assert observed.built_view(running, 0) == (running, "")  # no StatefulSet yet
    patched = {**log({"mode": "disabled"}, RUNNING)}
    patched["spec"] = {**patched["spec"], "replicas": 5}
    view, refused = observed.built_view(patched, 3)
    tls = observed.tls_mode_changed(patched)
    assert refused == f"{observed.replicas_changed(3, 5)}; {tls}" and tls
    assert specs.replicas_of(view) == 3 and specs.mode_of(view) == "operator"
    assert patched["spec"]["replicas"] == 5  # the CR itself is left alone


def test_the_refused_log_is_observed_and_rendered_as_built() -> None:
    patched = log({"mode": "disabled"}, RUNNING)
    view = observed.with_built_tls(patched)
    assert specs.mode_of(view) == "operator"
    assert pki.tls_status(view) == BUILT_TLS  # status.tls keeps the mode the log runs
    args = replica_args(view)
    assert "--tls-cert" in args and "--auth-config" in args
    assert patched["spec"]["tls"] == {"mode": "disabled"}  # the CR itself is left alone
    # issuerRef and the rest of spec.tls stay
    certs = log({"mode": "disabled", "issuerRef": {"name": "ca"}}, {"tls": {"mode": "certManager"}})
    assert observed.with_built_tls(certs)["spec"]["tls"] == {
        "mode": "certManager",
        "issuerRef": {"name": "ca"},
    }


def test_every_way_to_another_mode_is_refused() -> None:
    cert_manager = {"initialized": True, "tls": {**BUILT_TLS, "mode": "certManager"}}
    refused = {
        "set to another mode": log({"mode": "certManager"}, RUNNING),
        "changed": log({"mode": "operator", "issuerRef": {"name": "ca"}}, cert_manager),
        "a log from before TLS (plaintext) asking for TLS": log(
            {"mode": "operator"}, {"initialized": True}
        ),
    }
    for why, body in refused.items():
        assert "cannot change" in observed.tls_mode_changed(body), why


def test_what_is_not_a_change_is_accepted() -> None:
    accepted = {
        "a new log, nothing built yet": log({"mode": "disabled"}),
        "a new log with a status, no replica yet": log({"mode": "disabled"}, {"phase": "Pending"}),
        "the default log as built": log(None, RUNNING),
        "the built mode written out": log({"mode": "operator"}, RUNNING),
        "a log from before TLS, unset": log(None, {"initialized": True}),
        "a log from before TLS, disabled written out": log(
            {"mode": "disabled"}, {"initialized": True}
        ),
        # unset means the mode the log was built with, not the default of a new log
        "spec.tls removed from a certManager log": log(
            None, {"initialized": True, "tls": {"mode": "certManager"}}
        ),
    }
    for why, body in accepted.items():
        assert observed.tls_mode_changed(body) == "", why


def test_the_refusal_fails_the_status_and_plans_nothing() -> None:
    patched = log({"mode": "disabled"}, RUNNING)
    message = observed.tls_mode_changed(patched)
    view = observed.with_built_tls(patched)
    pods = [
        observed.pod_info({"metadata": {"name": f"orders-{i}", "uid": f"p{i}"}, "status": {}})
        for i in range(3)
    ]
    voting = {"status": "VOTING", "role": "follower", "log_id": "u-1"}
    statuses = {f"orders-{i}": voting for i in range(3)}
    result = st.compute_status(
        view, pods, statuses, "", RUNNING, "2026-01-01T00:00:00Z", refused=message
    )
    assert result.status["phase"] == "Failed" and result.status["message"] == message
    assert ("Warning", "Failed", message) in [(e.type, e.reason, e.message) for e in result.events]
    chosen = plan.decide(
        facts(refused=message),
        paused=False,
        permit=permits.PermitDecision(False, "initialized"),
        rolling_step=Action("delete-pod", pod="orders-2", uid="uid-2", reason="rolling"),
        stored_queue=(),
        storage_step=Step("none"),
    )
    assert not chosen.mend and isinstance(chosen.action, plan.Idle)
    assert chosen.why == message
