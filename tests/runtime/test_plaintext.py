"""What a plaintext replica allows, as pure decisions (runtime/plaintext.py); the live
checks are tests/runtime/test_plaintext_live.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlog.config import ConfigError, ReplicaConfig
from rlog.runtime.plaintext import (
    admin_callers,
    admin_refusal,
    listen_addresses,
    listen_refusal,
    peer_is_loopback,
)


def config(**fields: object) -> ReplicaConfig:
    return ReplicaConfig(id=0, peers=["127.0.0.1:7000"], data_dir=Path("/nonexistent"), **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("peer", "loopback"),
    [
        ("ipv4:127.0.0.1:5000", True),
        ("ipv4:127.0.0.2:5000", True),
        ("ipv6:[::1]:5000", True),
        ("ipv6:%5B::1%5D:5000", True),
        ("ipv6:[::ffff:127.0.0.1]:5000", True),
        ("unix:/tmp/rlog.sock", True),
        ("ipv4:192.0.2.7:5000", False),
        ("ipv6:[fd00::2]:5000", False),
        ("ipv6:[::ffff:10.0.0.1]:5000", False),
        ("", False),
        ("something:else", False),
    ],
)
def test_loopback_peers(peer: str, loopback: bool) -> None:
    assert peer_is_loopback(peer) is loopback


def test_admin_in_plaintext_is_for_loopback_unless_opened() -> None:
    plain = config()
    assert admin_refusal(plain, "ipv4:127.0.0.1:5000") == ""
    assert "loopback only, not ipv4:10.1.2.3:5000" in admin_refusal(plain, "ipv4:10.1.2.3:5000")
    assert admin_callers(plain) == "loopback"
    opened = config(admin_from_anywhere=True)
    assert admin_refusal(opened, "ipv4:10.1.2.3:5000") == ""
    assert admin_callers(opened) == "anywhere"


def test_plaintext_listens_beyond_loopback_only_with_insecure() -> None:
    plain = config(listen="0.0.0.0:7000")
    assert listen_addresses("0.0.0.0:7000") == ["0.0.0.0"]
    assert "refusing to serve PLAINTEXT" in listen_refusal(plain, ["0.0.0.0"])
    assert "does not resolve" in listen_refusal(plain, [])
    assert listen_refusal(plain, ["127.0.0.1", "::1"]) == ""
    assert listen_refusal(config(listen="0.0.0.0:7000", insecure=True), ["0.0.0.0"]) == ""
    assert set(listen_addresses("localhost:7000")) <= {"127.0.0.1", "::1"}


@pytest.mark.parametrize("flag", ["insecure", "admin_from_anywhere"])
def test_the_plaintext_flags_are_refused_with_tls(flag: str) -> None:
    with pytest.raises(ConfigError, match="is for a replica without TLS"):
        config(tls_cert=Path("/c.pem"), tls_key=Path("/k.pem"), **{flag: True})
