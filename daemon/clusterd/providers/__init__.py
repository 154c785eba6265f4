"""Providers: where a cluster's nodes come from. One module (or package) per provider, one
interface (base.py).

A new provider is its own module: its class (implementing `ProviderOf[ItsHandle]`, and saying
what the daemon needs to know of it) and its handle dataclass (`ProviderHandle` declared with
the provider's name); then one line in offered.py builds it into the daemon.
"""
