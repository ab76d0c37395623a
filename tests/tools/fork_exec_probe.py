"""Fork-then-exec beside busy gRPC threads, as PySpark starts its JVM: a subprocess with a
preexec_fn (which forks rather than spawns) while four threads call a real gRPC server.
Prints how many of the children failed to reach exec. Run by tests/tools/test_fork_exec.py in a
process of its own, since a child that hangs before exec hangs its parent in Popen too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from concurrent import futures

import grpc


def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
    return request


def ignore_interrupts() -> None:  # what PySpark's launch_gateway passes as preexec_fn
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def main(forks: int) -> int:
    server = grpc.server(futures.ThreadPoolExecutor(4))
    handler = grpc.method_handlers_generic_handler(
        "t", {"echo": grpc.unary_unary_rpc_method_handler(echo)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stop = threading.Event()

    def call() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            method = channel.unary_unary("/t/echo")
            while not stop.is_set():
                method(b"x" * 100, timeout=5)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    failed = 0
    for _ in range(forks):
        child = subprocess.Popen(
            ["/bin/true"],
            stdin=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            preexec_fn=ignore_interrupts,
        )
        child.stdin.close()  # type: ignore[union-attr]
        failed += child.wait() != 0
    stop.set()
    for thread in threads:
        thread.join()
    server.stop(None)
    print(f"{failed} of {forks} children failed before exec", flush=True)
    return 0


if __name__ == "__main__":
    code = main(int(sys.argv[1]))
    os._exit(code)  # without waiting on gRPC's own threads at interpreter exit
