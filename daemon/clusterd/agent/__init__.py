"""The agent: a gRPC server on each cluster's head node that keeps the job queue and runs jobs
on all nodes with Ray. Shipped to nodes as part of this package."""
