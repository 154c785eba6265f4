"""Managed jobs: a job that owns a cluster of its own, with the daemon as its controller.

`store` keeps the records (written through to SQLite before anything acts on them),
`transitions` says which status changes are allowed, `recovery` reads the task's recovery
policy, `steps` decides (pure functions of a job's record and its cluster's), and
`controller` does what they decide, as the first user of the controller engine
(clusterd.control), from PENDING to a final status.
"""
