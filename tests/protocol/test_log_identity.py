"""The log id contract (protocol/log_identity.py): equal ids only, the empty one included."""

from __future__ import annotations

from rlog.protocol.log_identity import refusal


def test_a_message_of_this_log_is_taken() -> None:
    assert refusal("orders", "orders") == ""
    assert refusal("", "") == ""  # a log without id takes messages without id


def test_another_log_or_no_log_id_is_refused() -> None:
    assert "of log 'payments'; this replica belongs to log 'orders'" in refusal(
        "orders", "payments"
    )
    assert "carries no log id" in refusal("orders", "")
    assert "belongs to a log without id" in refusal("", "orders")
