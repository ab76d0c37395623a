"""The replica's rules over runs (docs/data-path.md, "The replica over runs"): a run is the
per-position actions `packed.expand` gives; the core and the memory engine hold it as one
record where they can, and every rule keeps its per-position meaning."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from replica_runs import apply, learn_range, run_of, write_run

from rlog.packed import expand, pack, run_last, values_of
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.admission import AdmissionState, Conditions, session_check
from rlog.protocol.coordinator import Coordinator, CoordinatorConfig, Done, Leading, Send
from rlog.protocol.records import span
from rlog.protocol.replica import ReplicaCore
from rlog.storage import WriteBatch
from rlog.storage.memory import MemoryStorage


def core() -> ReplicaCore:
    replica = ReplicaCore(MemoryStorage())
    apply(replica, replica.set_status(pb.VOTING))
    return replica


def values(n: int, tag: str = "v") -> list[bytes]:
    return [f"{tag}{i}".encode() for i in range(n)]


def stored_spans(replica: ReplicaCore) -> list[tuple[str, int, int]]:
    return [
        ("run" if isinstance(r, pb.Run) else "action", *span(r))
        for r in replica.storage.scan_records(0, 1 << 40)
    ]


def test_a_write_above_end_is_one_run_record():
    r = core()
    reply = write_run(r, 0, run_of(1, values(5)), persist=False)
    assert reply.response.verdict == pb.ACCEPT
    batch = reply.persist
    assert batch is not None and not batch.actions and len(batch.runs) == 1
    assert batch.runs[0].head.performed == 0 and r.end == 5
    assert r.get(3).value == b"v2"  # pending: served from the overlay
    apply(r, batch)
    assert stored_spans(r) == [("run", 1, 5)]
    assert [r.get(p).value for p in range(1, 6)] == values(5)
    assert r.get(4).batch_first == 1 and r.get(4).batch_last == 5


def test_a_write_above_end_below_the_promise_is_rejected_whole():
    r = core()
    r.on_promise(pb.PromiseRequest(proposal=4))
    reply = write_run(r, 3, run_of(1, values(3)))
    assert reply.response.verdict == pb.REJECT and reply.response.proposal == 4
    assert reply.persist is None and r.get(1) is None and r.end == 0


def test_a_write_over_a_stored_run_goes_position_by_position():
    r = core()
    write_run(r, 1, run_of(1, values(5, "old"), origin=1))
    reply = write_run(r, 2, run_of(3, values(5, "new"), origin=2))
    assert reply.response.verdict == pb.ACCEPT
    assert reply.persist is not None and not reply.persist.runs
    assert [a.position for a in reply.persist.actions] == [3, 4, 5, 6, 7]
    assert stored_spans(r) == [("run", 1, 2)] + [("action", p, p) for p in range(3, 8)]
    assert r.get(2).value == b"old1" and r.get(3).value == b"new0"
    assert r.get(7).performed == 2


def test_a_write_over_a_learned_run_is_rejected_unless_it_is_the_same_write():
    r = core()
    run = run_of(1, values(3))
    write_run(r, 1, run)
    learn_range(r, 1, 1, 3)
    again = write_run(r, 2, run)  # the same write re-proposed by a fill: accepted, no disk
    assert again.response.verdict == pb.ACCEPT and again.persist is None
    other = write_run(r, 2, run_of(1, values(3), origin=2))
    assert other.response.verdict == pb.REJECT


def test_an_explicit_promise_inside_a_run_splits_it():
    r = core()
    write_run(r, 1, run_of(1, values(5)))
    response = r.on_promise(pb.PromiseRequest(proposal=7, positions=[3]))
    apply(r, response.persist)
    assert response.response.verdict == pb.ACCEPT
    assert response.response.actions[0].value == b"v2"  # the record as it was
    assert stored_spans(r) == [("run", 1, 2), ("action", 3, 3), ("run", 4, 5)]
    assert r.get(3).promised == 7 and r.get(3).value == b"v2"
    assert r.get(4).promised == 1 and r.get(4).value == b"v3"
    # The split position is guarded by its promise, its neighbours by the implicit one.
    assert write_run(r, 5, run_of(3, values(1, "x"))).response.verdict == pb.REJECT
    assert write_run(r, 5, run_of(4, values(1, "x"))).response.verdict == pb.ACCEPT


def test_learned_ranges_over_runs_learn_whole_runs_out_of_order():
    r = core()
    write_run(r, 1, run_of(0, values(3)))
    write_run(r, 1, run_of(3, values(3)))
    write_run(r, 1, run_of(6, values(3)))
    learn_range(r, 2, 0, 8)  # another proposal's range: nothing here was written at it
    assert not any(r.is_learned(p) for p in range(9))
    learn_range(r, 1, 3, 5)
    assert not r.is_learned(0) and r.is_learned(4) and not r.is_learned(6)
    learn_range(r, 1, 0, 2)
    assert r.learned == 5
    learn_range(r, 1, 6, 8)
    assert r.learned == 8
    assert all(r.get(p).learned for p in range(9))
    assert reopen_learned(r) == 8  # the learned watermark survives a restart


def reopen_learned(r: ReplicaCore) -> int:
    return ReplicaCore(r.storage).learned


def test_a_learned_range_learns_a_run_not_yet_on_disk():
    r = core()
    pending = write_run(r, 1, run_of(0, values(4)), persist=False)
    learn_range(r, 1, 0, 3)
    assert r.learned == 3
    apply(r, pending.persist)
    assert [a.value for a in r.learned_actions(0, 3, 10)] == values(4)


def test_truncation_inside_a_run_clips_it():
    r = core()
    write_run(r, 1, run_of(1, values(5)))
    pending = write_run(r, 1, run_of(6, values(4, "p")), persist=False)  # not yet on disk
    truncate = pb.Action(position=10, type=pb.TRUNCATE, truncate_to=8, learned=True)
    truncation = r.on_learned(pb.LearnedRequest(actions=[truncate]))
    assert r.begin == 8
    assert r.get(7) is None and r.get(8).value == b"p2"  # the pending run, clipped
    apply(r, pending.persist)  # the journal's order: the write first
    assert r.get(8).value == b"p2"
    apply(r, truncation)
    assert stored_spans(r) == [("run", 8, 9), ("action", 10, 10)]
    assert r.get(5) is None and r.get(9).value == b"p3"
    assert ReplicaCore(r.storage).get(8).value == b"p2"


def test_truncation_below_a_run_learned_in_the_same_message():
    r = core()
    learned = run_of(1, values(6))
    learned.head.learned = True
    truncate = pb.Action(position=7, type=pb.TRUNCATE, truncate_to=4, learned=True)
    apply(r, r.on_learned(pb.LearnedRequest(actions=[truncate], runs=[learned])))
    assert r.begin == 4 and r.learned == 7
    assert stored_spans(r) == [("run", 4, 6), ("action", 7, 7)]


def test_learned_records_are_clipped_runs_with_the_learned_flag():
    r = core()
    write_run(r, 1, run_of(1, values(10)))
    learn_range(r, 1, 1, 10)
    (run,) = r.learned_records(3, 6, 100)
    assert isinstance(run, pb.Run) and run.first == 3 and run.head.learned
    assert values_of(run.data, run.offsets) == values(10)[2:6]
    (limited,) = r.learned_records(3, 10, 2)
    assert isinstance(limited, pb.Run) and span(limited) == (3, 4)
    write_run(r, 1, run_of(11, values(4, "w")))
    learn_range(r, 1, 13, 14)  # 11 and 12 not learned: a gap
    records = r.learned_records(8, 20, 100)
    assert [span(x) for x in records] == [(8, 10)]
    assert [a.position for a in r.learned_actions(8, 20, 100)] == [8, 9, 10]


def test_a_learned_run_copied_from_a_peer_is_held_as_one_record():
    source, copy = core(), core()
    # Position 0 is never above `end` (0 when nothing is stored): it goes by position.
    write_run(source, 1, run_of(0, [b"first"]))
    write_run(source, 1, run_of(1, values(6)))
    learn_range(source, 1, 0, 6)
    records = source.learned_records(0, 6, 100)
    assert [type(x) for x in records] == [pb.Action, pb.Run]
    actions = [x for x in records if isinstance(x, pb.Action)]
    runs = [x for x in records if isinstance(x, pb.Run)]
    apply(copy, copy.on_learned(pb.LearnedRequest(actions=actions, runs=runs)))
    assert copy.learned == 6 and stored_spans(copy) == [("action", 0, 0), ("run", 1, 6)]
    assert [a.value for a in copy.learned_actions(1, 6, 100)] == values(6)


def test_a_fetched_run_is_held_as_the_answer_holds_it_and_a_learned_one_is_copied():
    """A Fetch answer is given up to the core (`on_fetched`): its run is held and stored
    as it is, marked learned in place, no copy of its values; a Learned message's run is
    the sender's, so the core keeps its own copy and the message stays as it was."""
    fetched_into, learned_into = core(), core()
    answer = pb.FetchResponse(runs=[run_of(0, values(5))])
    batch = fetched_into.on_fetched(answer)
    assert batch is not None and batch.runs[0] is answer.runs[0]
    assert answer.runs[0].head.learned  # marked where it lies
    apply(fetched_into, batch)
    assert fetched_into.learned == 4 and stored_spans(fetched_into) == [("run", 0, 4)]
    request = pb.LearnedRequest(runs=[run_of(0, values(5))])
    batch = learned_into.on_learned(request)
    assert batch is not None and batch.runs[0] is not request.runs[0]
    assert batch.runs[0].head.learned and batch.runs[0].data == request.runs[0].data
    assert not request.runs[0].head.learned  # the sender's message is not touched
    apply(learned_into, batch)
    assert [a.value for a in learned_into.learned_actions(0, 4, 10)] == values(5)
    assert [a.value for a in fetched_into.learned_actions(0, 4, 10)] == values(5)


def test_a_fetched_answer_past_our_begin_skips_the_truncated_prefix_and_bad_ones_are_refused():
    r = core()
    # The peer truncated below 10: a tombstone at 9 applies it in one step.
    apply(r, r.on_fetched(pb.FetchResponse(begin=10, runs=[run_of(10, values(3))])))
    assert r.begin == 10 and r.learned == 12
    assert [a.value for a in r.learned_actions(10, 12, 10)] == values(3)
    bad = run_of(13, values(2))
    bad.offsets = bad.offsets[:-1]  # offsets that do not match its data
    assert r.on_fetched(pb.FetchResponse(runs=[bad])) is None and r.learned == 12


def test_a_learned_run_over_a_pending_position_goes_position_by_position():
    r = core()
    pending = r.on_promise(pb.PromiseRequest(proposal=3, positions=[2]))  # not yet on disk
    learned = run_of(1, values(3))
    learned.head.learned = True
    batch = r.on_learned(pb.LearnedRequest(runs=[learned]))
    assert batch is not None and not batch.runs and len(batch.actions) == 3
    apply(r, pending.persist)
    apply(r, batch)
    assert all(r.is_learned(p) for p in (1, 2, 3)) and r.get(2).value == b"v1"
    assert r.get(2).learned and stored_spans(r) == [("action", p, p) for p in (1, 2, 3)]


def test_admission_applies_a_run_as_its_entries():
    session = pb.Action(position=1, type=pb.SESSION)
    run = run_of(2, values(4))
    run.head.session, run.head.sequence, run.head.epoch = 1, 1, 0
    by_run, by_entry = AdmissionState(100, 1), AdmissionState(100, 1)
    for state in (by_run, by_entry):
        state.apply(session)
    by_run.apply_run(run)
    by_entry.apply_all(expand(run))
    assert by_run.next_position == by_entry.next_position == 6
    assert by_run.sessions[1].answers == by_entry.sessions[1].answers == {1: (2, 4)}


# ---- equivalence: a run and its expand() -----------------------------------------------

_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("write"),
            st.integers(1, 4),
            st.integers(1, 12),
            st.integers(1, 5),
            st.integers(0, 3),
        ),
        st.tuples(st.just("promise"), st.integers(1, 5), st.integers(1, 14), st.integers(0, 1)),
        st.tuples(st.just("learn"), st.integers(1, 4), st.integers(1, 14), st.integers(0, 6)),
        st.tuples(st.just("copy"), st.integers(1, 12), st.integers(1, 5), st.integers(0, 3)),
        st.tuples(st.just("truncate"), st.integers(1, 14), st.integers(15, 16)),
        st.tuples(st.just("persist"), st.integers(0, 3)),
    ),
    max_size=25,
)


class _Replica:
    """A core with the batches it has not persisted yet (a journal that may lag)."""

    def __init__(self) -> None:
        self.core = core()
        self.pending: list[WriteBatch] = []

    def take(self, batch: WriteBatch | None) -> None:
        if batch is not None:
            self.pending.append(batch)

    def persist(self, count: int) -> None:
        for batch in self.pending[:count]:
            apply(self.core, batch)
        del self.pending[:count]


def _view(r: ReplicaCore, last: int = 20) -> list[object]:
    held = []
    for position in range(0, last + 1):
        action = r.get(position)
        held.append(None if action is None else action.SerializeToString(deterministic=True))
    learned = r.learned_actions(0, last, 1000)
    return [
        held,
        r.end,
        r.begin,
        r.learned,
        sorted(p for p in range(last + 1) if r.is_learned(p)),
        [a.SerializeToString(deterministic=True) for a in learned],
    ]


@settings(max_examples=300, deadline=None)
@given(ops=_ops)
def test_a_run_and_its_expansion_give_the_same_replies_and_state(ops):
    as_runs, as_actions = _Replica(), _Replica()
    for op in ops:
        kind = op[0]
        if kind == "write":
            _, proposal, first, count, tag = op
            run = run_of(first, values(count, f"t{tag}-"), origin=tag)
            a = as_runs.core.on_write(pb.WriteRequest(proposal=proposal, runs=[run]))
            b = as_actions.core.on_write(pb.WriteRequest(proposal=proposal, actions=expand(run)))
            assert a.response == b.response
            as_runs.take(a.persist)
            as_actions.take(b.persist)
        elif kind == "promise":
            _, proposal, position, implicit = op
            positions = [] if implicit else [position, position + 1]
            request = pb.PromiseRequest(proposal=proposal, positions=positions)
            a = as_runs.core.on_promise(request)
            b = as_actions.core.on_promise(request)
            assert a.response == b.response
            as_runs.take(a.persist)
            as_actions.take(b.persist)
        elif kind == "learn":
            _, proposal, first, length = op
            request = pb.LearnedRequest(
                proposal=proposal, ranges=[pb.PositionRange(first=first, last=first + length)]
            )
            as_runs.take(as_runs.core.on_learned(request))
            as_actions.take(as_actions.core.on_learned(request))
        elif kind == "copy":
            _, first, count, tag = op
            run = run_of(first, values(count, f"c{tag}-"), origin=10 + tag)
            run.head.learned = True
            as_runs.take(as_runs.core.on_learned(pb.LearnedRequest(runs=[run])))
            as_actions.take(as_actions.core.on_learned(pb.LearnedRequest(actions=expand(run))))
        elif kind == "truncate":
            _, to, position = op
            request = pb.LearnedRequest(
                actions=[pb.Action(position=position, type=pb.TRUNCATE, truncate_to=to)]
            )
            as_runs.take(as_runs.core.on_learned(request))
            as_actions.take(as_actions.core.on_learned(request))
        else:
            as_runs.persist(op[1])
            as_actions.persist(op[1])
        assert _view(as_runs.core) == _view(as_actions.core)
    as_runs.persist(len(as_runs.pending))
    as_actions.persist(len(as_actions.pending))
    assert _view(as_runs.core) == _view(as_actions.core)
    # What is on disk reads back the same after a restart.
    assert _view(ReplicaCore(as_runs.core.storage)) == _view(ReplicaCore(as_actions.core.storage))
    assert [a.SerializeToString(deterministic=True) for a in as_runs.core.storage.scan(0, 20)] == [
        a.SerializeToString(deterministic=True) for a in as_actions.core.storage.scan(0, 20)
    ]


def test_run_last_of_an_empty_run_is_before_its_first():
    assert run_last(pb.Run(first=5)) == 4


def test_learned_records_cut_a_big_run_to_the_byte_budget():
    r = core()
    write_run(r, 1, run_of(0, [b"z"]))
    write_run(r, 1, run_of(1, [bytes([k]) * 100 for k in range(10)]))
    learn_range(r, 1, 0, 10)
    # The run does not fit after the action: it is left whole for the next batch.
    (action,) = r.learned_records(0, 10, 100, max_bytes=250)
    assert isinstance(action, pb.Action) and action.value == b"z"
    # First in a batch, it is cut to the values that fit (200 bytes of 250).
    (first,) = r.learned_records(1, 10, 100, max_bytes=250)
    assert isinstance(first, pb.Run) and span(first) == (1, 2)
    (alone,) = r.learned_records(1, 10, 100, max_bytes=10)
    assert isinstance(alone, pb.Run) and span(alone) == (1, 1)  # always at least one value
    # With room for it, the run comes whole, its bytes as stored.
    action, whole = r.learned_records(0, 10, 100, max_bytes=1001)
    assert isinstance(whole, pb.Run) and span(whole) == (1, 10)
    assert values_of(whole.data, whole.offsets) == [bytes([k]) * 100 for k in range(10)]


def test_learned_records_stop_at_max_records():
    r = core()
    for first in range(1, 13, 3):  # (a run at 0 is stored per position: see on_write)
        write_run(r, 1, run_of(first, values(3, f"r{first}")))
    learn_range(r, 1, 1, 12)
    records = r.learned_records(1, 12, 100, max_records=2)
    assert [span(record) for record in records] == [(1, 3), (4, 6)]
    assert [span(record) for record in r.learned_records(1, 12, 100)] == [
        (1, 3),
        (4, 6),
        (7, 9),
        (10, 12),
    ]


# ---- the leader: one run per admitted append --------------------------------------------


def _leading() -> tuple[Coordinator, ReplicaCore, list[pb.WriteRequest]]:
    """A single-replica log's coordinator, leading, and the write requests it sends."""
    replica = core()
    coordinator = Coordinator(0, 1, replica, CoordinatorConfig())
    coordinator.elect()
    sent: list[pb.WriteRequest] = []
    _deliver(coordinator, replica, sent)
    assert coordinator.leading
    return coordinator, replica, sent


def _deliver(coordinator: Coordinator, replica: ReplicaCore, sent: list[pb.WriteRequest]):
    """Deliver every message to the one replica until quiet; the non-message outputs."""
    results = []
    while outputs := coordinator.take():
        for output in outputs:
            if not isinstance(output, Send):
                if isinstance(output, Leading):
                    state = AdmissionState(100, output.next_position)
                    coordinator.admission_ready(output.proposal, state)
                results.append(output)
                continue
            message = output.message
            if isinstance(message, pb.LearnedRequest):
                apply(replica, replica.on_learned(message))
                continue
            if isinstance(message, pb.WriteRequest):
                sent.append(message)
                reply = replica.on_write(message)
            else:
                reply = replica.on_promise(message)
            apply(replica, reply.persist)
            coordinator.on_reply(output.round, output.to, reply.response)
    return results


def test_the_leader_sends_one_run_per_append_and_dedupes_its_retry():
    coordinator, replica, sent = _leading()
    secret = b"k" * 16
    coordinator.propose(
        "session", [pb.Action(type=pb.SESSION, session_check=session_check(secret))]
    )
    coordinator.pump()
    (session,) = next(
        o for o in _deliver(coordinator, replica, sent) if isinstance(o, Done)
    ).positions
    data, offsets = pack(values(64))
    conditions = Conditions(session=session, sequence=1, secret=secret)
    sent.clear()
    coordinator.propose("a1", pb.Run(data=data, offsets=offsets), conditions)
    coordinator.propose("single", pb.Run(data=b"s", offsets=pack([b"s"])[1]))
    coordinator.pump()
    done = {o.token: o for o in _deliver(coordinator, replica, sent) if isinstance(o, Done)}
    assert done["a1"].positions == list(range(session + 1, session + 65))
    assert done["single"].positions == [session + 65]
    (request,) = sent
    assert not request.actions and [span(r) for r in request.runs] == [
        (session + 1, session + 64),
        (session + 65, session + 65),
    ]
    head = request.runs[0].head
    assert (head.batch_first, head.batch_last) == (session + 1, session + 64)
    assert (head.session, head.sequence, head.origin_proposal) == (session, 1, coordinator.proposal)
    assert request.runs[1].head.batch_first == request.runs[1].head.batch_last == 0
    assert stored_spans(replica)[-2:] == [
        ("run", session + 1, session + 64),
        ("run", session + 65, session + 65),
    ]
    # A retry of the session append: the original positions, nothing written.
    sent.clear()
    coordinator.propose("retry", pb.Run(data=data, offsets=offsets), conditions)
    coordinator.pump()
    (retry,) = _deliver(coordinator, replica, sent)
    assert isinstance(retry, Done) and retry.positions == done["a1"].positions and not sent


def test_learning_many_runs_before_any_is_durable_costs_linear_work(monkeypatch):
    """A catch-up of a log of small appends holds one run per learned span until its write
    is durable. Each new run used to be checked against every run held (and each durable
    batch against every run too): quadratic, minutes of CPU with the event loop blocked for
    a replica on a fresh volume in the e2e suite. Counted in `run_last` calls, not timed."""
    import rlog.protocol.replica as replica_module

    calls = 0
    real_run_last = replica_module.run_last

    def counting_run_last(run: pb.Run) -> int:
        nonlocal calls
        calls += 1
        return real_run_last(run)

    monkeypatch.setattr(replica_module, "run_last", counting_run_last)
    r = core()
    runs = []
    for n in range(3_000):
        run = run_of(1 + 2 * n, [f"a{n}".encode(), f"b{n}".encode()])
        run.head.learned = True
        runs.append(run)
    batch = r.on_learned(pb.LearnedRequest(runs=runs))  # nothing durable meanwhile
    apply(r, batch)
    assert calls < 20 * len(runs), calls  # quadratic: ~4.5 million
    assert all(r.is_learned(p) for p in range(1, 6_001))
    assert stored_spans(r) == [("run", 1 + 2 * n, 2 + 2 * n) for n in range(3_000)]
    assert [a.value for a in r.learned_actions(5_999, 6_000, 10)] == [b"a2999", b"b2999"]
