"""Which of a log's owned objects are gone or no longer wanted, for the observe timer.

A ReplicatedLog owns its Services, PodDisruptionBudget, NetworkPolicy and (with spec.backup)
the archiver's Service and Deployment. Someone deleting one of them (`kubectl delete netpol`,
a cleanup script) must not leave the log without it: kopf indexes of these kinds, filtered
on the operator's managed-by label, say what exists, and whatever `desired` names that the
index lacks is created again by the next tick. The other way round, an object this log owns
(its uid in the owner references) that the spec no longer asks for (`spec.networkPolicy` or
`spec.backup` removed) is deleted, with a UID precondition.

Not here, on purpose:
* the StatefulSet: storage.py deletes it (Orphan) to change its claim template and creates
  it again itself (`create-statefulset`), so this module must not race it;
* the Secrets: pki.plan_secrets plans an absent Secret anew on every tick.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlog_operator import netpol, specs

# kind -> (API group, plural) of the objects watched here; the StatefulSet is storage.py's
WATCHED: Mapping[str, tuple[str, str]] = {
    "Service": ("", "services"),
    "PodDisruptionBudget": ("policy", "poddisruptionbudgets"),
    "NetworkPolicy": ("networking.k8s.io", "networkpolicies"),
    "Deployment": ("apps", "deployments"),
}
# Kinds a spec change can make unwanted: the NetworkPolicy (spec.networkPolicy removed), the
# archiver's Service and Deployment (spec.backup removed). A log always has its budget.
REMOVABLE = frozenset({"NetworkPolicy", "Service", "Deployment"})


def desired(body: Mapping[str, Any], config: specs.OperatorConfig) -> list[dict[str, Any]]:
    """Every object the log owns, in the order to create it (the policy first): what the
    create/update handler applies, and what `decide` looks for."""
    return [*netpol.for_log(body, config), *specs.desired_objects(body, config)]


@dataclass(frozen=True)
class Child:
    """An object of a watched kind, as the index keeps it."""

    kind: str
    name: str
    uid: str
    owners: tuple[str, ...]  # uids of its owner references


def child_of(kind: str, body: Mapping[str, Any]) -> Child | None:
    meta = body.get("metadata") or {}
    name = meta.get("name")
    if not name or kind not in WATCHED:
        return None
    owners = tuple(str(o.get("uid") or "") for o in meta.get("ownerReferences") or [])
    return Child(kind, str(name), str(meta.get("uid") or ""), owners)


@dataclass(frozen=True)
class Decision:
    """What the tick re-creates and deletes, and why nothing when it is nothing."""

    recreate: tuple[Mapping[str, Any], ...] = ()
    remove: tuple[Child, ...] = ()
    why_not: str = ""

    def reason(self) -> str:
        said = []
        if self.recreate:
            names = ", ".join(f"{o['kind']} {o['metadata']['name']}" for o in self.recreate)
            said.append(f"deleted, created again: {names}")
        if self.remove:
            names = ", ".join(f"{c.kind} {c.name}" for c in self.remove)
            said.append(f"no longer in the spec, deleted: {names}")
        return "; ".join(said) or self.why_not or "every owned object exists and is wanted"


def decide(
    desired: Sequence[Mapping[str, Any]],
    present: Collection[Child],
    log_uid: str,
    *,
    built: bool,
    paused: bool,
    deleting: bool,
) -> Decision:
    """The desired objects of a watched kind that are not `present`, and the present ones
    this log owns that are not desired.

    `built`: the log's StatefulSet exists, i.e. the create handler has applied the log once
    (before that, an absent object is one not made yet, not one deleted)."""
    if deleting:
        return Decision(why_not="the log is being deleted")
    if paused:
        return Decision(why_not="paused: nothing is applied")
    if not built:
        return Decision(why_not="not built yet: the create handler applies everything")
    have = {(child.kind, child.name) for child in present}
    wanted = {(o["kind"], o["metadata"]["name"]) for o in desired if o["kind"] in WATCHED}
    missing = tuple(
        obj
        for obj in desired
        if obj["kind"] in WATCHED and (obj["kind"], obj["metadata"]["name"]) not in have
    )
    unwanted = tuple(
        sorted(
            (
                child
                for child in present
                if child.kind in REMOVABLE
                and (child.kind, child.name) not in wanted
                and log_uid
                and log_uid in child.owners
            ),
            key=lambda child: (child.kind, child.name),
        )
    )
    return Decision(missing, unwanted)
