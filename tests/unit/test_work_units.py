"""scripts/test's split of the suite over workers (tests/work_units.py)."""

from __future__ import annotations

from pathlib import Path

from tests.work_units import unit_of

ROOT = Path(__file__).resolve().parents[2]


def test_the_modules_of_beds_are_one_unit_and_the_rest_their_own() -> None:
    for module in ("tests/e2e/test_aws.py", "tests/e2e/test_managed_jobs.py",
                   "tests/e2e/test_kubernetes.py", "tests/e2e/test_cross_failover.py",
                   "tests/e2e/test_ec2_images.py", "tests/e2e/test_aws_iam_bed.py",
                   "tests/integration/test_testbed_ec2.py",
                   "tests/integration/test_testbed_k8s.py"):
        assert unit_of(ROOT, module) == "beds", module
    assert unit_of(ROOT, "tests/e2e/test_ssh.py") == "ssh-bed"
    assert unit_of(ROOT, "tests/e2e/test_down_during_launch.py") == "ssh-bed"
    for module in ("tests/e2e/test_jobs.py", "tests/unit/test_settings.py"):
        assert unit_of(ROOT, module) == module
