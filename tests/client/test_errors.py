"""Mapping of gRPC statuses to rlog's typed errors."""

from __future__ import annotations

import grpc

from rlog.client.errors import EntryTooLarge, RlogError, error_for


def test_a_request_over_the_message_limit_is_the_callers_entry():
    error = error_for(
        grpc.StatusCode.RESOURCE_EXHAUSTED, "CLIENT: Sent message larger than max (9 vs. 8)"
    )
    assert isinstance(error, EntryTooLarge)


def test_a_response_over_the_message_limit_is_not_the_callers_entry():
    error = error_for(
        grpc.StatusCode.RESOURCE_EXHAUSTED, "SERVER: Sent message larger than max (9 vs. 8)"
    )
    assert isinstance(error, RlogError) and not isinstance(error, EntryTooLarge)
    assert "response too large" in str(error)
