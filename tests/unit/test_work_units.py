"""scripts/test's split of the suite over workers (tests/work_units.py)."""

from __future__ import annotations

from pathlib import Path

from tests.work_units import unit_of

ROOT = Path(__file__).resolve().parents[2]


def test_modules_of_a_shared_bed_are_one_unit_and_the_rest_their_own() -> None:
    assert unit_of(ROOT, "tests/e2e/test_aws.py") == "ec2-bed"
    assert unit_of(ROOT, "tests/e2e/test_managed_jobs.py") == "ec2-bed"
    assert unit_of(ROOT, "tests/e2e/test_kubernetes.py") == "k8s-bed"
    # On both session beds: with the Kubernetes bed's modules.
    assert unit_of(ROOT, "tests/e2e/test_cross_failover.py") == "k8s-bed"
    assert unit_of(ROOT, "tests/e2e/test_ssh.py") == "ssh-bed"
    assert unit_of(ROOT, "tests/e2e/test_down_during_launch.py") == "ssh-bed"
    # Beds of their own: free to run beside the shared ones.
    for module in ("tests/e2e/test_ec2_images.py", "tests/e2e/test_aws_iam_bed.py",
                   "tests/integration/test_testbed_ec2.py", "tests/unit/test_settings.py"):
        assert unit_of(ROOT, module) == module
