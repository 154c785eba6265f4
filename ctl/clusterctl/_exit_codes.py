"""clusterctl's exit codes as plain ints: the numbers behind protocol.ExitCode, which is made
from these. The command line uses them as they are, because the enum would cost importing
`enum` (3 ms) on every run, and a run that goes well needs no other enum."""

SUCCEEDED = 0
ERROR = 1
FAILED = 100
NOT_FINISHED = 101
NOT_FOUND = 102
CANCELLED = 103
