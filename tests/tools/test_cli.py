"""The `rlog` command line without a server: usage errors, unreachable endpoints, offline
initialize. Runs the real console script as a subprocess."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cli_runs import assert_one_line_error, rlog

from rlog import __version__
from rlog.client import AsyncClient, Client, parse_endpoints
from rlog.client.errors import OutcomeUnknown, RlogError, Unavailable
from rlog.config import ConfigError
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.peer_version import PROTOCOL
from rlog.storage import open_storage
from rlog.tools.bench import percentile

# ---- usage errors: exit 2 -------------------------------------------------------------------


@pytest.mark.parametrize(
    "peers, needle",
    [
        ("localhost", "expected HOST:PORT"),
        ("127.0.0.1:notaport", "is not a number"),
        ("127.0.0.1:70000", "out of range"),
        ("a b:1", "bad host"),
        ("", "--peers is empty"),
        ("127.0.0.1:1,127.0.0.1:1,127.0.0.1:3", "twice"),
    ],
)
def test_malformed_peers(tmp_path, peers, needle):
    result = rlog("replica", "--id", "0", "--peers", peers, "--data-dir", str(tmp_path / "d"))
    assert_one_line_error(result, 2, needle)


def test_even_replica_count(tmp_path):
    result = rlog(
        "replica", "--id", "0", "--peers", "127.0.0.1:7001,127.0.0.1:7002", "--data-dir", "d"
    )
    assert_one_line_error(result, 2, "1, 3, 5 or 7", "not 2")


def test_id_out_of_range(tmp_path):
    peers = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003"
    result = rlog("replica", "--id", "3", "--peers", peers, "--data-dir", str(tmp_path))
    assert_one_line_error(result, 2, "--id 3 is out of range")
    result = rlog("replica", "--id", "-1", "--peers", peers, "--data-dir", str(tmp_path))
    assert_one_line_error(result, 2, "--id")


def test_replica_missing_flags():
    assert_one_line_error(rlog("replica", "--id", "0"), 2, "required")


def test_unknown_subcommand():
    assert_one_line_error(rlog("frobnicate"), 2, "invalid choice", "frobnicate")


def test_version_is_the_projects_and_names_the_peer_protocol():
    """`rlog --version`: the one project version (rlog.__version__, docs/upgrades.md)."""
    result = rlog("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().strip() == f"rlog {__version__} (peer protocol {PROTOCOL})"


def test_no_subcommand():
    assert_one_line_error(rlog(), 2)


def test_unknown_flag():
    assert_one_line_error(rlog("status", "--endpoint", "127.0.0.1:1", "--bogus"), 2, "--bogus")


@pytest.mark.parametrize(
    "args",
    [
        ("status",),
        ("append", "x"),
        ("read",),
        ("truncate", "--to", "3"),
        ("bench",),
    ],
)
def test_missing_endpoint(args):
    assert_one_line_error(rlog(*args), 2, "--endpoint")


@pytest.mark.parametrize("endpoint", ["nohostport", "127.0.0.1:0", "127.0.0.1:x", ","])
def test_malformed_endpoint(endpoint):
    assert_one_line_error(rlog("status", "--endpoint", endpoint), 2, "endpoint")


def test_bad_numbers():
    assert_one_line_error(rlog("read", "-e", "127.0.0.1:1", "--from", "abc"), 2, "--from")
    assert_one_line_error(rlog("read", "-e", "127.0.0.1:1", "--to", "-4"), 2, "--to")
    assert_one_line_error(
        rlog("read", "-e", "127.0.0.1:1", "--from", "5", "--to", "4"), 2, "after --to"
    )
    assert_one_line_error(rlog("truncate", "-e", "127.0.0.1:1"), 2, "--to")
    assert_one_line_error(rlog("bench", "-e", "127.0.0.1:1", "--size", "0"), 2, "--size")
    assert_one_line_error(
        rlog("bench", "-e", "127.0.0.1:1", "--stream", "--lane"), 2, "exclude each other"
    )
    replica = ("replica", "--id", "0", "--peers", "127.0.0.1:1", "--data-dir", "/nonexistent")
    assert_one_line_error(rlog(*replica, "--catchup-rate", "-1"), 2, "--catchup-rate")


def test_append_needs_values():
    assert_one_line_error(rlog("append", "-e", "127.0.0.1:1"), 2, "nothing to append")
    assert_one_line_error(
        rlog("append", "-e", "127.0.0.1:1", "--stdin", "x", stdin=b""), 2, "not both"
    )


def test_dev_refuses_even_replicas_and_lanes_on_replica_ports(tmp_path):
    assert_one_line_error(rlog("dev", "--replicas", "2", "--dir", str(tmp_path)), 2, "not 2")
    assert_one_line_error(
        rlog("dev", "--write-lane-offset", "2", "--dir", str(tmp_path)), 2, "replica 2's port"
    )


def test_help_is_fine():
    result = rlog("--help")
    assert result.returncode == 0
    for command in ("replica", "dev", "append", "read", "status", "truncate", "initialize"):
        assert command in result.stdout.decode()


# ---- unreachable endpoints: exit 1 ----------------------------------------------------------


def test_status_unreachable():
    line = assert_one_line_error(rlog("status", "--endpoint", "127.0.0.1:1"), 1, "127.0.0.1:1")
    assert "connection refused" in line


@pytest.mark.parametrize(
    "args",
    [
        ("append", "x"),
        ("read", "--json"),
        ("truncate", "--to", "2"),
        ("status", "--json"),
        ("admin", "step-down"),
        ("bench", "--count", "1"),
    ],
)
def test_commands_unreachable(args):
    assert_one_line_error(rlog(*args, "--endpoint", "127.0.0.1:1,127.0.0.1:2"), 1, "127.0.0.1")


def test_append_stdin_unreachable():
    result = rlog("append", "--stdin", "--endpoint", "127.0.0.1:1", stdin=b"a\nb\n")
    assert_one_line_error(result, 1, "cannot reach 127.0.0.1:1")
    assert result.stdout == b""


# ---- initialize -----------------------------------------------------------------------------


def test_initialize_fresh_then_refuse(tmp_path):
    data = tmp_path / "data"
    first = rlog("initialize", "--data-dir", str(data))
    assert first.returncode == 0, first.stderr
    out = first.stdout.decode().strip().splitlines()
    assert len(out) == 1 and str(data) in out[0]
    storage = open_storage(data)
    try:
        assert storage.metadata().status == pb.VOTING
        assert storage.first_position() is None
    finally:
        storage.close()
    second = rlog("initialize", "--data-dir", str(data))
    assert_one_line_error(second, 1, f"the log at {data} is not empty")


def test_initialize_refuses_a_dir_with_actions(tmp_path):
    from rlog.storage import WriteBatch

    data = tmp_path / "data"
    storage = open_storage(data)
    storage.apply(WriteBatch(actions=[pb.Action(position=0, promised=1, type=pb.NOP)]))
    storage.close()
    assert_one_line_error(rlog("initialize", "--data-dir", str(data)), 1, "not empty")


def test_initialize_under_a_regular_file(tmp_path):
    # Fails for root too: a path below a regular file cannot be created by anyone.
    blocker = tmp_path / "somefile"
    blocker.write_text("not a directory\n")
    result = rlog("initialize", "--data-dir", str(blocker / "data"))
    assert_one_line_error(result, 1)


def test_initialize_on_a_regular_file(tmp_path):
    blocker = tmp_path / "somefile"
    blocker.write_text("not a directory\n")
    assert_one_line_error(rlog("initialize", "--data-dir", str(blocker)), 1, "not a directory")


def test_initialize_unknown_engine(tmp_path):
    result = rlog("initialize", "--data-dir", str(tmp_path / "d"), "--storage-engine", "nope")
    assert_one_line_error(result, 2, "nope")


# ---- the library without a server ------------------------------------------------------------


def test_parse_endpoints():
    assert parse_endpoints("127.0.0.1:1, 127.0.0.1:2") == ["127.0.0.1:1", "127.0.0.1:2"]
    assert parse_endpoints(["a:1,b:2", "c:3", "a:1"]) == ["a:1", "b:2", "c:3"]
    with pytest.raises(ConfigError):
        parse_endpoints("")
    with pytest.raises(ConfigError):
        parse_endpoints("nohost")


def test_sync_client_unreachable():
    with Client("127.0.0.1:1,127.0.0.1:2", timeout=5) as client:
        with pytest.raises(Unavailable) as info:
            client.status()
        assert "127.0.0.1:1" in str(info.value) and "127.0.0.1:2" in str(info.value)
        # Nothing reached a server: an append fails as Unavailable, not OutcomeUnknown.
        with pytest.raises(Unavailable) as info:
            client.append([b"x"])
        assert not isinstance(info.value, OutcomeUnknown)
        with pytest.raises(Unavailable):
            list(client.read())
    with pytest.raises(RlogError, match="closed"):
        client.status()


async def test_async_client_unreachable():
    async with AsyncClient(["127.0.0.1:1"], timeout=5) as client:
        with pytest.raises(Unavailable, match=r"cannot reach 127\.0\.0\.1:1"):
            await client.append_one("x")
        with pytest.raises(Unavailable):
            async for _ in client.read(stale=True):
                pass
        statuses = await client.statuses()
        assert isinstance(statuses["127.0.0.1:1"], Unavailable)


def test_percentile():
    values = sorted(float(v) for v in range(1, 101))
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([], 50) == 0


def test_replica_port_in_use(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = rlog(
            "replica", "--id", "0", "--peers", f"127.0.0.1:{port}", "--data-dir", str(tmp_path)
        )
    assert_one_line_error(result, 1, f"cannot listen on 127.0.0.1:{port}")


async def test_stream_append_unreachable():
    async with AsyncClient("127.0.0.1:1,127.0.0.1:2", stream=True) as client:
        with pytest.raises(Unavailable) as info:
            await client.append([b"x"])
        assert not isinstance(info.value, OutcomeUnknown)


def test_the_test_only_slow_self_delay_is_seconds_or_a_clear_error(monkeypatch):
    from rlog.config import SLOW_SELF_ENV, slow_self

    monkeypatch.delenv(SLOW_SELF_ENV, raising=False)
    assert slow_self() == 0.0
    monkeypatch.setenv(SLOW_SELF_ENV, "0.5")
    assert slow_self() == 0.5
    monkeypatch.setenv(SLOW_SELF_ENV, "-1")
    assert slow_self() == 0.0
    monkeypatch.setenv(SLOW_SELF_ENV, "abc")
    with pytest.raises(ConfigError, match="RLOG_TEST_SLOW_SELF='abc': not a number of seconds"):
        slow_self()


def test_building_the_command_line_leaves_the_progress_bar_unimported() -> None:
    # Every `rlog` command, a replica's start included, builds all subcommands' arguments;
    # tqdm (only `rlog bench` draws a bar) is ~45 ms of imports it must not pay.
    code = (
        "import sys\n"
        "from rlog.tools.cli import build_parser\n"
        "build_parser()\n"
        "print('tqdm' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"
