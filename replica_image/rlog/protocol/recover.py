"""The recover protocol: how a replica that is not VOTING decides what to do next.

A round broadcasts RecoverRequest to every replica (itself included) and decides after each
reply, in this order (the Mesos log's rules; docs/recovery.md explains why they are safe):
1. a quorum of VOTING replies: RECOVERING, catch up [min begin, max end], and adopt the
   highest promise among them before turning VOTING (closes the Mesos hazard of a wiped
   replica voting with promised = 0 for a lower-numbered rival);
2. local EMPTY, initialization permitted, EMPTY + STARTING replies == every replica: STARTING;
3. local STARTING, initialization permitted, STARTING + VOTING replies == every replica: VOTING.
Otherwise the round ends undecided (the caller retries after a random 0.5-1 s) with a reason
that says what the replica waits for, so a stuck mix is visible rather than silent.

rlog uses the real replica count (1, 3, 5 or 7), never Mesos' 2q-1.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass

from rlog.proto import rlog_pb2 as pb


class Next(enum.Enum):
    RECOVER = "recover"  # catch up [begin, end], then VOTING
    STARTING = "starting"
    VOTING = "voting"


@dataclass
class Decision:
    next: Next
    begin: int = 0
    end: int = 0
    promised: int = 0
    sources: tuple[int, ...] = ()  # replicas that replied VOTING (catch-up sources)


class RecoverRound:
    def __init__(self, replicas: int, local_status: int, permit: bool, log_id: str = "") -> None:
        self.replicas = replicas
        self.quorum = replicas // 2 + 1
        self.local_status = local_status
        self.permit = permit
        self.log_id = log_id
        self.replies: dict[int, pb.RecoverResponse] = {}
        self.foreign: dict[int, str] = {}  # replicas that belong to another log
        # replicas that refuse this build's peer protocol (PROTOCOL_TOO_OLD): a newer build
        # with a higher --min-peer-protocol (protocol/peer_version.py)
        self.newer: dict[int, str] = {}

    def add(self, replica: int, response: pb.RecoverResponse) -> Decision | None:
        """Count one reply; return the decision as soon as one can be made."""
        if self.log_id and response.log_id and response.log_id != self.log_id:
            self.foreign[replica] = response.log_id
            return None
        self.replies.setdefault(replica, response)
        return self.decide()

    def counts(self) -> Counter[int]:
        return Counter(r.status for r in self.replies.values())

    def decide(self) -> Decision | None:
        counts = self.counts()
        voting = [i for i, r in self.replies.items() if r.status == pb.VOTING]
        if len(voting) >= self.quorum:
            replies = [self.replies[i] for i in voting]
            return Decision(
                Next.RECOVER,
                begin=min(r.begin for r in replies),
                end=max(r.end for r in replies),
                promised=max(r.promised for r in replies),
                sources=tuple(sorted(voting)),
            )
        if (
            self.local_status == pb.EMPTY
            and self.permit
            and counts[pb.EMPTY] + counts[pb.STARTING] == self.replicas
        ):
            return Decision(Next.STARTING)
        if (
            self.local_status == pb.STARTING
            and self.permit
            and counts[pb.STARTING] + counts[pb.VOTING] == self.replicas
        ):
            return Decision(Next.VOTING)
        return None

    def reason(self) -> str:
        """Why no decision was made: what this replica is waiting for."""
        counts = self.counts()
        heard = ", ".join(
            f"{counts[s]} {pb.Status.Name(s)}"
            for s in (pb.VOTING, pb.RECOVERING, pb.STARTING, pb.EMPTY)
            if counts[s]
        )
        missing = self.replicas - len(self.replies)
        parts = [f"heard {heard or 'nobody'}" + (f", {missing} unreachable" if missing else "")]
        if self.foreign:
            parts.append(
                "replicas "
                + ", ".join(str(i) for i in sorted(self.foreign))
                + " belong to another log"
            )
        if self.newer:
            parts.append(
                "replicas "
                + ", ".join(str(i) for i in sorted(self.newer))
                + " refuse this build's peer protocol (PROTOCOL_TOO_OLD): upgrade this replica"
            )
        voting = counts[pb.VOTING]
        if voting:
            parts.append(f"need {self.quorum} VOTING replicas to recover from, have {voting}")
            if counts[pb.STARTING] or counts[pb.EMPTY]:
                parts.append(
                    "a mix of VOTING and EMPTY/STARTING replicas with no VOTING quorum: "
                    "the log cannot initialize nor recover without the missing VOTING replicas"
                )
        elif not self.permit:
            parts.append(
                "no initialization permit: an all-EMPTY log is initialized only with a permit "
                "(--auto-initialize, the operator) or by `rlog initialize`"
            )
        elif missing:
            parts.append(f"auto-initialization needs all {self.replicas} replicas to answer")
        return "; ".join(parts)
