"""The controller engine: what every "keep this in a desired state" object runs on.

Managed jobs are its first user; worker pools, services and autostop are the next. A
controller is a subclass of `Controller` plus an `Engine` to run it. The contract:

Intent first. Each object has a record in the state DB (its intent: what the user asked for,
and every decision taken on the way: "relaunch", "end as FAILED then tear down"). A decision
is written to the record *before* it is acted on. `Controller.intent(key)` reads it (from the
store's memory; None once the object is final).

Observe, then step. `observe(intent)` reads what exists (cluster records, node states, the
daemon's own SSH connections to the nodes: `links.NodeLinks`). `step(intent, observed)` is a
pure function returning the next `Action` (a frozen dataclass) or None to stop: all the
decisions are there, and a unit test checks them in microseconds with made-up records.
`act(intent, action)` does it, through the same services a user's commands use, writing the
record as it goes. The engine loops: intent, observe, step, act, until the intent is None or
the step says stop.

Resume after kill -9 from the record alone. Because decisions are recorded first and `step`
reads only the record and what exists, a daemon killed at any instant starts a driver for
every unfinished object (`Engine.run(resume=...)`), and each goes on from where the record
says. Actions must therefore be idempotent: a launch of the object's one fixed cluster name,
a teardown of a cluster that may already be gone.

One driver per object. `Engine.spawn(key)` starts one (a no-op while one runs);
`Engine.cancel(key)` calls it off: its `act` is cancelled at its next checkpoint and then
`settle(key)` runs, uncancelled, to finish what the cancel asked (record the cancel first,
then cancel). The object's lock is held by its driver from its first step through `settle`:
a driver spawned meanwhile waits for it.

Events. Every change of the record is an event with a reason (the controller's store writes
them with the change, as `clusterctl jobs logs --controller` shows); the engine logs each
step at debug level with the object's key.

Bounded, jittered restart. Objects resumed at start-up wait a jittered delay and then take one
of a few slots (`restart.RestartPacer`) while they are brought back: until their first
`lasting` action (a watch: the object is where it should be) or their end. 200 jobs whose
clusters all need a relaunch launch 8 at a time, spread over 30 s, not 200 in one second.

Backoff on provider throttling. An action that failed is tried again after `retry.RetryGaps`:
growing gaps, and when the provider was throttling the account's requests, at least an
exponential, jittered backoff, so that controllers meeting the limit together do not retry
together.

Waking. A lasting action waits between looks with `Engine.pause(seconds)`, which
`Engine.wake()` ends at once for every driver: a controller that learns of a change outside
what it observes (budgets: the config file edited) looks again now, not a poll later.

Errors. A bug in a step (an exception out of `act`) goes to `failed(key, error)`, which must
end the object visibly; the daemon goes on.
"""

from clusterd.control.engine import Action, Controller, Engine
from clusterd.control.links import NodeLinks
from clusterd.control.restart import RestartPacer
from clusterd.control.retry import RetryGaps, is_throttling

__all__ = ["Action", "Controller", "Engine", "NodeLinks", "RestartPacer", "RetryGaps",
           "is_throttling"]
