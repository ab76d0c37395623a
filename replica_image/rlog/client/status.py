"""A replica's Status as people and programs read it: `status_name` of the numeric status,
`status_to_dict` for the JSON object `rlog status --json` prints (`StatusDict`)."""

from __future__ import annotations

from typing import TypedDict

from rlog.proto import rlog_pb2 as pb


class StatusDict(TypedDict):
    """A StatusResponse as `rlog status --json` prints it (None: no leader known)."""

    id: int
    status: str
    role: str
    leader: str | None
    begin: int
    end: int
    learned: int
    promised: int
    proposal: int
    log_id: str
    replicas: int
    address: str
    permit: bool
    reason: str
    catchup_begin: int
    catchup_end: int
    catchup_done: int
    leader_confirmed: bool
    corrupt_records: int
    disk_full: bool
    transport: str
    authorization: str
    admin: str  # who may call the Admin API: loopback | anywhere | roles
    insecure: bool  # plaintext beyond loopback (--insecure)
    peer_trust: str  # "ca" | "names" (peers trusted by name: a warning) | "" (no roles)
    storage_fault: str  # why the storage is not healthy, one line ("" if it is)
    # "" (healthy) | corrupt-repaired | storage-lost | refusing | disk-failing | disk-full
    storage_condition: str


def status_name(status: int) -> str:
    return pb.Status.Name(status)  # type: ignore[arg-type]


def status_to_dict(status: pb.StatusResponse) -> StatusDict:
    """A StatusResponse as the JSON object `rlog status --json` prints."""
    return {
        "id": status.id,
        "status": status_name(status.status),
        "role": status.role or "follower",
        "leader": status.leader or None,
        "begin": status.begin,
        "end": status.end,
        "learned": status.learned,
        "promised": status.promised,
        "proposal": status.proposal,
        "log_id": status.log_id,
        "replicas": status.replicas,
        "address": status.address,
        "permit": status.permit,
        "reason": status.reason,
        "catchup_begin": status.catchup_begin,
        "catchup_end": status.catchup_end,
        "catchup_done": status.catchup_done,
        "leader_confirmed": status.leader_confirmed,
        "corrupt_records": status.corrupt_records,
        "disk_full": status.disk_full,
        "transport": status.transport or "plaintext",
        "authorization": status.authorization or "off",
        "admin": status.admin or "anywhere",
        "insecure": status.insecure,
        "peer_trust": status.peer_trust,
        "storage_fault": status.storage_fault,
        "storage_condition": status.storage_condition,
    }


__all__ = ["StatusDict", "status_name", "status_to_dict"]
