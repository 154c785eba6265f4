"""The Kubernetes test bed (`scripts/testbed k8s ...`)."""
