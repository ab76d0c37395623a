"""The committed protobuf/gRPC stubs must match rlog.proto (regenerate: `make proto`)."""

from __future__ import annotations

from pathlib import Path

from rlog.proto import gen

STUBS = ("rlog_pb2.py", "rlog_pb2.pyi", "rlog_pb2_grpc.py")


def test_stubs_are_up_to_date(tmp_path: Path) -> None:
    gen.generate(tmp_path)
    stale = [
        name
        for name in STUBS
        if (tmp_path / name).read_text() != (gen.PROTO_DIR / name).read_text()
    ]
    assert not stale, f"stale generated stubs {stale}: run `make proto` and commit them"
