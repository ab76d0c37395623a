"""Packed values at the edges against a real 3-replica log (`DevCluster`): appends sent as
`data`/`offsets` and answered with `first`/`count`, the older `values` still accepted, bad
packed requests refused whole, and reads answered as runs (docs/data-path.md, "Clients,
reads and Spark")."""

from __future__ import annotations

import struct

import grpc
import pytest

from rlog import packed
from rlog.client import Client
from rlog.client.errors import InvalidArgument
from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.tools.dev import DevCluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with DevCluster(3, tmp_path_factory.mktemp("packed"), election_timeout=0.5) as c:
        c.wait_for_leader()
        c.wait_for(lambda found: all(s is not None for s in found), 30, "every replica")
        yield c


@pytest.fixture
def stub(cluster):
    leader = cluster.wait_for_leader()
    with grpc.insecure_channel(cluster.endpoints[leader]) as channel:
        yield pbg.LogStub(channel)


def read_all(stub: pbg.LogStub, first: int) -> list[tuple[int, bytes]]:
    request = pb.ReadRequest()
    setattr(request, "from", first)
    out = []
    for response in stub.Read(request, timeout=10):
        assert not response.entries  # a current server answers runs only
        for run in response.runs:
            assert not run.HasField("head") and packed.run_count(run) > 0
            values = packed.values_of(run.data, run.offsets)
            out += list(zip(range(run.first, run.first + len(values)), values, strict=True))
    return out


def next_position(stub: pbg.LogStub) -> int:
    """The next position the log will give (an empty conditional append tells it)."""
    with pytest.raises(grpc.RpcError) as refused:
        stub.Append(pb.AppendRequest(values=[b"probe"], if_next=0), timeout=10)
    trailers = dict(refused.value.trailing_metadata() or ())
    return int(trailers["rlog-next"])


def test_packed_append_is_answered_with_first_and_count(cluster, stub):
    values = [b"a", b"", b"ccc" * 100, b"d"]
    data, offsets = packed.pack(values)
    response = stub.Append(pb.AppendRequest(data=data, offsets=offsets), timeout=10)
    assert response.count == len(values) and not response.positions
    assert read_all(stub, response.first)[: len(values)] == list(
        zip(range(response.first, response.first + len(values)), values, strict=True)
    )


def test_the_older_values_field_still_appends(cluster, stub):
    response = stub.Append(pb.AppendRequest(values=[b"old-1", b"old-2"]), timeout=10)
    assert response.count == 2 and not response.positions
    assert read_all(stub, response.first)[:2] == [
        (response.first, b"old-1"),
        (response.first + 1, b"old-2"),
    ]


@pytest.mark.parametrize(
    "data, offsets, why",
    [
        (b"abc", struct.pack("<3I", 0, 2, 4), "last offset past the data"),
        (b"abc", struct.pack("<3I", 0, 2, 1), "decreasing offsets"),
        (b"abc", struct.pack("<3I", 1, 2, 3), "first offset not 0"),
        (b"abc", b"\x00\x00\x00", "not whole uint32 values"),
        (b"abc", b"", "data without offsets"),
        (b"", struct.pack("<I", 0), "one offset: no count+1"),
    ],
)
def test_bad_offsets_are_refused_and_append_nothing(cluster, stub, data, offsets, why):
    before = next_position(stub)
    with pytest.raises(grpc.RpcError) as refused:
        stub.Append(pb.AppendRequest(data=data, offsets=offsets), timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, why
    assert next_position(stub) == before


def test_values_and_data_together_are_refused(cluster, stub):
    before = next_position(stub)
    data, offsets = packed.pack([b"x"])
    with pytest.raises(grpc.RpcError) as refused:
        stub.Append(pb.AppendRequest(values=[b"y"], data=data, offsets=offsets), timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not both" in (refused.value.details() or "")
    assert next_position(stub) == before


def test_append_stream_refuses_a_bad_request_and_answers_the_others(cluster, stub):
    good, good_offsets = packed.pack([b"s1", b"s2", b"s3"])
    requests = [
        pb.AppendRequest(id=1, data=good, offsets=good_offsets),
        pb.AppendRequest(id=2, data=b"zz", offsets=struct.pack("<2I", 0, 3)),
        pb.AppendRequest(id=3, values=[b"s4"]),
    ]
    answers = {r.id: r for r in stub.AppendStream(iter(requests), timeout=10)}
    assert answers[1].code == 0 and answers[1].count == 3
    assert answers[2].code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and not answers[2].count
    assert answers[3].code == 0 and answers[3].count == 1
    got = dict(read_all(stub, answers[1].first))
    assert [got[answers[1].first + i] for i in range(3)] == [b"s1", b"s2", b"s3"]
    assert got[answers[3].first] == b"s4"


def test_client_packed_and_plain_appends_read_back_the_same(cluster):
    with Client(cluster.endpoints) as client:
        values = [b"p%d" % i for i in range(300)] + [b""]
        data, offsets = packed.pack(values)
        positions = client.append_packed(data, offsets)
        assert list(positions) == list(range(positions[0], positions[0] + len(values)))
        more = client.append(["plain", b"bytes"])
        assert more == [positions[-1] + 1, positions[-1] + 2]
        got = [(e.position, e.value) for e in client.read(positions[0], more[-1])]
        assert got == list(zip([*positions, *more], [*values, b"plain", b"bytes"], strict=True))
        with pytest.raises(InvalidArgument):
            client.append_packed(b"abc", struct.pack("<2I", 0, 2))
        assert client.append([b"after"])[0] == more[-1] + 1  # the refused batch took nothing


@pytest.mark.parametrize("stream", [False, True])
def test_coalesced_appends_are_split_back_in_order(cluster, stream):
    """Concurrent appends share requests (the stream's coalescing, the exactly-once groups):
    each caller gets its own positions, with its own values there."""
    import concurrent.futures

    with Client(cluster.endpoints, stream=stream) as client:
        futures = [
            client.submit_append([b"c%d-%d" % (i, j) for j in range(i % 3 + 1)]) for i in range(60)
        ]
        results = [f.result(timeout=30) for f in futures]
        concurrent.futures.wait(futures)
        low = min(p for r in results for p in r)
        high = max(p for r in results for p in r)
        held = {e.position: e.value for e in client.read(low, high)}
        for i, positions in enumerate(results):
            assert [held[p] for p in positions] == [b"c%d-%d" % (i, j) for j in range(i % 3 + 1)]


def test_runs_skip_nop_session_and_epoch_entries(cluster):
    """Reads answer runs of APPEND entries only, as they were stored (one per append call,
    passed on without re-packing): the SESSION and EPOCH entries between appends are not read
    and no run spans them; every position is the append's own."""
    with Client(cluster.endpoints) as client:  # exactly-once: its first append opens a session
        written: list[tuple[int, bytes]] = []
        calls: list[tuple[int, int]] = []  # (first position, count) of each append call
        # The leader's learned mark, which covers every append acknowledged before: a
        # follower's can lag behind, and on a loaded machine (parallel tests) one answered
        # below an earlier test's append, which then showed up in the read from `start`.
        start = client.status(cluster.endpoints[cluster.wait_for_leader()]).learned + 1
        for round_ in range(3):
            for values in ([b"r%d-%d" % (round_, i) for i in range(5)], [b"r%d-tail" % round_]):
                positions = client.append(values)
                written += list(zip(positions, values, strict=True))
                calls.append((positions[0], len(positions)))
                if len(values) > 1:
                    client.take_epoch()
        leader = cluster.wait_for_leader()
        with grpc.insecure_channel(cluster.endpoints[leader]) as channel:
            stub = pbg.LogStub(channel)
            request = pb.ReadRequest(to=written[-1][0])
            setattr(request, "from", start)
            runs = [run for response in stub.Read(request, timeout=10) for run in response.runs]
        got = [
            (run.first + i, value)
            for run in runs
            for i, value in enumerate(packed.values_of(run.data, run.offsets))
        ]
        assert got == written
        # One run per append call, as stored; an EPOCH entry sits between a round's two calls
        # and a run never spans it.
        assert [(r.first, packed.run_count(r)) for r in runs] == calls
        epochs = [b[0] - (a[0] + a[1]) for a, b in zip(calls[0::2], calls[1::2], strict=True)]
        assert epochs == [1, 1, 1]  # one EPOCH position between a round's calls
        assert start < written[0][0]  # the SESSION entry came first
        # read(), read_columns() and tail() see the same.
        assert [(e.position, e.value) for e in client.read(start, written[-1][0])] == written
        columns = [
            (run.first + i, value)
            for runs_ in client.read_columns(start, written[-1][0])
            for run in runs_
            for i, value in enumerate(packed.values_of(run.data, run.offsets))
        ]
        assert columns == written
        tailed = []
        for entry in client.tail(start):
            tailed.append((entry.position, entry.value))
            if entry.position == written[-1][0]:
                break
        assert tailed == written


def test_follower_reads_and_forwarded_appends(cluster):
    """A follower forwards a packed append to the leader and serves stale reads and tails
    as runs too (its own learned entries)."""
    leader = cluster.wait_for_leader()
    follower = next(i for i in range(3) if i != leader)
    with Client(cluster.endpoints[follower], exactly_once=False) as client:
        values = [b"f%d" % i for i in range(50)]
        positions = client.append_packed(*packed.pack(values))
        assert len(positions) == 50
        cluster.wait_for(
            lambda found: all(s is not None and s.learned >= positions[-1] for s in found),
            what="learned",
        )
        stale = client.read(positions[0], positions[-1], stale=True)
        assert [(e.position, e.value) for e in stale] == list(zip(positions, values, strict=True))
        consistent = client.read(positions[0], positions[-1])
        assert [e.value for e in consistent] == values
        tail = client.tail(positions[0])  # non-stale: the leader serves the start
        assert [next(tail).value for _ in range(50)] == values


def test_a_read_response_holds_stored_runs_whole(cluster):
    """A Read response passes every stored run it has room for whole (each run is read from
    storage once per read), ends before a run that would pass its byte bound, and cuts a run
    only where the range asked for does, or when one run alone is past the bound."""
    leader = cluster.wait_for_leader()
    follower = next(i for i in range(3) if i != leader)
    big = 15_000  # x 100 B: 1.5 MB per run, so 2 runs fit a response's 4 MiB, not 3
    with Client(cluster.endpoints[leader], exactly_once=False) as client:
        calls = []
        for k in range(4):
            values = [bytes([k]) * 100] * big
            positions = client.append_packed(*packed.pack(values))
            calls.append((positions[0], len(positions)))
        huge = [b"h" * 1000] * 5000  # 5 MB: alone past the bound
        positions = client.append_packed(*packed.pack(huge))
        calls.append((positions[0], len(positions)))
        last = positions[-1]
    cluster.wait_for(
        lambda found: all(s is not None and s.learned >= last for s in found), what="learned"
    )
    with Client(cluster.endpoints[follower], exactly_once=False) as reader:
        first = calls[0][0] + 10  # mid-run: the first run is cut where the range starts
        responses = [
            [(run.first, packed.run_count(run)) for run in runs]
            for runs in reader.read_columns(first, last, stale=True)
        ]
        got = [
            (run.first + i, value)
            for runs in reader.read_columns(first, last, stale=True)
            for run in runs
            for i, value in enumerate(packed.values_of(run.data, run.offsets))
        ]
    _, (b, _), (c, _), (d, _), (h, _) = calls
    assert responses[:2] == [[(first, big - 10), (b, big)], [(c, big), (d, big)]]
    # The 5 MB run alone: cut to the values that fit 4 MiB, the rest in the next response.
    rest = responses[2:]
    assert all(len(runs) == 1 for runs in rest) and len(rest) == 2
    assert rest[0][0][0] == h and rest[1][0][0] == h + rest[0][0][1]
    assert rest[0][0][1] + rest[1][0][1] == 5000 and rest[0][0][1] * 1000 <= 4 * 1024 * 1024
    expected = []
    for (start, count), fill in zip(calls[:4], range(4), strict=True):
        expected += [(p, bytes([fill]) * 100) for p in range(start, start + count)]
    expected += [(p, b"h" * 1000) for p in range(h, h + 5000)]
    assert got == [e for e in expected if e[0] >= first]


@pytest.mark.parametrize("how", ["leader", "follower stale", "follower forwarded"])
def test_max_batch_bounds_the_positions_of_each_read_response(cluster, how):
    """A Read's `max_batch` caps the positions each response spans, cutting stored runs for
    it, on the leader, on a follower's stale read and on a read it forwards to the leader;
    the values read are the same as without it."""
    leader = cluster.wait_for_leader()
    follower = next(i for i in range(3) if i != leader)
    with Client(cluster.endpoints[leader], exactly_once=False) as client:
        calls = [client.append_packed(*packed.pack([b"m%d" % i for i in range(30)]))]
        calls.append(client.append_packed(*packed.pack([b"n%d" % i for i in range(11)])))
    first, last = calls[0][0], calls[-1][-1]
    cluster.wait_for(
        lambda found: all(s is not None and s.learned >= last for s in found), what="learned"
    )
    endpoint = cluster.endpoints[leader if how == "leader" else follower]
    stale = how == "follower stale"
    with Client(endpoint, exactly_once=False) as reader:

        def responses(max_batch: int) -> list[list[tuple[int, list[bytes]]]]:
            return [
                [(run.first, packed.values_of(run.data, run.offsets)) for run in runs]
                for runs in reader.read_columns(first, last, stale, max_batch)
            ]

        whole = responses(0)
        capped = responses(7)
    spans = [runs[-1][0] + len(runs[-1][1]) - runs[0][0] for runs in capped]
    assert max(spans) <= 7 and len(capped) >= (last - first + 1) // 7
    assert len(whole) == 1  # 41 small values: one response without the cap

    def flat(got: list[list[tuple[int, list[bytes]]]]) -> list[tuple[int, bytes]]:
        return [
            (start + i, v) for runs in got for start, values in runs for i, v in enumerate(values)
        ]

    assert flat(capped) == flat(whole)
    assert [v for _, v in flat(whole)] == [b"m%d" % i for i in range(30)] + [
        b"n%d" % i for i in range(11)
    ]
