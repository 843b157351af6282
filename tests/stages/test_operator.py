"""Stage 2 building blocks that need no cluster: version choice, trust-policy drift, names, remedies."""

from __future__ import annotations

import json

import pytest

from hpkv.errors import ConfigError, PreconditionFailed
from hpkv.stages.operator import (
    ADDONS,
    ROLES,
    choose_version,
    default_tls_bucket,
    remedies,
    role_name,
    trust_drift,
)

METRICS = next(a for a in ADDONS if a.name == "metrics-server")


def _versions(*entries: tuple[str, bool]) -> list[dict]:
    return [
        {
            "addonVersion": version,
            "compatibilities": [{"clusterVersion": "1.33", "defaultVersion": default}],
        }
        for version, default in entries
    ]


VERSIONS = _versions(
    ("v0.8.0-eksbuild.2", False), ("v0.7.2-eksbuild.4", True), ("v0.7.2-eksbuild.10", False)
)


def test_default_version_is_the_one_eks_flags_for_the_kubernetes_version() -> None:
    assert choose_version(METRICS, "default", VERSIONS, "1.33", None) == (
        "v0.7.2-eksbuild.4",
        "default for Kubernetes 1.33",
    )


def test_default_keeps_an_installed_version_at_or_above_the_minimum() -> None:
    version, why = choose_version(METRICS, "default", VERSIONS, "1.33", "v0.8.0-eksbuild.2")
    assert (version, why) == ("v0.8.0-eksbuild.2", "installed version kept")
    below = choose_version(METRICS, "default", VERSIONS, "1.33", "v0.7.2-eksbuild.3")
    assert below[0] == "v0.7.2-eksbuild.4"


def test_latest_sorts_numerically_including_the_build() -> None:
    assert choose_version(METRICS, "latest", VERSIONS, "1.33", None)[0] == "v0.8.0-eksbuild.2"
    only_builds = _versions(("v0.7.2-eksbuild.4", True), ("v0.7.2-eksbuild.10", False))
    assert choose_version(METRICS, "latest", only_builds, "1.33", None)[0] == "v0.7.2-eksbuild.10"


def test_pinned_and_partial_versions() -> None:
    assert choose_version(METRICS, "v0.7.2-eksbuild.4", VERSIONS, "1.33", None)[1] == "pinned"
    assert choose_version(METRICS, "0.7.2", VERSIONS, "1.33", None) == (
        "v0.7.2-eksbuild.10",
        "newest build of v0.7.2",
    )
    with pytest.raises(ConfigError, match=r"metrics-server v9\.9\.9 is not available"):
        choose_version(METRICS, "v9.9.9", VERSIONS, "1.33", None)


def test_no_versions_for_the_kubernetes_version() -> None:
    with pytest.raises(PreconditionFailed, match=r"no metrics-server add-on for Kubernetes 1\.40"):
        choose_version(METRICS, "default", [], "1.40", None)


PROVIDER = "arn:aws:iam::123456789012:oidc-provider/oidc.eks.us-west-2.amazonaws.com/id/ABC"
HOST = "oidc.eks.us-west-2.amazonaws.com/id/ABC"
WEB = {
    "Effect": "Allow",
    "Principal": {"Federated": PROVIDER},
    "Action": "sts:AssumeRoleWithWebIdentity",
    "Condition": {
        "StringEquals": {
            f"{HOST}:sub": "system:serviceaccount:ns:sa",
            f"{HOST}:aud": "sts.amazonaws.com",
        }
    },
}
SAGEMAKER = {
    "Effect": "Allow",
    "Principal": {"Service": "sagemaker.amazonaws.com"},
    "Action": "sts:AssumeRole",
}


def test_no_drift_when_statements_match_in_any_order_with_sids_and_lists() -> None:
    live = {
        "Version": "2012-10-17",
        "Statement": [
            {**WEB, "Sid": "Irsa", "Action": ["sts:AssumeRoleWithWebIdentity"]},
            {**SAGEMAKER, "Principal": {"Service": ["sagemaker.amazonaws.com"]}},
            {
                "Effect": "Allow",
                "Principal": {"Service": "ec2.amazonaws.com"},
                "Action": "sts:AssumeRole",
            },
        ],
    }
    assert trust_drift(live, [SAGEMAKER, WEB]) is None


def test_drift_names_what_is_missing_and_keeps_other_principals() -> None:
    other = {
        "Effect": "Allow",
        "Principal": {"AWS": "arn:aws:iam::1:root"},
        "Action": "sts:AssumeRole",
    }
    wrong = json.loads(json.dumps(WEB).replace("ns:sa", "ns:other"))
    drift = trust_drift({"Version": "2012-10-17", "Statement": [wrong, other]}, [SAGEMAKER, WEB])
    assert drift is not None
    assert drift.summary == (
        "lacks sts:AssumeRole for sagemaker.amazonaws.com; sts:AssumeRoleWithWebIdentity for "
        "system:serviceaccount:ns:sa via oidc-provider/oidc.eks.us-west-2.amazonaws.com/id/ABC"
    )
    assert drift.fixed["Statement"] == [other, SAGEMAKER, WEB]
    assert f'-          "{HOST}:sub": "system:serviceaccount:ns:other"' in drift.diff
    assert f'+          "{HOST}:sub": "system:serviceaccount:ns:sa"' in drift.diff


def test_drift_on_a_url_encoded_document() -> None:
    from urllib.parse import quote

    encoded = quote(json.dumps({"Version": "2012-10-17", "Statement": [SAGEMAKER]}))
    drift = trust_drift(encoded, [SAGEMAKER, WEB])
    assert drift is not None and "AssumeRoleWithWebIdentity" in drift.summary


def test_role_and_bucket_names_fit_aws_limits() -> None:
    execution = next(r for r in ROLES if r.key == "execution")
    alb = next(r for r in ROLES if r.key == "alb")
    assert role_name(execution, "demo") == "SageMakerHyperPodInference-demo"
    assert role_name(alb, "demo") == "HyperPodInference-demo-Alb"
    long = "c" * 63
    assert len(role_name(execution, long)) <= 64
    assert role_name(execution, long).startswith("SageMakerHyperPodInference-")
    assert role_name(alb, long) != role_name(alb, long[:-1] + "d")  # hashed, still distinct
    assert len(role_name(alb, long)) <= 64 and role_name(alb, long).endswith("-Alb")
    assert default_tls_bucket("Demo_Cluster", "123456789012") == (
        "hyperpod-tls-demo-cluster-123456789012"
    )
    assert len(default_tls_bucket(long, "123456789012")) <= 63


def test_remedies_match_known_causes() -> None:
    webhook = (
        "[AdmissionRequestDenied] conversion webhook failed: no endpoints available for service "
        '"hyperpod-inference-conversion-webhook"'
    )
    assert "kueue-controller-manager" in remedies([webhook])
    assert "resolve-conflicts OVERWRITE" in remedies(
        ["[K8sResourceNotFound] driver name fsx.csi.aws.com not found"]
    )
    assert "trust-policy drift" in remedies(["[AccessDenied] not authorized"])
    assert remedies(["[InternalFailure] boom"]).startswith("fix the cause")
