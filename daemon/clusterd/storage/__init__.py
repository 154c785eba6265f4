"""Buckets (S3) as file mounts: the daemon's side (making, uploading, deleting, recording)."""
