"""Managed jobs: a job that owns a cluster of its own, with the daemon as its controller.

`store` keeps the records (written through to SQLite before anything acts on them),
`transitions` says which status changes are allowed, `recovery` reads the task's recovery
policy, and `controller` drives each job from PENDING to a final status.
"""
