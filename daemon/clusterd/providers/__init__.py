"""Providers: where a cluster's nodes come from. One module per provider, one interface."""
