"""hpkv.aws.eks add-on access against the AWS emulator, which enforces EKS's add-on rules."""

from __future__ import annotations

import pytest

from hpkv.aws import AwsClients, eks
from hpkv.config import load_settings
from hpkv.errors import ApiError, PreconditionFailed, WaitTimeout
from tests.harness.aws import AwsEmulator

pytestmark = pytest.mark.aws

CLUSTER = "hpkv-eks"


@pytest.fixture
def clients(aws_env: AwsEmulator) -> AwsClients:
    aws_env.extensions["eks"].seed_cluster(CLUSTER, version="1.33")
    return AwsClients(load_settings(flags={}))


def test_versions_defaults_and_filters(clients: AwsClients) -> None:
    versions = eks.addon_versions(clients, "cert-manager", "1.33")
    names = sorted((v["addonVersion"] for v in versions), key=eks.version_key)
    assert names == ["v1.18.2-eksbuild.2", "v1.19.1-eksbuild.1"]  # 1.17 is not for 1.33
    defaults = [
        v["addonVersion"]
        for v in versions
        if any(c["defaultVersion"] for c in v["compatibilities"] if c["clusterVersion"] == "1.33")
    ]
    assert defaults == ["v1.18.2-eksbuild.2"]


def test_create_wait_duplicate_update_and_delete(clients: AwsClients, aws_env: AwsEmulator) -> None:
    created = eks.create_addon(clients, clusterName=CLUSTER, addonName="metrics-server")
    assert created is not None and created["status"] == "CREATING"
    assert eks.create_addon(clients, clusterName=CLUSTER, addonName="metrics-server") is None
    active = eks.wait_addon(
        clients, CLUSTER, "metrics-server", deleted=False, timeout=5, delay=0.01
    )
    assert active["status"] == "ACTIVE" and active["addonVersion"] == "v0.7.2-eksbuild.4"

    update = eks.update_addon(
        clients, clusterName=CLUSTER, addonName="metrics-server", addonVersion="v0.8.0-eksbuild.2"
    )
    with pytest.raises(PreconditionFailed, match="update is already in progress"):
        eks.update_addon(
            clients,
            clusterName=CLUSTER,
            addonName="metrics-server",
            addonVersion="v0.8.0-eksbuild.2",
        )
    done = eks.wait_update(clients, CLUSTER, "metrics-server", update["id"], timeout=5, delay=0.01)
    assert done["status"] == "Successful"
    assert {"type": "AddonVersion", "value": "v0.8.0-eksbuild.2"} in done["params"]

    assert eks.list_addons(clients, CLUSTER) == ["metrics-server"]
    eks.delete_addon(clients, CLUSTER, "metrics-server")
    assert eks.describe_addon(clients, CLUSTER, "metrics-server")["status"] == "DELETING"
    eks.wait_addon(clients, CLUSTER, "metrics-server", deleted=True, timeout=5, delay=0.01)
    assert eks.describe_addon(clients, CLUSTER, "metrics-server") is None


def test_invalid_parameters(clients: AwsClients) -> None:
    with pytest.raises(ApiError, match="InvalidParameterException: Addon version specified"):
        eks.create_addon(
            clients, clusterName=CLUSTER, addonName="cert-manager", addonVersion="v0.0.1"
        )
    with pytest.raises(ApiError, match=r"not supported on Kubernetes 1\.33"):
        eks.create_addon(
            clients,
            clusterName=CLUSTER,
            addonName="cert-manager",
            addonVersion="v1.17.2-eksbuild.1",
        )
    with pytest.raises(ApiError, match="not valid JSON"):
        eks.create_addon(
            clients,
            clusterName=CLUSTER,
            addonName="amazon-sagemaker-hyperpod-inference",
            configurationValues="executionRoleArn: x",
        )
    with pytest.raises(ApiError, match="Json schema validation failed"):
        eks.create_addon(
            clients,
            clusterName=CLUSTER,
            addonName="amazon-sagemaker-hyperpod-inference",
            configurationValues='{"unknownKey": 1}',
        )
    with pytest.raises(ApiError, match="not a valid IAM role ARN"):
        eks.create_addon(
            clients,
            clusterName=CLUSTER,
            addonName="aws-fsx-csi-driver",
            serviceAccountRoleArn="my-role",
        )


def test_scripted_failures_surface_health_issues(clients: AwsClients, aws_env: AwsEmulator) -> None:
    issue = {"code": "ConfigurationConflict", "message": "Conflicts found", "resourceIds": ["x"]}
    aws_env.extensions["eks"].fail_next("cert-manager", "CREATE_FAILED", [issue])
    eks.create_addon(clients, clusterName=CLUSTER, addonName="cert-manager")
    with pytest.raises(eks.AddonWaitFailed) as failed:
        eks.wait_addon(clients, CLUSTER, "cert-manager", deleted=False, timeout=5, delay=0.01)
    assert failed.value.issues == ["[ConfigurationConflict] Conflicts found (resources: x)"]
    assert "is CREATE_FAILED: [ConfigurationConflict]" in failed.value.one_line()

    aws_env.extensions["eks"].transition_describes = 50
    eks.create_addon(clients, clusterName=CLUSTER, addonName="metrics-server")
    with pytest.raises(WaitTimeout, match="was not ACTIVE within"):
        eks.wait_addon(clients, CLUSTER, "metrics-server", deleted=False, timeout=0.05, delay=0.01)


def _catalog(*entries: tuple[str, bool]) -> list[dict]:
    return [
        {
            "addonVersion": version,
            "compatibilities": [{"clusterVersion": "1.33", "defaultVersion": default}],
        }
        for version, default in entries
    ]


def test_choose_version_as_eksctl_without_a_minimum() -> None:
    catalog = _catalog(("v1.48.0-eksbuild.1", True), ("v1.47.0-eksbuild.2", False))

    def choose(policy: str, live: str | None = None) -> tuple[str, str]:
        return eks.choose_version(
            "aws-ebs-csi-driver", policy, catalog, "1.33", live, config_key="x.addonVersion"
        )

    assert choose("default") == ("v1.48.0-eksbuild.1", "default for Kubernetes 1.33")
    # Without a minimum any installed version is kept.
    assert choose("default", "v1.2.0-eksbuild.1") == ("v1.2.0-eksbuild.1", "installed version kept")
    assert choose("latest", "v1.2.0-eksbuild.1") == ("v1.48.0-eksbuild.1", "latest")
    assert choose("v1.47.0-eksbuild.2") == ("v1.47.0-eksbuild.2", "pinned")
    with pytest.raises(PreconditionFailed) as no_default:
        eks.choose_version(
            "demo", "default", _catalog(("v1.0.0", False)), "1.33", None, config_key="x.v"
        )
    assert no_default.value.fix == "set x.v to 'latest' or to one of: v1.0.0"


def test_health_summary() -> None:
    assert eks.health_summary({}) == "no health issues reported"
    issues = [
        {"code": "A", "message": "one"},
        {"code": "B", "message": "two", "resourceIds": ["r"]},
    ]
    assert eks.health_summary({"health": {"issues": issues}}) == "[A] one; [B] two (resources: r)"
