"""The read index's rules (rlog.protocol.read_index), one test per rule: no processes."""

from __future__ import annotations

from rlog.protocol.read_index import Confirmed, Gather, ReadIndex, StartRound


def test_a_read_starts_a_round_at_the_leaders_proposal():
    r = ReadIndex(0, 3)
    r.request("a", 7)
    assert r.take() == [StartRound(1, 7)]


def test_a_quorum_of_answers_confirms_the_reads_of_the_round():
    r = ReadIndex(0, 5)
    r.request("a", 7)
    r.take()
    r.on_answer(1, 1, 7)
    assert r.take() == []  # 2 of 5 with the leader
    r.on_answer(1, 2, 3)  # a lower promise still follows us
    assert r.take() == [Confirmed(("a",), 7)]
    assert r.waiting == 0


def test_an_answer_with_a_higher_promise_does_not_count():
    r = ReadIndex(0, 3)
    r.request("a", 7)
    r.take()
    r.on_answer(1, 1, 8)
    assert r.take() == []


def test_answers_count_once_per_peer_and_only_for_the_round_in_flight():
    r = ReadIndex(0, 5)
    r.request("a", 7)
    r.take()
    r.on_answer(1, 1, 7)
    r.on_answer(1, 1, 7)
    r.on_answer(2, 2, 7)  # no such round
    assert r.take() == []


def test_reads_arriving_during_a_round_wait_for_the_next_one():
    r = ReadIndex(0, 3)
    r.request("a", 7)
    r.request("b", 7)  # the heartbeats in flight may have left before "b" arrived
    assert r.take() == [StartRound(1, 7)]
    r.on_answer(1, 1, 7)
    assert r.take() == [Confirmed(("a",), 7), Gather(2)]
    r.send_due(2)
    assert r.take() == [StartRound(2, 7)]
    r.on_answer(1, 2, 7)  # late answer to the old round
    assert r.take() == []
    r.on_answer(2, 2, 7)
    assert r.take() == [Confirmed(("b",), 7)]


def test_concurrent_reads_share_the_next_round():
    r = ReadIndex(0, 3)
    r.request("a", 7)
    for token in "bcd":
        r.request(token, 7)
    r.on_answer(1, 1, 7)
    r.send_due(2)
    r.on_answer(2, 2, 7)
    assert r.take() == [
        StartRound(1, 7),
        Confirmed(("a",), 7),
        Gather(2),
        StartRound(2, 7),
        Confirmed(tuple("bcd"), 7),
    ]


def test_reads_arriving_while_the_next_round_gathers_join_it():
    r = ReadIndex(0, 3)
    r.request("a", 7)
    r.request("b", 7)
    r.on_answer(1, 1, 7)
    r.take()
    r.request("c", 7)  # the round has not left: it counts for "c" too
    r.on_answer(2, 1, 7)  # nothing was sent: no answer can confirm it yet
    r.on_timeout(2)  # nor time it out
    assert r.take() == []
    r.send_due(2)
    r.request("d", 7)  # too late for round 2
    r.on_answer(2, 1, 7)
    assert r.take() == [StartRound(2, 7), Confirmed(("b", "c"), 7), Gather(3)]


def test_a_gathered_round_whose_reads_all_gave_up_is_not_sent():
    r = ReadIndex(0, 3)
    r.request("a", 7)
    r.request("b", 7)
    r.on_answer(1, 1, 7)
    r.cancel("b")
    r.take()
    r.send_due(2)
    assert r.take() == []
    assert r.round == 0
    r.request("c", 7)  # a read now starts a round at once
    assert r.take() == [StartRound(3, 7)]


def test_a_round_that_times_out_is_sent_again_for_every_waiting_read():
    r = ReadIndex(0, 3)
    r.request("a", 7)
    r.request("b", 7)
    r.take()
    r.on_timeout(1)
    assert r.take() == [StartRound(2, 7)]
    r.on_answer(1, 1, 7)  # an answer to the abandoned round
    assert r.take() == []
    r.on_answer(2, 1, 7)
    assert r.take() == [Confirmed(("a", "b"), 7)]


def test_a_stale_timeout_or_one_with_no_reads_does_nothing():
    r = ReadIndex(0, 3)
    r.request("a", 7)
    r.cancel("a")
    r.on_timeout(5)
    r.take()
    r.on_timeout(1)
    assert r.take() == []
    assert r.round == 0


def test_a_cancelled_read_is_not_confirmed():
    r = ReadIndex(0, 3)
    r.request("a", 7)
    r.request("b", 7)
    r.cancel("b")
    r.on_answer(1, 1, 7)
    assert r.take() == [StartRound(1, 7), Confirmed(("a",), 7)]


def test_losing_leadership_forgets_every_read():
    r = ReadIndex(0, 3)
    r.request("a", 7)
    r.request("b", 7)
    assert r.cancel_all() == ["a", "b"]
    r.on_answer(1, 1, 7)
    assert r.take() == [StartRound(1, 7)]
    assert r.round == 0


def test_a_single_replica_confirms_at_once():
    r = ReadIndex(0, 1)
    r.request("a", 7)
    assert r.take() == [StartRound(1, 7), Confirmed(("a",), 7)]
