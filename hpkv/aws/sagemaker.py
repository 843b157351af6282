"""SageMaker HyperPod cluster access: DescribeCluster, UpdateCluster and a ClusterInService waiter."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from hpkv.aws import error_code, error_message, translate_errors
from hpkv.errors import NotFound, PreconditionFailed, WaitTimeout

if TYPE_CHECKING:
    from hpkv.aws import AwsClients

WAIT_DELAY_SECONDS = 15


def describe_cluster(aws: AwsClients, name: str) -> dict[str, Any]:
    import botocore.exceptions

    with translate_errors(f"sagemaker:DescribeCluster on '{name}'"):
        try:
            response = aws.sagemaker.describe_cluster(ClusterName=name)
        except botocore.exceptions.ClientError as exc:
            code, message = error_code(exc), error_message(exc)
            if code in ("ResourceNotFound", "ResourceNotFoundException") or (
                code == "ValidationException" and "not found" in message.lower()
            ):
                raise NotFound(
                    f"HyperPod cluster '{name}' not found in {aws.region}",
                    fix="check --cluster and --region ('aws sagemaker list-clusters' lists them)",
                ) from None
            raise
    response.pop("ResponseMetadata", None)
    return response


def list_clusters(aws: AwsClients) -> list[dict[str, Any]]:
    with translate_errors("sagemaker:ListClusters"):
        paginator = aws.sagemaker.get_paginator("list_clusters")
        return [c for page in paginator.paginate() for c in page.get("ClusterSummaries", [])]


def eks_cluster_arn(cluster: dict[str, Any]) -> str | None:
    return (cluster.get("Orchestrator") or {}).get("Eks", {}).get("ClusterArn")


def eks_cluster_name(cluster: dict[str, Any]) -> str | None:
    arn = eks_cluster_arn(cluster)
    return arn.rsplit("/", 1)[-1] if arn else None


def update_cluster(aws: AwsClients, name: str, **fields: Any) -> dict[str, Any]:
    with translate_errors(f"sagemaker:UpdateCluster on '{name}'"):
        response = aws.sagemaker.update_cluster(ClusterName=name, **fields)
    response.pop("ResponseMetadata", None)
    return response


def _waiter_model(name: str, success_path: str, delay: float, max_attempts: int) -> Any:
    from botocore.waiter import WaiterModel

    return WaiterModel(
        {
            "version": 2,
            "waiters": {
                name: {
                    "operation": "DescribeCluster",
                    "delay": delay,
                    "maxAttempts": max_attempts,
                    "acceptors": [
                        {
                            "matcher": "path",
                            "argument": success_path,
                            "expected": True,
                            "state": "success",
                        },
                        {
                            "matcher": "path",
                            "argument": "ClusterStatus",
                            "expected": "Failed",
                            "state": "failure",
                        },
                        {"matcher": "error", "expected": "ResourceNotFound", "state": "failure"},
                    ],
                }
            },
        }
    )


def wait_for_cluster(
    aws: AwsClients,
    name: str,
    *,
    timeout: float,
    condition: str = "ClusterStatus == 'InService'",
    what: str = "InService",
    delay: float = WAIT_DELAY_SECONDS,
) -> dict[str, Any]:
    """Wait with a botocore waiter until the JMESPath ``condition`` on DescribeCluster is true."""
    from botocore.waiter import WaiterError, create_waiter_with_client

    delay = max(0.01, float(delay))
    attempts = max(1, math.ceil(timeout / delay))
    model = _waiter_model("ClusterCondition", condition, delay, attempts)
    waiter = create_waiter_with_client("ClusterCondition", model, aws.sagemaker)
    try:
        with translate_errors(f"wait for cluster '{name}' to be {what}"):
            waiter.wait(ClusterName=name)
    except WaiterError as exc:
        last = exc.last_response or {}
        status = last.get("ClusterStatus", "unknown")
        if "Max attempts exceeded" in str(exc):
            raise WaitTimeout(
                f"cluster '{name}' was not {what} within {int(timeout)}s (status {status})",
                fix="rerun later (the change continues in AWS) or raise --timeout",
            ) from None
        failure = last.get("FailureMessage") or status
        raise PreconditionFailed(
            f"cluster '{name}' entered {status} while waiting to be {what}: {failure}",
            fix="see the cluster's events in the SageMaker console, fix the cause, and rerun",
        ) from None
    return describe_cluster(aws, name)
