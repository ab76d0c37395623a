"""The health port (runtime/health.py) on real replica processes with mutual TLS: what the
kubelet's grpc probes would see through a replica's life, and that the plaintext port serves
the health service and nothing else."""

from __future__ import annotations

import signal

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from live import CAPPED, append_acked, copying, wait_all_voting

from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.runtime.health import READY_SERVICE
from rlog.tools.dev import DevCluster

pytestmark = pytest.mark.slow

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def health_channel(cluster: DevCluster, i: int) -> grpc.Channel:
    """A plaintext channel to replica i's health port, as the kubelet dials it."""
    return grpc.insecure_channel(f"{cluster.host_of(i)}:{cluster.health_ports[i]}")


def probe(cluster: DevCluster, i: int, service: str) -> int:
    with health_channel(cluster, i) as channel:
        request = health_pb2.HealthCheckRequest(service=service)
        return health_pb2_grpc.HealthStub(channel).Check(request, timeout=5).status


def test_probes_follow_a_replica_through_catch_up_and_a_drain(tmp_path):
    args = [*CAPPED, "--drain-timeout", "10"]
    with DevCluster(
        3, tmp_path, tls=True, health=True, election_timeout=0.5, replica_args=args
    ) as cluster:
        for i in range(3):
            assert probe(cluster, i, "") == SERVING
            assert probe(cluster, i, READY_SERVICE) == SERVING
        with pytest.raises(grpc.RpcError) as unknown:
            probe(cluster, 0, "rlog.v1.NoSuchService")
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND

        # A replica catching up is alive but not ready; ready again once VOTING.
        acknowledged = {}
        with cluster.client() as client:
            for _ in range(20):
                positions = append_acked(client, [b"h" * 2048] * 1000)
                acknowledged.update(dict.fromkeys(positions, b"h" * 2048))
        leader = cluster.wait_for_leader()
        victim = next(i for i in range(3) if i != leader)
        cluster.wipe(victim)
        cluster.start_replica(victim)
        cluster.wait_for(copying(victim, before=0.5), 60, "catch-up progress in status")
        assert probe(cluster, victim, "") == SERVING
        assert probe(cluster, victim, READY_SERVICE) == NOT_SERVING
        wait_all_voting(cluster, timeout=120)
        assert probe(cluster, victim, READY_SERVICE) == SERVING

        # A leader asked to stop is not ready from that moment, while it drains.
        leader = cluster.wait_for_leader()
        with health_channel(cluster, leader) as channel:
            request = health_pb2.HealthCheckRequest(service=READY_SERVICE)
            watch = health_pb2_grpc.HealthStub(channel).Watch(request, timeout=60)
            assert next(watch).status == SERVING
            cluster.kill(leader, signal.SIGTERM, wait=False)
            assert next(watch).status == NOT_SERVING
        cluster.wait_for_leader()
        with cluster.client(victim) as client:  # the caught-up replica holds every entry
            held = {e.position: e.value for e in client.read(to=max(acknowledged), stale=True)}
        assert all(held.get(p) == v for p, v in acknowledged.items())


def test_the_health_port_serves_nothing_but_health(tmp_path):
    """The health port is plaintext whatever the replica's transport: a caller there must
    reach no replica, client or admin method."""
    with DevCluster(3, tmp_path, tls=True, health=True) as cluster:
        with cluster.client() as client:
            append_acked(client, [b"before"])
        before = [cluster.status(i) for i in range(3)]
        end = before[0].end
        with health_channel(cluster, 0) as channel:
            calls = [
                (pbg.LogStub(channel).Append, pb.AppendRequest(values=[b"injected"])),
                (pbg.LogStub(channel).Truncate, pb.TruncateRequest(to=end)),
                (pbg.LogStub(channel).Status, pb.StatusRequest()),
                (pbg.AdminStub(channel).RevokePermit, pb.PermitRequest(log_id="dev")),
                (pbg.ReplicaStub(channel).Promise, pb.PromiseRequest(proposal=1 << 40)),
            ]
            for method, request in calls:
                with pytest.raises(grpc.RpcError) as refused:
                    method(request, timeout=5)
                assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED, method
        after = [cluster.status(i) for i in range(3)]
        for was, now in zip(before, after, strict=True):
            assert (now.begin, now.end, now.permit) == (was.begin, was.end, was.permit), now
        with cluster.client() as client:
            assert [e.value for e in client.read(to=end)][-1] == b"before"
