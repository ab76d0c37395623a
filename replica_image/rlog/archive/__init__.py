"""Continuous archiving of a log's learned entries to S3-compatible object storage, and
restore into a new log (docs/backup.md)."""
