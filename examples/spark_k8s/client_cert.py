#!/usr/bin/env python3
"""Issue a client certificate of a ReplicatedLog's client CA into a Secret, for Spark jobs.

    python examples/spark_k8s/client_cert.py orders -n default --cn spark-reader
    # -> Secret orders-spark-client (ca.crt, tls.crt, tls.key), mounted by spark-submit.sh

A log in `spec.tls.mode: operator` (the default) is mutual TLS with two CAs the operator
keeps (docs/security.md, "PKI"): the client CA (`<log>-tls-ca`) issues clients'
certificates, the peer CA (`<log>-tls-peer-ca`) the replicas' and the operator's. A client
needs a certificate of the client CA, and a role from the log's `spec.auth.subjects` for
its name (examples/spark_k8s/log.yaml gives `spark-reader` the read role, all a reading job
needs); it verifies the replicas with the peer CA's certificate (`peer-ca.crt` of
`<log>-tls-ca`, ca.crt of the client's Secret).

NOTE: this script still reads the client CA's key, so it needs `get` on `<log>-tls-ca`: run
it as the log's owner, not from the job. That key can only make clients: whatever name it
signs (even a replica's or `rlog-operator`), the replicas never make it a peer or an admin.
Until the operator issues client certificates itself (a planned `kubectl rlog
certificate`), this is the one place a CA key leaves the operator. The certificate is valid
for `--days` (default 30); issue it again before then (the replicas need no restart).
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys

from rlog.certs import Pem, issue


def kubectl(namespace: str, *args: str, stdin: str | None = None) -> str:
    out = subprocess.run(
        ["kubectl", "-n", namespace, *args], input=stdin, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="the ReplicatedLog's name")
    parser.add_argument("-n", "--namespace", default="default")
    parser.add_argument("--cn", default="spark-reader", help="the certificate's common name")
    parser.add_argument("--secret", help="Secret to write (default <log>-spark-client)")
    parser.add_argument("--days", type=float, default=30)
    args = parser.parse_args(argv)

    ca_secret = kubectl(args.namespace, "get", "secret", f"{args.log}-tls-ca", "-o", "json")
    data = json.loads(ca_secret)["data"]
    ca = Pem(base64.b64decode(data["ca.crt"]), base64.b64decode(data["ca.key"]))
    client = issue(ca, args.cn, days=args.days)
    # What verifies the replicas: the peer CA's certificate, which the operator keeps in the
    # client CA's Secret too; a log of an operator before the peer CA has one CA for all.
    server_ca = data.get("peer-ca.crt") or data["ca.crt"]
    secret = args.secret or f"{args.log}-spark-client"
    manifest = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": secret, "labels": {"rlog.io/log": args.log}},
        "type": "Opaque",
        "data": {
            "ca.crt": server_ca,
            "tls.crt": base64.b64encode(client.cert).decode(),
            "tls.key": base64.b64encode(client.key).decode(),
        },
    }
    kubectl(args.namespace, "apply", "-f", "-", stdin=json.dumps(manifest))
    print(f"secret/{secret}: CN={args.cn}, signed by the client CA of {args.log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
