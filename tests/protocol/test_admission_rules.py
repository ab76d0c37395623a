"""Admission rules (rlog.protocol.admission): conditions, epochs and sessions on the pure
state, and through the coordinator that decides them when it assigns positions."""

from __future__ import annotations

import pytest

from rlog.proto import rlog_pb2 as pb
from rlog.protocol.admission import (
    AdmissionState,
    Admit,
    Conditions,
    Duplicate,
    Refusal,
    Refuse,
    session_check,
)
from rlog.protocol.coordinator import (
    Coordinator,
    CoordinatorConfig,
    Done,
    Leading,
    Refused,
    Send,
)
from rlog.protocol.replica import ReplicaCore
from rlog.runtime import admission
from rlog.storage.memory import MemoryStorage

SECRET = b"s" * 16  # every session's secret here (the session-owner tests use others)
CHECK = session_check(SECRET)


def entry(position: int, kind: int = pb.APPEND, **fields: int) -> pb.Action:
    """An entry; a SESSION entry with the check of SECRET."""
    action = pb.Action(position=position, type=kind, **fields)  # type: ignore[arg-type]
    if kind == pb.SESSION:
        action.session_check = CHECK
    return action


def refusal(verdict: object) -> Refusal:
    assert isinstance(verdict, Refuse), verdict
    return verdict.reason


def test_if_next_admits_only_the_next_position():
    state = AdmissionState(100, next_position=5)
    assert state.admit(Conditions(if_next=5)) == Admit()
    failed = state.admit(Conditions(if_next=4))
    assert refusal(failed) == Refusal.CONDITION_FAILED
    assert isinstance(failed, Refuse) and failed.next_position == 5
    assert refusal(state.admit(Conditions(if_next=6))) == Refusal.CONDITION_FAILED


def test_if_next_below_the_beginning_is_truncated():
    state = AdmissionState(100, next_position=5)
    state.apply(entry(5, pb.TRUNCATE, truncate_to=4, epoch=0))
    verdict = state.admit(Conditions(if_next=3))
    assert refusal(verdict) == Refusal.TRUNCATED
    assert isinstance(verdict, Refuse) and verdict.begin == 4
    assert state.admit(Conditions(if_next=6)) == Admit()


def test_a_later_epoch_fences_every_earlier_one():
    state = AdmissionState(100, next_position=1)
    assert refusal(state.admit(Conditions(epoch=1))) == Refusal.EPOCH_FROM_FUTURE
    state.apply(entry(1, pb.EPOCH, epoch=1))
    assert state.admit(Conditions(epoch=1)) == Admit()
    state.apply(entry(2, pb.EPOCH, epoch=2))
    failed = state.admit(Conditions(epoch=1))
    assert refusal(failed) == Refusal.CONDITION_FAILED
    assert isinstance(failed, Refuse) and failed.epoch == 2
    assert state.admit(Conditions(epoch=2)) == Admit()
    assert refusal(state.admit(Conditions(epoch=3))) == Refusal.EPOCH_FROM_FUTURE
    # Both conditions must hold.
    assert refusal(state.admit(Conditions(epoch=2, if_next=1))) == Refusal.CONDITION_FAILED
    assert state.admit(Conditions(epoch=2, if_next=3)) == Admit()


def test_a_session_retry_gets_the_original_positions_even_if_its_condition_moved_on():
    state = AdmissionState(100, next_position=10)
    state.apply(entry(10, pb.SESSION))
    first = Conditions(secret=SECRET, session=10, sequence=1, if_next=11)
    assert state.admit(first) == Admit()
    state.apply(entry(11, session=10, sequence=1))
    state.apply(entry(12, session=10, sequence=1))
    assert state.admit(first) == Duplicate([11, 12])
    assert state.admit(Conditions(secret=SECRET, session=10, sequence=2)) == Admit()


def test_session_errors():
    state = AdmissionState(10, next_position=1)
    state.apply(entry(1, pb.SESSION))
    state.apply(entry(2))
    assert (
        refusal(state.admit(Conditions(secret=SECRET, session=2, sequence=1)))
        == Refusal.UNKNOWN_SESSION
    )
    assert (
        refusal(state.admit(Conditions(secret=SECRET, session=50, sequence=1)))
        == Refusal.UNKNOWN_SESSION
    )
    assert (
        refusal(state.admit(Conditions(secret=SECRET, session=1, sequence=0)))
        == Refusal.INVALID_ARGUMENT
    )
    bad = Conditions(secret=SECRET, session=1, sequence=2, acked_below=3)
    assert refusal(state.admit(bad)) == Refusal.INVALID_ARGUMENT
    # Out of order is fine (concurrent appends of one client); acknowledged ones are gone.
    state.apply(entry(3, session=1, sequence=2))
    assert state.admit(Conditions(secret=SECRET, session=1, sequence=1)) == Admit()
    state.acknowledge(1, 3)
    assert (
        refusal(state.admit(Conditions(secret=SECRET, session=1, sequence=2)))
        == Refusal.SEQUENCE_FORGOTTEN
    )
    assert state.admit(Conditions(secret=SECRET, session=1, sequence=3)) == Admit()


def test_a_session_expires_after_the_window_and_never_becomes_unknown():
    state = AdmissionState(10, next_position=1)
    state.apply(entry(1, pb.SESSION))
    state.apply(entry(2, session=1, sequence=1))
    for position in range(3, 11):
        state.apply(entry(position))
    assert state.admit(Conditions(secret=SECRET, session=1, sequence=1)) == Duplicate([2])
    state.apply(entry(11))  # next position 12: sessions below 2 have expired
    assert (
        refusal(state.admit(Conditions(secret=SECRET, session=1, sequence=1)))
        == Refusal.SESSION_EXPIRED
    )
    assert (
        refusal(state.admit(Conditions(secret=SECRET, session=1, sequence=9)))
        == Refusal.SESSION_EXPIRED
    )
    assert not state.sessions


def test_truncation_ends_the_sessions_it_removes_and_keeps_the_epoch():
    state = AdmissionState(1000, next_position=1)
    state.apply(entry(1, pb.SESSION))
    state.apply(entry(2, pb.EPOCH, epoch=1))
    state.apply(entry(3, pb.SESSION, epoch=1))
    state.apply(entry(4, pb.TRUNCATE, truncate_to=3, epoch=1))
    assert (
        refusal(state.admit(Conditions(secret=SECRET, session=1, sequence=1)))
        == Refusal.SESSION_EXPIRED
    )
    assert state.admit(Conditions(secret=SECRET, session=3, sequence=1, epoch=1)) == Admit()
    # A state rebuilt from what the truncation left (positions 3, 4) agrees.
    rebuilt = AdmissionState(1000, next_position=3, begin=3)
    rebuilt.apply_all(
        [entry(3, pb.SESSION, epoch=1), entry(4, pb.TRUNCATE, truncate_to=3, epoch=1)]
    )
    assert rebuilt.epoch == state.epoch == 1
    assert list(rebuilt.sessions) == list(state.sessions) == [3]


def test_a_refused_append_changes_nothing():
    state = AdmissionState(100, next_position=1)
    state.apply(entry(1, pb.SESSION))
    before = (state.next_position, state.epoch, dict(state.sessions[1].answers))
    for conditions in (
        Conditions(if_next=7),
        Conditions(epoch=4),
        Conditions(secret=SECRET, session=9, sequence=1),
        Conditions(secret=SECRET, session=1, sequence=0),
    ):
        assert isinstance(state.admit(conditions), Refuse)
    assert (state.next_position, state.epoch, dict(state.sessions[1].answers)) == before


def test_a_session_append_without_its_secret_is_refused_before_its_duplicate():
    """The intruder: (session, n) sent without the session's secret is refused, whether n
    is new or already answered, and changes nothing: not the answers (the owner's own n
    must still be admitted), not the forgotten ones (`acked_below` is not applied)."""
    state = AdmissionState(100, next_position=1)
    state.apply(entry(1, pb.SESSION))
    state.apply(entry(2, session=1, sequence=1))
    before = (state.next_position, dict(state.sessions[1].answers))
    for secret, why in ((b"", "carries no session secret"), (b"x" * 16, "has the wrong secret")):
        for sequence in (1, 2):
            verdict = state.admit(Conditions(secret=secret, session=1, sequence=sequence))
            assert refusal(verdict) == Refusal.SESSION_NOT_YOURS
            assert isinstance(verdict, Refuse) and why in verdict.message
    assert (state.next_position, dict(state.sessions[1].answers)) == before
    assert state.admit(Conditions(secret=SECRET, session=1, sequence=1)) == Duplicate([2])
    assert state.admit(Conditions(secret=SECRET, session=1, sequence=2)) == Admit()


def test_a_session_opened_before_secrets_takes_no_append():
    state = AdmissionState(100, next_position=1)
    state.apply(pb.Action(position=1, type=pb.SESSION))  # no session_check: an old entry
    for secret in (b"", SECRET):
        verdict = state.admit(Conditions(secret=secret, session=1, sequence=1))
        assert refusal(verdict) == Refusal.SESSION_NOT_YOURS
        assert isinstance(verdict, Refuse) and "without a secret" in verdict.message


def test_a_session_secret_is_in_the_state_rebuilt_from_the_log():
    """Any replica that applies the SESSION entry (a new leader, one restarted or caught
    up) checks the secret the same way; a copy (a leader's snapshot) keeps it."""
    entries = [entry(1, pb.SESSION), entry(2, session=1, sequence=1)]
    rebuilt = AdmissionState(100, next_position=1)
    rebuilt.apply_all(entries)
    for state in (rebuilt, rebuilt.clone()):
        assert state.admit(Conditions(secret=SECRET, session=1, sequence=1)) == Duplicate([2])
        wrong = state.admit(Conditions(secret=b"y" * 16, session=1, sequence=1))
        assert refusal(wrong) == Refusal.SESSION_NOT_YOURS


# ---- through the coordinator ---------------------------------------------------------------


def leading_coordinator(
    config: CoordinatorConfig | None = None,
) -> tuple[Coordinator, list[ReplicaCore]]:
    """A single-replica log's coordinator, leading, with an empty admission state."""
    storage = MemoryStorage()
    core = ReplicaCore(storage)
    storage.apply(core.set_status(pb.VOTING))
    coordinator = Coordinator(0, 1, core, config or CoordinatorConfig())
    coordinator.elect()
    run(coordinator, core)
    assert coordinator.leading
    return coordinator, [core]


def run(coordinator: Coordinator, core: ReplicaCore, ready: bool = True) -> list[object]:
    """Deliver every message to the one replica until quiet; the non-message outputs.
    `ready`: hand the coordinator an (empty) admission state when it leads."""
    results: list[object] = []
    while True:
        outputs = coordinator.take()
        if not outputs:
            return results
        for output in outputs:
            if isinstance(output, Send):
                message = output.message
                if isinstance(message, pb.PromiseRequest):
                    reply = core.on_promise(message)
                elif isinstance(message, pb.WriteRequest):
                    reply = core.on_write(message)
                else:
                    batch = core.on_learned(message)
                    if batch is not None:
                        core.storage.apply(batch)
                        core.persisted(batch)
                    continue
                if reply.persist is not None:
                    core.storage.apply(reply.persist)
                    core.persisted(reply.persist)
                assert isinstance(reply.response, pb.PromiseResponse | pb.WriteResponse)
                coordinator.on_reply(output.round, output.to, reply.response)
            elif isinstance(output, Leading) and ready:
                coordinator.admission_ready(
                    output.proposal, AdmissionState(100, output.next_position)
                )
                results.append(output)
            else:
                results.append(output)


def test_appends_wait_for_the_admission_state():
    storage = MemoryStorage()
    core = ReplicaCore(storage)
    storage.apply(core.set_status(pb.VOTING))
    coordinator = Coordinator(0, 1, core, CoordinatorConfig())
    coordinator.elect()
    run(coordinator, core, ready=False)
    assert coordinator.leading
    coordinator.propose("a", [pb.Action(type=pb.APPEND, value=b"a")])
    coordinator.pump()
    assert run(coordinator, core) == []  # nothing assigned, nothing sent
    assert coordinator.admission_ready(coordinator.proposal, AdmissionState(100, 1))
    (done,) = [o for o in run(coordinator, core) if isinstance(o, Done)]
    assert done.positions == [1]


def test_the_coordinator_refuses_dedupes_and_fences_in_position_order():
    coordinator, (core,) = leading_coordinator()
    coordinator.propose("epoch", [pb.Action(type=pb.EPOCH)])
    coordinator.propose("session", [pb.Action(type=pb.SESSION, session_check=CHECK)])
    coordinator.pump()
    done = {o.token: o for o in run(coordinator, core) if isinstance(o, Done)}
    assert done["epoch"].epoch == 1
    (session,) = done["session"].positions
    values = [pb.Action(type=pb.APPEND, value=b"x"), pb.Action(type=pb.APPEND, value=b"y")]
    first = Conditions(secret=SECRET, session=session, sequence=1, epoch=1)
    coordinator.propose("a1", values, first)
    coordinator.propose("a1-retry", values, first)  # queued together: waits for the original
    coordinator.propose("fenced", values, Conditions(epoch=1, if_next=session + 1))
    coordinator.pump()
    outputs = run(coordinator, core)
    done = {o.token: o for o in outputs if isinstance(o, Done)}
    refused = {o.token: o for o in outputs if isinstance(o, Refused)}
    assert done["a1"].positions == done["a1-retry"].positions == [session + 1, session + 2]
    assert refused["fenced"].refusal.reason == Refusal.CONDITION_FAILED
    assert refused["fenced"].refusal.next_position == session + 3
    # A retry after the original was chosen is answered at once, nothing written.
    end = core.end
    coordinator.propose("a1-late", values, first)
    coordinator.pump()
    (late,) = run(coordinator, core)
    assert isinstance(late, Done) and late.positions == done["a1"].positions
    assert core.end == end
    # Every entry states the epoch; the session append carries its session and sequence.
    stored = core.get(session + 1)
    assert stored is not None
    assert (stored.epoch, stored.session, stored.sequence) == (1, session, 1)


def test_the_test_only_no_dedupe_switch_appends_a_retry_again():
    """RLOG_UNSAFE_NO_DEDUPE=1 (the consistency suite's proof that it catches duplicates):
    a retry of an answered session append is appended a second time."""
    coordinator, (core,) = leading_coordinator(CoordinatorConfig(no_dedupe=True))
    coordinator.propose("session", [pb.Action(type=pb.SESSION, session_check=CHECK)])
    coordinator.pump()
    (session,) = next(o for o in run(coordinator, core) if isinstance(o, Done)).positions
    first = Conditions(secret=SECRET, session=session, sequence=1)
    coordinator.propose("a1", [pb.Action(type=pb.APPEND, value=b"x")], first)
    coordinator.pump()
    (original,) = [o for o in run(coordinator, core) if isinstance(o, Done)]
    coordinator.propose("a1-retry", [pb.Action(type=pb.APPEND, value=b"x")], first)
    coordinator.pump()
    (retry,) = [o for o in run(coordinator, core) if isinstance(o, Done)]
    assert original.positions == [session + 1] and retry.positions == [session + 2]


@pytest.mark.parametrize("window", [1, 3, 1000])
async def test_a_rebuilt_state_answers_like_the_incremental_one(window):
    """Whatever the window, the state a new leader rebuilds from its learned entries
    (runtime/admission.py) gives the same verdicts as the state that applied the whole log,
    the epoch included when the window holds only NOPs."""
    entries = [entry(0, pb.NOP), entry(1, pb.SESSION), entry(2, pb.EPOCH, epoch=1)]
    entries += [entry(3, session=1, sequence=1, epoch=1), entry(4, pb.NOP)]
    entries += [entry(5, pb.SESSION, epoch=1), entry(6, session=5, sequence=2, epoch=1)]
    entries += [entry(7, session=1, sequence=2, epoch=1), entry(8, pb.NOP), entry(9, pb.NOP)]
    whole = AdmissionState(window, next_position=0)
    whole.apply_all(entries)
    storage = MemoryStorage()
    core = ReplicaCore(storage)
    storage.apply(core.set_status(pb.VOTING))
    learned = [pb.Action(learned=True, performed=1, **_fields(e)) for e in entries]
    batch = core.on_learned(pb.LearnedRequest(actions=learned))
    assert batch is not None
    storage.apply(batch)
    core.persisted(batch)
    rebuilt, _ = await admission.rebuild(core, 9, window)
    assert (rebuilt.next_position, rebuilt.epoch) == (whole.next_position, whole.epoch) == (10, 1)
    for session in (1, 5, 9):
        for sequence in (1, 2, 3):
            c = Conditions(secret=SECRET, session=session, sequence=sequence, epoch=1)
            assert whole.admit(c) == rebuilt.admit(c), (session, sequence)


def _fields(action: pb.Action) -> dict[str, object]:
    return {f.name: v for f, v in action.ListFields()}


async def test_the_tracker_follows_the_learned_prefix_and_skips_truncated_positions():
    """The state a replica keeps as it learns (load, then catch_up) is the state of the whole
    log, also when a truncation removed positions it had not applied yet."""
    storage = MemoryStorage()
    core = ReplicaCore(storage)
    storage.apply(core.set_status(pb.VOTING))

    def learn(entries: list[pb.Action]) -> None:
        learned = [pb.Action(learned=True, performed=1, **_fields(e)) for e in entries]
        batch = core.on_learned(pb.LearnedRequest(actions=learned))
        assert batch is not None
        storage.apply(batch)
        core.persisted(batch)

    first = [entry(0, pb.NOP), entry(1, pb.SESSION), entry(2, pb.EPOCH, epoch=1)]
    first += [entry(3, session=1, sequence=1, epoch=1)]
    learn(first)
    tracker = admission.AdmissionTracker(core, 1000)
    await tracker.load()
    second = [entry(4, pb.SESSION, epoch=1), entry(5, session=4, sequence=1, epoch=1)]
    second += [entry(6, session=1, sequence=2, epoch=1)]
    learn(second)
    assert tracker.catch_up(limit=2) == 1
    assert tracker.catch_up() == 0
    whole = AdmissionState(1000, next_position=0)
    whole.apply_all(first + second)
    state = tracker.snapshot(6)
    for session, sequence in [(1, 1), (1, 2), (4, 1), (4, 2), (1, 3)]:
        c = Conditions(secret=SECRET, session=session, sequence=sequence, epoch=1)
        assert state.admit(c) == whole.admit(c)
    # Learned in one go, past the tracker: a truncation to 9 and what follows it.
    third = [entry(7, pb.SESSION, epoch=1), entry(8, pb.EPOCH, epoch=2)]
    third += [entry(9, pb.TRUNCATE, truncate_to=9, epoch=2), entry(10, pb.SESSION, epoch=2)]
    learn(third)
    assert core.begin == 9
    tracker.catch_up()
    whole.apply_all(third)
    state = tracker.snapshot(10)
    assert (state.epoch, state.begin, list(state.sessions)) == (whole.epoch, 9, [10])
    for session in (1, 4, 7, 10, 11):
        c = Conditions(secret=SECRET, session=session, sequence=1)
        assert state.admit(c) == whole.admit(c), session


def test_the_coordinator_refuses_an_intruder_and_keeps_the_owners_sequence():
    """Through the leader's coordinator: an intruder's (session, 1..2) without the secret
    is refused and nothing is written; the owner's own (session, 1..2) are then appended,
    not answered as duplicates."""
    coordinator, (core,) = leading_coordinator()
    coordinator.propose("session", [pb.Action(type=pb.SESSION, session_check=CHECK)])
    coordinator.pump()
    (opened,) = [o for o in run(coordinator, core) if isinstance(o, Done)]
    (session,) = opened.positions
    end = core.end
    for sequence in (1, 2):
        conditions = Conditions(secret=b"i" * 16, session=session, sequence=sequence)
        coordinator.propose(
            ("intruder", sequence), [pb.Action(type=pb.APPEND, value=b"i")], conditions
        )
    coordinator.pump()
    outputs = run(coordinator, core)
    assert all(isinstance(o, Refused) for o in outputs) and len(outputs) == 2
    assert {o.refusal.reason for o in outputs if isinstance(o, Refused)} == {
        Refusal.SESSION_NOT_YOURS
    }
    assert core.end == end
    for sequence in (1, 2):
        conditions = Conditions(secret=SECRET, session=session, sequence=sequence)
        coordinator.propose(
            ("owner", sequence), [pb.Action(type=pb.APPEND, value=b"o")], conditions
        )
    coordinator.pump()
    done = {o.token: o for o in run(coordinator, core) if isinstance(o, Done)}
    assert done[("owner", 1)].positions == [session + 1]
    assert done[("owner", 2)].positions == [session + 2]
    stored = core.get(session + 1)
    assert stored is not None and stored.value == b"o"
