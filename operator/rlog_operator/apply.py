"""Applying a ReplicatedLog's desired objects (the create, update and resume handler's work).

Every object `children.desired` lists is created, or patched where it exists, adopted by the
ReplicatedLog (`kopf.adopt(..., strict=True)`); the log's Secrets are written first (the pods
mount them). A change of `spec.replicas` or of the TLS mode (`spec.tls.mode` set, changed or
removed) that slipped past the CRD's CEL rules is refused before anything is applied (a
Ready=False condition, phase Failed, a Warning Event ReplicasChanged or TLSModeChanged, and a
PermanentError): rlog has no reconfiguration, and TLS and plaintext replicas cannot talk to
each other, so the StatefulSet is never rendered in another mode than the log's. Nothing is
applied while the log is paused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from rlog_operator import children, kube, metrics, observed, pki_secrets, specs
from rlog_operator import constants as c
from rlog_operator import status as st


async def apply_objects(
    body: kopf.Body, patch: kopf.Patch, config: specs.OperatorConfig, logger: kopf.Logger
) -> None:
    """Apply the log's desired objects (see the module docs)."""
    if specs.paused(body):
        # Nothing is applied while paused; removing the annotation is an update, which
        # applies everything changed meanwhile.
        patch.status["paused"] = True
        kopf.info(body, reason="Paused", message=f"{c.ANNOTATION_PAUSED}: nothing applied")
        return
    objects = children.desired(body, config)
    sts_name = specs.statefulset_name(body)
    namespace = specs.namespace_of(body)
    try:
        existing = await asyncio.to_thread(kube.read_statefulset, sts_name, namespace)
    except ApiException as e:
        metrics.ERRORS.labels(handler="apply").inc()
        raise kube.temporary(e, f"reading StatefulSet {sts_name}") from e
    wanted = specs.replicas_of(body)
    if existing is not None:
        have = int((existing.get("spec") or {}).get("replicas") or 0)
        _refuse_if(body, patch, "ReplicasChanged", observed.replicas_changed(have, wanted))
    _refuse_if(body, patch, "TLSModeChanged", observed.tls_mode_changed(body))
    if existing is not None:
        # volumeClaimTemplates are immutable: keep the built one (the observe timer replaces
        # the StatefulSet when spec.storage changed, see storage.py)
        built_claims = (existing.get("spec") or {}).get("volumeClaimTemplates")
        for obj in objects:
            if obj["kind"] == "StatefulSet" and built_claims:
                obj["spec"]["volumeClaimTemplates"] = built_claims
    try:  # the Secrets first: the pods mount them
        await pki_secrets.ensure_pki(body, config, logger)
    except ApiException as e:
        metrics.ERRORS.labels(handler="apply").inc()
        raise kube.temporary(e, "writing the log's certificates") from e
    except pki_secrets.SecretRaced as raced:
        # Another operator pod wrote it (an HA hand-over): the next pass plans with it.
        raise kopf.TemporaryError(f"Secret {raced} was created meanwhile", delay=2) from None
    for obj in objects:
        kopf.adopt(obj, owner=body, strict=True)
        try:
            what = await asyncio.to_thread(kube.apply_one, obj)
        except ApiException as e:
            metrics.ERRORS.labels(handler="apply").inc()
            if e.status in (400, 403, 422):
                message = f"{obj['kind']} {obj['metadata']['name']}: {e.reason}: {e.body}"
                kopf.warn(body, reason="ApplyFailed", message=message[:1000])
                raise kopf.PermanentError(message) from e
            raise kube.temporary(e, f"applying {obj['kind']} {obj['metadata']['name']}") from e
        logger.info("%s %s %s", what, obj["kind"], obj["metadata"]["name"])


def _refuse_if(body: kopf.Body, patch: kopf.Patch, reason: str, message: str) -> None:
    """Refuse the spec (nothing applied) when `message` says why: Ready False with `reason`,
    phase Failed, a Warning Event, and a PermanentError (the next change of the spec is
    reconciled again). No-op for an empty message."""
    if not message:
        return
    now = st.now()
    previous = list((body.get("status") or {}).get("conditions") or [])
    patch.status["conditions"] = _with_condition(
        previous,
        st.condition("Ready", False, reason, message, previous, now, _generation(body)),
    )
    patch.status["phase"] = "Failed"
    patch.status["message"] = message
    kopf.warn(body, reason=reason, message=message)
    metrics.ERRORS.labels(handler="apply").inc()
    raise kopf.PermanentError(message)


def _with_condition(
    previous: list[Mapping[str, Any]], new: Mapping[str, Any]
) -> list[Mapping[str, Any]]:
    return [cond for cond in previous if cond.get("type") != new.get("type")] + [new]


def _generation(body: Mapping[str, Any]) -> int:
    return int((body.get("metadata") or {}).get("generation") or 0)
