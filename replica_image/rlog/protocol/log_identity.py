"""Whose message is this: the log id every peer message carries, checked by its receiver.

Every message of the peer protocol (`Promise`, `Write`, each `WriteStream` request,
`Learned`, `Recover`, `Fetch`, and a lane's hello and frames) carries the sender's log id
(`--log-id`). A replica takes part only in its own log: a message of another log (a peer
address reused by another log, a replica of log B whose `--peers` still names a replica of
log A) is refused before any rule sees it, so it changes nothing (no promise, no write, no
leader heard, no entry served to be copied into the other log).

The contract (`refusal`): a message belongs to this replica's log iff its log id EQUALS the
replica's configured log id, the empty id included. The configured id is what counts, not
the data dir's stamp: a replica whose data dir is not yet stamped (fresh, or still
EMPTY/STARTING) knows its log from `--log-id` all the same, and a data dir stamped for
another log never serves (runtime/repair.py refuses it at start). A log started without
`--log-id` has the empty id, and its replicas take only messages that carry none: two such
logs are indistinguishable, which is why every log should have an id (the operator and
`rlog dev` always give one).

The alternative rejected: "an empty log id is not checked" (what the lane's hello did).
Any sender that omits the id (an older build's Fetch, which carried none; a hand-made
call) would then reach every log unseen, and a message that changes a log's promises or
entries must never be accepted on the strength of saying nothing. The cost: during a
rolling upgrade from a build whose Fetch had no log id, a not-yet-upgraded replica's
copies from upgraded ones are refused until it is upgraded too (it copies from its other
peers meanwhile; its votes and writes carried the id already).
"""

from __future__ import annotations


def refusal(own: str, sent: str) -> str:
    """Why a message carrying log id `sent` is refused by a replica of log `own` ("": it is
    this log's message)."""
    if sent == own:
        return ""
    if not sent:
        return f"the message carries no log id; this replica belongs to log {own!r}"
    if not own:
        return f"the message is of log {sent!r}; this replica belongs to a log without id"
    return f"the message is of log {sent!r}; this replica belongs to log {own!r}"
