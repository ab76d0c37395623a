"""Which build sent this peer message: the peer protocol version, and what a replica does
with a peer of another build.

Every request of the peer protocol (`Promise`, `Write`, each `WriteStream` request and lane
write, `Learned`, `Recover`, `Fetch`) and the answer to `Learned` (a leader's heartbeat,
the read index's question) carries `protocol`, the sender's peer protocol version
(`PROTOCOL`). A build from before versions sends none, which decodes as 0.

The contract, in two rules:
- `refusal(stated, minimum)`: a replica serves a request whose version is at least its
  minimum (`MINIMUM` unless `--min-peer-protocol` raises it), newer versions included: a
  newer build keeps the meaning of every field an older one reads (a change that does not
  must raise the minimum of the builds that follow, so the older ones are refused rather
  than misread). A request below the minimum is refused before any rule sees it (reason
  PROTOCOL_TOO_OLD), so it changes nothing.
- `counts_for_read_index(stated)`: an answer to a leader's read-index heartbeat is an
  acknowledgement only if its sender states a version of at least `READ_INDEX_ANSWER`. An
  older build may answer `Empty`, which decodes as `promised = 0` and would otherwise pass
  for "I follow you" whatever that replica promised since: the leader treats such an answer
  as no answer (it still counts as a sign of life for the check-quorum, which asks no
  more). The cost: in a log mixing builds, linearizable reads need a quorum of replicas of
  this build or newer (the leader included); a rolling upgrade that keeps a majority up
  meets it once half the replicas are upgraded.

Versions: 0 = a build from before versions; 1 = the first build that states it (its
`LearnedResponse.promised` is its promise).
"""

from __future__ import annotations

PROTOCOL = 1  # the peer protocol version this build speaks
READ_INDEX_ANSWER = 1  # the first version whose answer to a heartbeat states its promise
MINIMUM = 0  # the oldest version served by default: builds from before versions too


def refusal(stated: int, minimum: int) -> str:
    """Why a peer request stating protocol version `stated` is refused by a replica that
    serves versions `minimum` and up ("": it is served)."""
    if stated >= minimum:
        return ""
    sent = (
        "no protocol version (a build from before versions)"
        if not stated
        else (f"protocol version {stated}")
    )
    return (
        f"the message carries {sent}; this replica (protocol version {PROTOCOL}) serves "
        f"peers of version {minimum} and up: upgrade the sender"
    )


def counts_for_read_index(stated: int) -> bool:
    """Whether an answer to a read-index heartbeat from a peer stating protocol version
    `stated` may count as that peer following the leader."""
    return stated >= READ_INDEX_ANSWER
