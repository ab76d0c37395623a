"""The Lease I/O of `election`: stand by until this replica holds the Lease, then keep it.

Run in plain threads around `kopf.run` (rlog_operator.main): the standby loop before kopf
starts, the renewal loop beside it. The decisions are `election.decide`'s.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException

from rlog_operator import election, kube

log = logging.getLogger(__name__)


def _now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _record(lease: Any) -> election.LeaseRecord:
    spec = lease.spec
    renewed = spec.renew_time
    return election.LeaseRecord(
        holder=str(spec.holder_identity or ""),
        duration=float(spec.lease_duration_seconds or election.LEASE_SECONDS),
        renewed=renewed.isoformat() if hasattr(renewed, "isoformat") else str(renewed or ""),
        transitions=int(spec.lease_transitions or 0),
        version=str(lease.metadata.resource_version or ""),
    )


class LeaseElector:
    """Holds the Lease `name` in `namespace` as `identity`."""

    def __init__(self, name: str, namespace: str, identity: str) -> None:
        self.name, self.namespace, self.identity = name, namespace, identity
        self.api = kube.coordination()
        self._sighting: election.Sighting | None = None
        self._record: election.LeaseRecord | None = None

    def _read(self) -> election.LeaseRecord | None:
        try:
            return _record(self.api.read_namespaced_lease(self.name, self.namespace))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def _write(self, record: election.LeaseRecord | None, spec: dict[str, object]) -> bool:
        """Create or replace (with the resourceVersion read); False on a conflict."""
        metadata: dict[str, object] = {"name": self.name, "namespace": self.namespace}
        if record is not None:
            metadata["resourceVersion"] = record.version
        # a plain manifest (the client serializes dicts as they are)
        body: Any = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }
        try:
            if record is None:
                lease = self.api.create_namespaced_lease(self.namespace, body)
            else:
                lease = self.api.replace_namespaced_lease(self.name, self.namespace, body)
        except ApiException as e:
            if e.status in (409, 422):  # another replica wrote first
                return False
            raise
        self._record = _record(lease)
        return True

    def try_hold(self) -> bool:
        """One look at the Lease: create, renew or take it over if `decide` says so."""
        record = self._read()
        now = time.monotonic()
        if record is not None:
            self._sighting = election.seen(self._sighting, record, now)
        decision = election.decide(self.identity, record, self._sighting, now)
        if decision == "wait":
            return False
        held = self._write(record, election.lease_spec(self.identity, record, _now_rfc3339()))
        if held and decision != "renew":
            log.info("holding the Lease %s/%s (%s)", self.namespace, self.name, decision)
        return held

    def acquire(self) -> None:
        """Stand by until this replica holds the Lease."""
        log.info("standing by for the Lease %s/%s as %s", self.namespace, self.name, self.identity)
        while True:
            try:
                if self.try_hold():
                    return
            except Exception as e:  # the API server unreachable: keep standing by
                log.warning("reading the Lease failed: %s", e)
            time.sleep(election.POLL_EVERY)

    def keep(self, on_lost: Callable[[str], None]) -> threading.Thread:
        """Renew in a daemon thread; `on_lost(why)` once it could not renew for
        RENEW_DEADLINE seconds or another replica holds the Lease."""

        def renew() -> None:
            last = time.monotonic()
            while True:
                time.sleep(election.RENEW_EVERY)
                try:
                    if self.try_hold():
                        last = time.monotonic()
                        continue
                    record = self._read()
                    if record is not None and record.holder not in ("", self.identity):
                        on_lost(f"{record.holder} holds the Lease")
                        return
                except Exception as e:
                    log.warning("renewing the Lease failed: %s", e)
                if time.monotonic() - last > election.RENEW_DEADLINE:
                    on_lost(f"not renewed for {election.RENEW_DEADLINE:g} s")
                    return

        thread = threading.Thread(target=renew, name="lease-renewal", daemon=True)
        thread.start()
        return thread

    def release(self) -> None:
        """Give the Lease up (a clean stop): a standby takes over at its next look."""
        try:
            record = self._read()
            if record is not None and record.holder == self.identity:
                self._write(record, election.released_spec(record))
                log.info("released the Lease %s/%s", self.namespace, self.name)
        except Exception as e:  # it expires by itself
            log.warning("releasing the Lease failed: %s", e)
