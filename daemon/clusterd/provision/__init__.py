"""Provisioning: candidates and their placements, failover between them, attempts."""
