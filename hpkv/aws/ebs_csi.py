"""The EBS CSI driver as an EKS add-on, with an IRSA role that HyperPod nodes need.

On HyperPod, EBS volumes are attached through SageMaker (``sagemaker:AttachClusterNodeVolume`` /
``DetachClusterNodeVolume``) and the driver describes the EKS cluster; without these permissions an
attach fails with ValidationException. The role therefore carries the AWS managed
``AmazonEBSCSIDriverPolicy`` plus an inline policy with those actions.

Only what is specific to the EBS CSI driver lives here (names, the service account, the policies);
IAM, IRSA and add-on access is :mod:`hpkv.aws.iam`, :mod:`hpkv.aws.irsa`, :mod:`hpkv.aws.eks` and
:mod:`hpkv.aws.addon_plan`.
"""

from __future__ import annotations

from typing import Any

from hpkv.aws import iam
from hpkv.aws.irsa import IrsaRole

ADDON_NAME = "aws-ebs-csi-driver"
SERVICE_ACCOUNT_NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "ebs-csi-controller-sa"
SUBJECT = iam.service_account_subject(SERVICE_ACCOUNT_NAMESPACE, SERVICE_ACCOUNT)
MANAGED_POLICY_ARN = "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy"
INLINE_POLICY_NAME = "hpkv-hyperpod-volume-attach"
HYPERPOD_ACTIONS = (
    "sagemaker:AttachClusterNodeVolume",
    "sagemaker:DetachClusterNodeVolume",
    "eks:Describe*",
)
PURPOSE_TAG = {"Key": "hpkv:purpose", "Value": "ebs-csi-irsa"}
ROLE_TITLE = "EBS CSI driver role"
INLINE_PURPOSE = "allow " + ", ".join(HYPERPOD_ACTIONS) + ": HyperPod volume attach"


def default_role_name(eks_cluster: str) -> str:
    return f"hpkv-{eks_cluster}-ebs-csi"[:64]


def hyperpod_volume_policy() -> dict[str, Any]:
    return iam.policy_document(
        [
            {
                "Sid": "HyperPodNodeVolumeAttach",
                "Effect": "Allow",
                "Action": list(HYPERPOD_ACTIONS),
                "Resource": "*",
            }
        ]
    )


def hpkv_role(name: str, account: str, issuer: str) -> IrsaRole:
    """The role hpkv creates: trusted by the controller's service account through the cluster's
    OIDC issuer, with the managed EBS CSI policy and the HyperPod inline policy."""
    provider = iam.oidc_provider_arn(account, issuer)
    return IrsaRole(
        name=name,
        title=ROLE_TITLE,
        subject=SUBJECT,
        trust=[iam.irsa_statement(provider, issuer, SUBJECT)],
        managed=(MANAGED_POLICY_ARN,),
        inline=(INLINE_POLICY_NAME, hyperpod_volume_policy()),
        inline_purpose=INLINE_PURPOSE,
        description="EBS CSI driver on HyperPod (managed by hpkv)",
        tags=[*iam.MANAGED_TAGS, PURPOSE_TAG],
    )


def users_role(name: str) -> IrsaRole:
    """A role the add-on already runs with: hpkv adds only the HyperPod inline policy (its trust
    and other policies are the user's)."""
    return IrsaRole(
        name=name,
        title=f"{ROLE_TITLE} (the add-on's own)",
        inline=(INLINE_POLICY_NAME, hyperpod_volume_policy()),
        inline_purpose=INLINE_PURPOSE,
    )
