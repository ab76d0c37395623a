"""Packed appends (docs/data-path.md) against a real 3-replica log: `AppendRequest.data` +
`offsets` append as one batch, through the leader and through a follower that forwards
them; offsets that do not check out, or values sent both ways, append nothing."""

from __future__ import annotations

import grpc
import pytest

from rlog.client import Client
from rlog.packed import pack
from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.tools.dev import DevCluster

pytestmark = pytest.mark.slow


def test_packed_appends_and_bad_offsets(tmp_path):
    with DevCluster(3, tmp_path, max_entry_size=1024, election_timeout=0.5) as cluster:
        leader = cluster.wait_for_leader()
        follower = next(i for i in range(3) if i != leader)
        appended: dict[int, bytes] = {}
        for replica in (leader, follower):
            with grpc.insecure_channel(cluster.endpoints[replica]) as channel:
                stub = pbg.LogStub(channel)
                values = [f"r{replica}-{k}".encode() for k in range(5)]
                data, offsets = pack(values)
                response = stub.Append(pb.AppendRequest(data=data, offsets=offsets), timeout=30)
                assert response.count == 5 and not response.positions  # first + count
                positions = range(response.first, response.first + response.count)
                appended.update(zip(positions, values, strict=True))
                bad = [
                    pb.AppendRequest(data=data, offsets=offsets[:-4]),  # ends short of data
                    pb.AppendRequest(data=data, offsets=offsets[:-1]),  # not uint32s
                    pb.AppendRequest(data=data, offsets=offsets, values=[b"x"]),  # both
                    pb.AppendRequest(data=b"ab", offsets=pack([b"a", b"b"])[1][::-1]),
                ]
                for request in bad:
                    with pytest.raises(grpc.RpcError) as caught:
                        stub.Append(request, timeout=30)
                    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                big, big_offsets = pack([b"a", b"b" * 2000])
                with pytest.raises(grpc.RpcError) as caught:
                    stub.Append(pb.AppendRequest(data=big, offsets=big_offsets), timeout=30)
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "exceeds the maximum entry size" in (caught.value.details() or "")
        with Client(cluster.endpoints[leader]) as client:
            read = {e.position: e.value for e in client.read(from_=min(appended))}
        assert read == appended  # the refused requests appended nothing
