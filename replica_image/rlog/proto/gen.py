"""Regenerate the protobuf/gRPC stubs: `python -m rlog.proto.gen` (or `make proto`).

`generate(out_dir)` is also used by tests/test_proto_stubs.py to check that the committed
stubs match the .proto file.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
PROTO = "rlog.proto"


def generate(out_dir: Path) -> None:
    from grpc_tools import protoc  # dev dependency only

    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"--plugin=protoc-gen-mypy={Path(sys.executable).parent / 'protoc-gen-mypy'}",
        f"--python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(PROTO_DIR / PROTO),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    # grpc_tools emits an absolute import; the stubs live inside the rlog.proto package.
    grpc_stub = out_dir / "rlog_pb2_grpc.py"
    text = grpc_stub.read_text()
    text = re.sub(r"^import rlog_pb2 as", "from rlog.proto import rlog_pb2 as", text, flags=re.M)
    grpc_stub.write_text(text)


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_DIR)
