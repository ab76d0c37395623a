"""The archiver's Prometheus metrics (`rlog_archive_*`), served by `rlog archive run
--metrics-port`. The archiver is its own process, so they live in the default registry."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

ARCHIVED_POSITION = Gauge(
    "rlog_archive_archived_position", "The last log position the archive covers (-1: none)"
)
LOG_LEARNED_POSITION = Gauge(
    "rlog_archive_log_learned_position", "The log's learned position as the archiver last saw it"
)
LAG_POSITIONS = Gauge(
    "rlog_archive_lag_positions", "Learned positions not archived yet (log learned - archived)"
)
LAST_SEGMENT_TIMESTAMP = Gauge(
    "rlog_archive_last_segment_timestamp_seconds", "Unix time the last segment was archived"
)
SEGMENTS = Counter("rlog_archive_segments_total", "Segments uploaded and listed in the manifest")
BYTES = Counter("rlog_archive_bytes_total", "Bytes of segments uploaded")
ENTRIES = Counter("rlog_archive_entries_total", "APPEND entries archived")
ERRORS = Counter("rlog_archive_errors_total", "Archiving rounds that failed (then retried)")
DELETED_SEGMENTS = Counter(
    "rlog_archive_retention_deleted_segments_total", "Segments deleted by the retention rules"
)
POLLS = Counter("rlog_archive_polls_total", "Rounds of asking the log for news")
CONTROL_REFUSED = Counter(
    "rlog_archive_control_refused_total",
    "Callers the control port refused: no certificate, a name not allowed, a failed handshake",
)
