"""How the client sends an append (`rlog.client.carrier`), on hand-built facts: its route
(in a group, alone in a session sequence, or once without a session) and each try's carrier
(the stream, the lane, or a unary call); and whether a client appends on lanes at all."""

from __future__ import annotations

import itertools

import pytest

from rlog.client.carrier import (
    AppendFacts,
    Carrier,
    CarrierFacts,
    Route,
    choose_carrier,
    choose_route,
    lane_wanted,
)


def facts(
    exactly_once: bool = True, if_next: bool = False, epoch: bool = False, session: bool = False
) -> AppendFacts:
    return AppendFacts(exactly_once, if_next, epoch, session)


# ---- the route, once per append ------------------------------------------------------------


@pytest.mark.parametrize("session", [False, True])
def test_an_append_without_conditions_travels_in_a_group(session):
    choice = choose_route(facts(session=session))
    assert choice.route is Route.GROUP
    assert "group" in choice.why


@pytest.mark.parametrize("session", [False, True])
def test_an_epoch_append_has_a_sequence_of_its_own_and_may_open_a_session(session):
    choice = choose_route(facts(epoch=True, session=session))
    assert (choice.route, choice.renew) == (Route.SESSION, True)


@pytest.mark.parametrize("epoch", [False, True])
def test_an_if_next_append_uses_the_open_session_as_it_is(epoch):
    choice = choose_route(facts(if_next=True, epoch=epoch, session=True))
    assert (choice.route, choice.renew) == (Route.SESSION, False)


@pytest.mark.parametrize("epoch", [False, True])
def test_an_if_next_append_opens_no_session(epoch):
    choice = choose_route(facts(if_next=True, epoch=epoch, session=False))
    assert choice.route is Route.ONCE
    assert "move the next position" in choice.why


@pytest.mark.parametrize(
    ("if_next", "epoch", "session"), list(itertools.product([False, True], repeat=3))
)
def test_without_exactly_once_every_append_is_sent_once(if_next, epoch, session):
    choice = choose_route(facts(False, if_next, epoch, session))
    assert choice.route is Route.ONCE
    assert "exactly_once=False" in choice.why


# ---- the carrier, once per try -------------------------------------------------------------


def test_a_stream_client_sends_every_try_on_the_stream():
    choice = choose_carrier(CarrierFacts(stream=True, lane=False, lane_open=False))
    assert choice.carrier is Carrier.STREAM
    assert "stream=True" in choice.why


def test_a_lane_client_sends_on_the_open_lane():
    choice = choose_carrier(CarrierFacts(stream=False, lane=True, lane_open=True))
    assert choice.carrier is Carrier.LANE


def test_a_lane_client_sends_unary_calls_until_the_lane_is_open():
    choice = choose_carrier(CarrierFacts(stream=False, lane=True, lane_open=False))
    assert choice.carrier is Carrier.UNARY
    assert "not open" in choice.why


def test_a_client_with_neither_sends_unary_calls():
    choice = choose_carrier(CarrierFacts(stream=False, lane=False, lane_open=False))
    assert choice.carrier is Carrier.UNARY
    assert "neither" in choice.why
    assert "lane=False" in choice.why


# ---- whether a client appends on lanes, once per client --------------------------------------


def test_the_lane_is_on_by_default():
    assert lane_wanted(None, stream=False, token=False)


def test_by_default_a_stream_or_a_token_keeps_to_grpc():
    assert not lane_wanted(None, stream=True, token=False)
    assert not lane_wanted(None, stream=False, token=True)


def test_lane_false_turns_it_off():
    assert not lane_wanted(False, stream=False, token=False)
    assert not lane_wanted(False, stream=True, token=True)


def test_asking_for_the_lane_beside_a_stream_or_a_token_is_an_error():
    with pytest.raises(ValueError, match="lane or stream"):
        lane_wanted(True, stream=True, token=False)
    with pytest.raises(ValueError, match="authenticates by client certificate"):
        lane_wanted(True, stream=False, token=True)
    assert lane_wanted(True, stream=False, token=False)
