"""Finding the cluster: a matching kubeconfig context, else EKS token auth from AWS credentials."""

from __future__ import annotations

import json
import math
import time

import pytest

from tests.harness.eks_authenticator import EksAuthenticator
from tests.harness.scenario import Scenario

pytestmark = [pytest.mark.kube, pytest.mark.aws]


def _ready_cluster(scenario: Scenario) -> None:
    scenario.hyperpod(tiered_storage={"Mode": "Enable", "InstanceMemoryAllocationPercentage": 20})
    scenario.nodes(2)
    scenario.ai_toolkit()


def _next_second() -> None:
    """Wait for the clock's next second. The apiserver caches the webhook's answer per token for
    5 s, and a token (a presigned STS URL signed with a one-second timestamp) made in the same
    second as an earlier test's, with the same credentials, is the same string: that test's
    accepted token would be taken from the cache instead of asking the authenticator."""
    now = time.time()
    time.sleep(math.ceil(now) - now + 0.01)


def _daemonset_check(result) -> dict:
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    return checks["ai-toolkit-daemonset"]


def test_token_auth_with_aws_credentials_alone(
    scenario: Scenario, eks_authenticator: EksAuthenticator, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ready_cluster(scenario)
    monkeypatch.delenv("KUBECONFIG")  # and HOME has no ~/.kube/config
    eks_authenticator.reviews.clear()
    result = scenario.hpkv("tiered-storage", "status", "--cluster", "demo", "-o", "json")
    assert result.exit_code == 0, result
    assert _daemonset_check(result)["state"] == "ok"
    assert eks_authenticator.reviews and all(r["authenticated"] for r in eks_authenticator.reviews)
    assert eks_authenticator.reviews[0]["user"]["username"].startswith("eks:arn:aws:sts::")


def test_matching_context_is_preferred(
    scenario: Scenario, eks_authenticator: EksAuthenticator
) -> None:
    _ready_cluster(scenario)
    eks_authenticator.reviews.clear()
    result = scenario.hpkv("tiered-storage", "status", "--cluster", "demo", "-o", "json")
    assert result.exit_code == 0, result
    assert eks_authenticator.reviews == []  # the kubeconfig context (static token) was used


def test_kubeconfig_for_another_cluster_falls_back_to_token(
    scenario: Scenario, eks_authenticator: EksAuthenticator, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ready_cluster(scenario)
    other = scenario.workdir / "other-kubeconfig"
    other.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: elsewhere\n"
        "clusters: [{name: elsewhere, cluster: {server: 'https://10.255.255.1:6443'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: elsewhere, context: {cluster: elsewhere, user: u}}]\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(other))
    eks_authenticator.reviews.clear()
    result = scenario.hpkv("tiered-storage", "status", "--cluster", "demo", "-o", "json")
    assert result.exit_code == 0, result
    assert eks_authenticator.reviews and eks_authenticator.reviews[-1]["authenticated"]


def test_unmapped_identity_is_reported(
    scenario: Scenario, eks_authenticator: EksAuthenticator, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ready_cluster(scenario)
    monkeypatch.delenv("KUBECONFIG")
    _next_second()
    eks_authenticator.denied_arns.add("arn:aws:sts::123456789012:user/moto")
    try:
        result = scenario.hpkv("tiered-storage", "status", "--cluster", "demo", "-o", "json")
    finally:
        eks_authenticator.denied_arns.clear()
    assert result.exit_code == 3, result
    check = _daemonset_check(result)
    assert check["state"] == "unknown"
    assert "rejected the credentials (401 Unauthorized)" in check["evidence"]
