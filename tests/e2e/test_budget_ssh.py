"""A monthly budget that acts, on the ssh bed (issue 39 §3): a pool priced so that a cluster
spends past a $1 budget in seconds; the budget controller (reading the real ledger) tears the
cluster down (an ssh pool cannot stop), says so on every clusterctl command, refuses the next
launch naming the budget and how to raise it (as `--dryrun` foretells), and lets the very
next launch go once it is raised (no poll waited for)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.sshbed import Bed, ssh_bed
from tests.support import wait_for

pytestmark = pytest.mark.ray

PRICE = 360_000.0  # dollars per host and hour: $100 a second, past $1 at once
POLL_S = 30  # the controller's look at each budget (cost/budget_controller.py)


@pytest.fixture(scope="module")
def bed() -> Iterator[Bed]:
    with ssh_bed(1) as made:
        made.price_pool(PRICE)
        yield made


def config_file(bed: Bed) -> Path:
    return Path(bed.daemon.env["XDG_CONFIG_HOME"]) / "clusterd" / "config.yaml"


def test_a_budget_past_its_limit_tears_down_refuses_and_clears(bed: Bed) -> None:
    ctl = bed.daemon.ctl
    launch = ctl("launch", "-c", "spender", "--infra", "ssh/testbed", "--", "echo hi",
                 timeout=900)
    assert launch.returncode == 0, launch.stderr + bed.daemon.log()[-3000:]
    config_file(bed).write_text(yaml.safe_dump(
        {"budget": {"monthly": 1, "warn_at": 0.5, "action": "stop"}}))

    def names() -> list[str]:
        return [c["name"] for c in json.loads(ctl("status", "--json").stdout)]

    # Acted on within a poll or two: torn down (the ssh provider cannot stop nodes).
    wait_for(lambda: "spender" not in names(), 3 * POLL_S + 60, "the budget to act")
    said = ctl("status")
    assert "budget" in said.stderr and "$1" in said.stderr, said.stderr
    requests = json.loads(ctl("requests", "--all", "--json").stdout)
    seen = [*requests.get("running", []), *requests.get("recent", [])]
    assert any(r["op"] == "down" and r.get("cluster") == "spender" for r in seen), requests

    refused = ctl("launch", "-c", "again", "--infra", "ssh/testbed", "--", "true", timeout=300)
    assert refused.returncode != 0
    text = " ".join(refused.stderr.split())
    assert "monthly budget of $1 is exceeded" in text, refused.stderr
    assert "budget.monthly" in text and str(config_file(bed)) in text, refused.stderr

    plan = json.loads(ctl("launch", "--dryrun", "--json", "-c", "again", "--infra",
                          "ssh/testbed", "--", "true").stdout)
    assert "monthly budget of $1 is exceeded" in plan["budget"]["refused"], plan
    assert plan["budget"]["budgets"][0]["left"] == 0

    config_file(bed).write_text(yaml.safe_dump({"budget": {"monthly": 1e12}}))
    plan = json.loads(ctl("launch", "--dryrun", "--json", "-c", "again", "--infra",
                          "ssh/testbed", "--", "true").stdout)
    assert plan["budget"]["refused"] is None and plan["placement"]["infra"] == "ssh/testbed"
    raised = ctl("launch", "-c", "again", "--infra", "ssh/testbed", "--", "true", timeout=900)
    assert raised.returncode == 0, raised.stderr
    assert ctl("down", "-y", "again", timeout=300).returncode == 0
