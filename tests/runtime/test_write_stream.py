"""The write stream's request ids and piggybacked learned ranges: appended to a WriteRequest's
encoding, they decode as the `id` and `learned` fields of the same request (the leader
encodes a broadcast once and never copies it)."""

from __future__ import annotations

import pytest

from rlog.proto import rlog_pb2 as pb
from rlog.runtime.write_stream import learned_field, with_id


@pytest.mark.parametrize("request_id", [1, 127, 128, 300, 2**32 + 5, 2**64 - 1])
def test_an_id_appended_to_the_encoding_decodes_as_the_requests_id(request_id):
    request = pb.WriteRequest(
        proposal=7,
        leader=2,
        log_id="log",
        actions=[pb.Action(position=p, type=pb.APPEND, value=b"v" * p) for p in range(1, 5)],
        learned=pb.LearnedRequest(proposal=7, ranges=[pb.PositionRange(first=1, last=3)]),
    )
    decoded = pb.WriteRequest.FromString(with_id(request.SerializeToString(), request_id))
    assert decoded.id == request_id
    decoded.ClearField("id")
    assert decoded == request


def test_the_encoding_is_that_of_the_request_with_its_id_set():
    request = pb.WriteRequest(proposal=3, actions=[pb.Action(position=1, value=b"x")])
    expected = pb.WriteRequest()
    expected.CopyFrom(request)
    expected.id = 99
    assert with_id(request.SerializeToString(), 99) == expected.SerializeToString()


@pytest.mark.parametrize("ranges", [1, 3, 40])
def test_learned_ranges_appended_to_the_encoding_decode_as_the_requests_learned(ranges):
    request = pb.WriteRequest(
        proposal=7,
        leader=2,
        log_id="log",
        runs=[pb.Run(first=10, data=b"x" * 1000, offsets=b"\0\0\0\0\xe8\x03\0\0")],
    )
    learned = pb.LearnedRequest(
        proposal=7,
        leader=2,
        log_id="log",
        ranges=[pb.PositionRange(first=3 * i + 1, last=3 * i + 2) for i in range(ranges)],
    )
    encoded = with_id(request.SerializeToString() + learned_field(learned), 5)
    decoded = pb.WriteRequest.FromString(encoded)
    expected = pb.WriteRequest()
    expected.CopyFrom(request)
    expected.learned.CopyFrom(learned)
    expected.id = 5
    assert decoded == expected
    assert not request.HasField("learned")  # the shared message is untouched
