"""EKS access: cluster description (endpoint, CA, version, OIDC issuer)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpkv.aws import error_code, translate_errors
from hpkv.errors import NotFound

if TYPE_CHECKING:
    from hpkv.aws import AwsClients


def describe_cluster(aws: AwsClients, name: str) -> dict[str, Any]:
    import botocore.exceptions

    with translate_errors(f"eks:DescribeCluster on '{name}'"):
        try:
            return aws.eks.describe_cluster(name=name)["cluster"]
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) == "ResourceNotFoundException":
                raise NotFound(
                    f"EKS cluster '{name}' not found in {aws.region}",
                    fix="check --region; the HyperPod cluster's orchestrator points at it",
                ) from None
            raise


def oidc_issuer(cluster: dict[str, Any]) -> str | None:
    return ((cluster.get("identity") or {}).get("oidc") or {}).get("issuer")
