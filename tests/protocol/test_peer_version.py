"""The peer protocol version's rules (rlog.protocol.peer_version): no processes."""

from __future__ import annotations

from rlog.proto import rlog_pb2 as pb
from rlog.protocol.peer_version import (
    MINIMUM,
    PROTOCOL,
    READ_INDEX_ANSWER,
    counts_for_read_index,
    refusal,
)


def test_an_older_builds_answer_to_the_read_index_is_no_acknowledgement():
    # An older build answers a heartbeat Empty: it decodes as promised = 0, protocol = 0.
    old = pb.LearnedResponse.FromString(pb.Empty().SerializeToString())
    assert (old.promised, old.protocol) == (0, 0)
    assert not counts_for_read_index(old.protocol)
    assert not counts_for_read_index(READ_INDEX_ANSWER - 1)


def test_an_answer_of_this_build_or_a_newer_one_counts():
    assert counts_for_read_index(PROTOCOL)
    assert counts_for_read_index(READ_INDEX_ANSWER)
    assert counts_for_read_index(PROTOCOL + 5)


def test_by_default_every_build_is_served():
    assert MINIMUM == 0
    assert refusal(0, MINIMUM) == ""
    assert refusal(PROTOCOL, MINIMUM) == ""


def test_a_newer_unknown_version_is_served():
    assert refusal(PROTOCOL + 1, PROTOCOL) == ""
    assert refusal(PROTOCOL + 100, MINIMUM) == ""


def test_a_version_below_the_minimum_is_refused_with_a_reason():
    why = refusal(0, 1)
    assert "no protocol version" in why and "version 1 and up" in why
    why = refusal(1, 2)
    assert "protocol version 1;" in why and "version 2 and up" in why
    assert refusal(2, 2) == ""


def test_this_build_states_its_version_on_every_peer_request_and_its_heartbeat_answer():
    # Each request of the peer protocol and the heartbeat's answer have the field.
    for message in (
        pb.PromiseRequest,
        pb.WriteRequest,
        pb.LearnedRequest,
        pb.RecoverRequest,
        pb.FetchRequest,
        pb.LearnedResponse,
    ):
        assert "protocol" in message.DESCRIPTOR.fields_by_name, message
    assert PROTOCOL >= READ_INDEX_ANSWER
