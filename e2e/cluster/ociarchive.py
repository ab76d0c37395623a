#!/usr/bin/env python3
"""Turn a root filesystem directory into a single-layer OCI image archive.

The archive (oci-layout, index.json with io.containerd.image.name, blobs/sha256/...) is
what `ctr -n k8s.io images import` and `docker load` accept, so small images (our pause,
busybox) need neither a registry nor a Docker daemon.

    ociarchive.py ROOTFS NAME OUT.tar --entrypoint /pause [--cmd sh] [--user 65535]
"""

import argparse
import hashlib
import io
import json
import os
import tarfile
import time


def layer_tar(rootfs: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(rootfs):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                path = os.path.join(dirpath, name)
                info = tar.gettarinfo(path, arcname=os.path.relpath(path, rootfs))
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mtime = 0
                if info.isfile():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return buf.getvalue()


def blob(tar: tarfile.TarFile, data: bytes, media_type: str) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    info.mtime = int(time.time())
    tar.addfile(info, io.BytesIO(data))
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rootfs")
    ap.add_argument("name", help="fully qualified, e.g. registry.k8s.io/pause:3.10")
    ap.add_argument("out")
    ap.add_argument("--entrypoint", nargs="*", default=[])
    ap.add_argument("--cmd", nargs="*", default=[])
    ap.add_argument("--user", default="")
    ap.add_argument(
        "--env",
        action="append",
        default=["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
    )
    a = ap.parse_args()

    layer = layer_tar(a.rootfs)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "Env": a.env,
            "Entrypoint": a.entrypoint or None,
            "Cmd": a.cmd or None,
            "User": a.user,
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "e2e/cluster/ociarchive.py"}],
    }
    tmp = a.out + ".tmp"
    with tarfile.open(tmp, "w") as tar:
        layer_desc = blob(tar, layer, "application/vnd.oci.image.layer.v1.tar")
        config_desc = blob(
            tar, json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json"
        )
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config_desc,
            "layers": [layer_desc],
        }
        man_desc = blob(
            tar, json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json"
        )
        man_desc["annotations"] = {
            "io.containerd.image.name": a.name,
            "org.opencontainers.image.ref.name": a.name.rsplit(":", 1)[-1],
        }
        for fname, data in (
            ("oci-layout", {"imageLayoutVersion": "1.0.0"}),
            ("index.json", {"schemaVersion": 2, "manifests": [man_desc]}),
        ):
            raw = json.dumps(data).encode()
            info = tarfile.TarInfo(fname)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
