"""The health engine's AWS client preparation: which services a run over given sections needs,
in the order it first needs them."""

from __future__ import annotations

from hpkv.config import Settings
from hpkv.context import RunContext
from hpkv.health.engine import aws_services
from hpkv.health.sections import sections


def _services(settings: dict[str, str], only: list[str] | None = None) -> list[str]:
    ctx = RunContext(Settings({"cluster": "demo", **settings}))
    return aws_services(ctx, sections(ctx, only))


def test_a_full_run_prepares_the_cluster_reads_first_then_each_stage_s_services() -> None:
    # SageMaker, then EKS DescribeCluster (and STS for a token) lead to Kubernetes; the operator
    # checks IAM roles and the TLS bucket (S3)
    assert _services({}) == ["sagemaker", "eks", "sts", "iam", "s3"]


def test_only_the_services_of_the_chosen_stages() -> None:
    assert _services({"context": "prod"}, ["l2", "bench"]) == []  # Kubernetes only
    assert _services({"context": "prod"}, ["tiered-storage"]) == ["sagemaker"]
    assert _services({"context": "prod"}, ["curvine"]) == ["eks", "iam"]
    # without --context, Kubernetes access itself starts from SageMaker and EKS
    assert _services({}, ["l2"]) == ["sagemaker", "eks", "sts"]
