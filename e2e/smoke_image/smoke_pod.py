"""Test pod program of the e2e smoke suite: a TCP server answering with its hostname.

    python3 smoke_pod.py [PORT]     (default 8080)

Each connection gets one line: "<hostname>\n". The suite drives everything else through
`kubectl exec ... python3 -c` with the standard library only.
"""

import socket
import socketserver
import sys


class Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        self.wfile.write((socket.gethostname() + "\n").encode())


class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8080
    with Server(("0.0.0.0", port), Handler) as srv:
        print(f"smoke_pod listening on :{port}", flush=True)
        srv.serve_forever()
