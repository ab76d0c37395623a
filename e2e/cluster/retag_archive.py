"""Copy an image archive written by `docker save` keeping only the tags asked for:
`make release` ships `rlog-replica:0.2.0` alone, not the `dev` tag the local build also
carries. The archive is the docker-archive layout (`manifest.json` with RepoTags, and the
legacy `repositories` file); layers are copied byte for byte, so the image id is unchanged.

    python3 retag_archive.py IN.tar OUT.tar docker.io/rlog/rlog-replica:0.2.0 [...]

Exits 1 naming the tags when one asked for is not in the archive (a stale or wrong build)."""

from __future__ import annotations

import io
import json
import sys
import tarfile


def short(tag: str) -> str:
    """docker writes docker.io/<name> as <name> in RepoTags."""
    return tag.removeprefix("docker.io/")


def retag(source: str, target: str, keep: list[str]) -> None:
    wanted = {short(t) for t in keep}
    with tarfile.open(source) as src:
        manifest = json.load(src.extractfile("manifest.json"))  # type: ignore[arg-type]
        present = {t for entry in manifest for t in entry.get("RepoTags") or []}
        missing = wanted - present
        if missing:
            sys.exit(f"retag_archive: {sorted(missing)} not in {source} (it has {sorted(present)})")
        for entry in manifest:
            entry["RepoTags"] = [t for t in entry.get("RepoTags") or [] if t in wanted]
        rewritten = {"manifest.json": json.dumps(manifest).encode()}
        try:
            repositories = json.load(src.extractfile("repositories"))  # type: ignore[arg-type]
        except KeyError:
            repositories = None
        if repositories is not None:
            kept: dict[str, dict[str, str]] = {}
            for repo, tags in repositories.items():
                for tag, image in tags.items():
                    if f"{repo}:{tag}" in wanted:
                        kept.setdefault(repo, {})[tag] = image
            rewritten["repositories"] = json.dumps(kept).encode()
        with tarfile.open(target, "w") as out:
            for member in src:
                if member.name in rewritten:
                    data = rewritten[member.name]
                    info = tarfile.TarInfo(member.name)
                    info.size, info.mtime, info.mode = len(data), member.mtime, member.mode
                    out.addfile(info, io.BytesIO(data))
                elif member.isfile():
                    out.addfile(member, src.extractfile(member))
                else:
                    out.addfile(member)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    retag(sys.argv[1], sys.argv[2], sys.argv[3:])
