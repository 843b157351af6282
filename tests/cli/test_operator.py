"""`hpkv operator status|apply|remove` against the AWS emulator (IAM, S3, EKS add-ons with status
transitions) and the real kube-apiserver (the tests play what the add-ons install there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness.inference import AddonPlayer, play_endpoint
from tests.harness.scenario import Scenario

pytestmark = [pytest.mark.kube, pytest.mark.aws]

ADDON_ORDER = [
    "aws-mountpoint-s3-csi-driver",
    "aws-fsx-csi-driver",
    "metrics-server",
    "cert-manager",
    "amazon-sagemaker-hyperpod-inference",
]
OPERATOR_ADDON = ADDON_ORDER[-1]
EXECUTION_ROLE = "SageMakerHyperPodInference-demo"
ISSUER_HOST = "oidc.eks.us-west-2.amazonaws.com/id/0123456789ABCDEF0123456789ABCDEF"
PROVIDER_ARN = f"arn:aws:iam::123456789012:oidc-provider/{ISSUER_HOST}"
OPERATOR_SUBJECT = (
    "system:serviceaccount:hyperpod-inference-system:hyperpod-inference-controller-manager"
)
ROLES = [
    EXECUTION_ROLE,
    "HyperPodInference-demo-S3Csi",
    "HyperPodInference-demo-FsxCsi",
    "HyperPodInference-demo-Alb",
    "HyperPodInference-demo-Keda",
]
BUCKET = "hyperpod-tls-demo-123456789012"
WEBHOOK_ISSUE = {
    "code": "AdmissionRequestDenied",
    "message": 'conversion webhook for inference.sagemaker.aws.amazon.com/v1alpha1 failed: Post "'
    "https://hyperpod-inference-conversion-webhook.hyperpod-inference-system.svc:443/convert"
    '?timeout=30s": no endpoints available for service "hyperpod-inference-conversion-webhook"',
    "resourceIds": [],
}


def _alb_policy(scenario: Scenario) -> None:
    """The ALB controller's policy, created once per account as its install guide says."""
    scenario.aws.client("iam").create_policy(
        PolicyName="AWSLoadBalancerControllerIAMPolicy",
        PolicyDocument=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {"Effect": "Allow", "Action": "elasticloadbalancing:*", "Resource": "*"}
                ],
            }
        ),
    )


@pytest.fixture
def eks(scenario: Scenario):
    return scenario.aws.extensions["eks"]


@pytest.fixture
def player(scenario: Scenario, shared_dir: Path, eks) -> AddonPlayer:
    scenario.hyperpod()
    _alb_policy(scenario)
    return AddonPlayer(scenario.kube, shared_dir, eks)


def _apply(scenario: Scenario, *extra: str):
    return scenario.hpkv("operator", "apply", "--cluster", "demo", *extra)


def _checks(result) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads(result.stdout)["checks"]}


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def _trust(scenario: Scenario, role: str) -> dict:
    return scenario.aws.client("iam").get_role(RoleName=role)["Role"]["AssumeRolePolicyDocument"]


def test_apply_status_reapply_remove(scenario: Scenario, player: AddonPlayer, eks) -> None:
    mark = scenario.mark()
    dry = _apply(scenario, "--dry-run", "-o", "json")
    assert dry.exit_code == 0, dry
    plan = json.loads(dry.stdout)["plans"][0]
    assert plan["changes"] == 12 and json.loads(dry.stdout)["applied"] is False
    assert [a["target"] for a in plan["actions"][-5:]] == [f"eks addon/{n}" for n in ADDON_ORDER]
    assert scenario.writes_since(mark) == []

    result = _apply(scenario, "--yes")
    assert result.exit_code == 0, result
    assert "applied 12 change(s)" in result.stdout
    writes = scenario.writes_since(mark)
    assert writes.count("eks:CreateAddon -> 200") == 5
    assert "iam:CreateOpenIDConnectProvider -> 200" in writes
    assert sum(w.startswith("iam:CreateRole") for w in writes) == 5
    assert not [w for w in writes if not w.startswith(("iam:", "eks:", "s3:"))], writes

    # Add-ons were created one after the other, dependencies first, each ACTIVE before the next.
    created = sorted(eks.addons.values(), key=lambda a: a.created)
    assert [a.name for a in created] == ADDON_ORDER
    assert all(a.status == "ACTIVE" for a in created)
    assert [a.version for a in created] == [
        "v1.15.0-eksbuild.1",  # the defaults EKS names for Kubernetes 1.33
        "v1.6.0-eksbuild.1",
        "v0.7.2-eksbuild.4",
        "v1.18.2-eksbuild.2",
        "v1.3.0-eksbuild.1",
    ]
    assert all(a.tags == {"hpkv:managed-by": "hpkv"} for a in created)
    operator = eks.addons[("hpkv-eks", OPERATOR_ADDON)]
    account = "arn:aws:iam::123456789012:role"
    assert json.loads(operator.configuration_values) == {
        "executionRoleArn": f"{account}/{EXECUTION_ROLE}",
        "tlsCertificateS3Bucket": BUCKET,
        "hyperpodClusterArn": "arn:aws:sagemaker:us-west-2:123456789012:cluster/demo0001",
        "alb": {
            "serviceAccount": {"create": True, "roleArn": f"{account}/HyperPodInference-demo-Alb"}
        },
        "keda": {"auth": {"aws": {"irsa": {"roleArn": f"{account}/HyperPodInference-demo-Keda"}}}},
    }
    s3_csi = eks.addons[("hpkv-eks", "aws-mountpoint-s3-csi-driver")]
    assert s3_csi.service_account_role_arn == f"{account}/HyperPodInference-demo-S3Csi"

    iam = scenario.aws.client("iam")
    trust = _trust(scenario, EXECUTION_ROLE)["Statement"]
    assert {
        "Effect": "Allow",
        "Principal": {"Service": "sagemaker.amazonaws.com"},
        "Action": "sts:AssumeRole",
    } in trust
    web = next(s for s in trust if s["Action"] == "sts:AssumeRoleWithWebIdentity")
    assert web["Principal"] == {"Federated": PROVIDER_ARN}
    assert web["Condition"]["StringEquals"][f"{ISSUER_HOST}:sub"] == OPERATOR_SUBJECT
    attached = iam.list_attached_role_policies(RoleName=EXECUTION_ROLE)["AttachedPolicies"]
    assert [p["PolicyName"] for p in attached] == ["AmazonSageMakerHyperPodInferenceAccess"]
    tls = iam.get_role_policy(RoleName=EXECUTION_ROLE, PolicyName="hpkv-tls-certificates")
    actions = {a for s in tls["PolicyDocument"]["Statement"] for a in s["Action"]}
    assert {"s3:PutObjectTagging", "acm:AddTagsToCertificate"} <= actions

    # The verification ran against Kubernetes.
    payload_checks = [line for line in result.stdout.splitlines() if "endpoint-crd" in line]
    assert payload_checks and "Established" in payload_checks[0]

    status = scenario.hpkv("operator", "status", "--cluster", "demo", "-o", "json")
    assert status.exit_code == 0, status
    checks = _checks(status)
    assert all(c["state"] == "ok" for c in checks.values()), checks
    assert checks[f"addon/{OPERATOR_ADDON}"]["evidence"] == "ACTIVE at v1.3.0-eksbuild.1"
    assert checks["operator-deployment"]["evidence"].startswith(
        "Deployment hyperpod-inference-system/hyperpod-inference-controller-manager Available"
    )

    mark = scenario.mark()
    again = _apply(scenario, "--yes")
    assert again.exit_code == 0, again
    assert "operator: nothing to do" in again.stdout
    assert scenario.writes_since(mark) == []

    mark = scenario.mark()
    removed = scenario.hpkv("operator", "remove", "--cluster", "demo", "--yes")
    assert removed.exit_code == 0, removed
    deletes = [w for w in scenario.writes_since(mark)]
    assert deletes == ["eks:DeleteAddon -> 200"] * 5, deletes
    assert eks.addons == {}
    text = " ".join(removed.stdout.split())  # the table may fold long lines
    assert "kept: IAM roles SageMakerHyperPodInference-demo" in text
    assert "(--delete-iam deletes those hpkv created)" in text
    assert "kept: TLS certificate bucket s3://hyperpod-tls-demo-123456789012" in text
    assert "kept: IAM OIDC provider oidc.eks.us-west-2.amazonaws.com/id/" in text
    crd = scenario.kube.get_object(
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        "inferenceendpointconfigs.inference.sagemaker.aws.amazon.com",
    )
    assert crd is None or crd["metadata"].get("deletionTimestamp")  # the add-on took it away
    assert iam.get_role(RoleName=EXECUTION_ROLE)

    purged = scenario.hpkv("operator", "remove", "--cluster", "demo", "--delete-iam", "--yes")
    assert purged.exit_code == 0, purged
    names = [r["RoleName"] for r in iam.list_roles()["Roles"]]
    assert not set(ROLES) & set(names)
    assert BUCKET not in [b["Name"] for b in scenario.aws.client("s3").list_buckets()["Buckets"]]
    assert iam.list_open_id_connect_providers()["OpenIDConnectProviderList"], "provider is kept"


def test_remove_deletes_in_reverse_dependency_order(
    scenario: Scenario, player: AddonPlayer, eks
) -> None:
    assert _apply(scenario, "--yes").exit_code == 0
    deleted: list[str] = []
    eks.on_deleted.append(lambda addon: deleted.append(addon.name))
    result = scenario.hpkv("operator", "remove", "--cluster", "demo", "--yes", "-o", "json")
    assert result.exit_code == 0, result
    assert deleted == list(reversed(ADDON_ORDER))
    payload = json.loads(result.stdout)
    assert [a["verb"] for a in payload["plans"][0]["actions"]] == ["delete"] * 5


def test_create_failed_addon_shows_health_issues_and_is_recreated(
    scenario: Scenario, player: AddonPlayer, eks
) -> None:
    eks.fail_next(OPERATOR_ADDON, "CREATE_FAILED", [WEBHOOK_ISSUE])
    result = _apply(scenario, "--yes")
    assert result.exit_code == 1, result
    line = _one_line(result.stderr.splitlines()[-1])
    assert line.startswith(f"hpkv: error: add-on {OPERATOR_ADDON} is CREATE_FAILED: ")
    assert WEBHOOK_ISSUE["message"] in line  # verbatim
    assert "kueue" in line and "--preserve" in line  # the known remedy

    status = scenario.hpkv("operator", "status", "--cluster", "demo", "-o", "json")
    assert status.exit_code == 2, status  # CRITICAL
    check = _checks(status)[f"addon/{OPERATOR_ADDON}"]
    assert check["state"] == "fail"
    assert WEBHOOK_ISSUE["message"] in check["evidence"]
    assert "kueue-controller-manager" in check["remediation"]

    # The cause is fixed; the next apply deletes the failed add-on with --preserve and re-creates it.
    mark = scenario.mark()
    again = _apply(scenario, "--yes")
    assert again.exit_code == 0, again
    assert "re-create (CREATE_FAILED:" in again.stdout
    writes = scenario.writes_since(mark)
    assert writes == ["eks:DeleteAddon -> 200", "eks:CreateAddon -> 200"], writes
    operator = eks.addons[("hpkv-eks", OPERATOR_ADDON)]
    assert operator.status == "ACTIVE"


def test_recreate_uses_preserve(scenario: Scenario, player: AddonPlayer, eks) -> None:
    eks.fail_next(OPERATOR_ADDON, "CREATE_FAILED", [WEBHOOK_ISSUE])
    assert _apply(scenario, "--yes").exit_code == 1
    preserved: list[bool] = []
    eks.on_deleted.append(lambda addon: preserved.append(addon.preserve))
    assert _apply(scenario, "--yes").exit_code == 0
    assert preserved == [True]


def test_drifted_trust_policy_is_reported_and_fixed_only_with_yes(
    scenario: Scenario, player: AddonPlayer
) -> None:
    assert _apply(scenario, "--yes").exit_code == 0
    iam = scenario.aws.client("iam")
    wrong_subject = "system:serviceaccount:hyperpod-inference-system:someone-else"
    drifted = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "sagemaker.amazonaws.com"},
                "Action": "sts:AssumeRole",
            },
            {
                "Effect": "Allow",
                "Principal": {"Federated": PROVIDER_ARN},
                "Action": "sts:AssumeRoleWithWebIdentity",
                "Condition": {"StringEquals": {f"{ISSUER_HOST}:sub": wrong_subject}},
            },
        ],
    }
    iam.update_assume_role_policy(RoleName=EXECUTION_ROLE, PolicyDocument=json.dumps(drifted))

    status = scenario.hpkv("operator", "status", "--cluster", "demo", "-o", "json")
    assert status.exit_code == 1, status  # WARNING
    check = _checks(status)["role/execution"]
    assert check["state"] == "warn"
    assert f"lacks sts:AssumeRoleWithWebIdentity for {OPERATOR_SUBJECT}" in check["evidence"]

    # Without --yes: reported with the exact difference, not changed.
    mark = scenario.mark()
    dry = _apply(scenario, "--dry-run")
    assert dry.exit_code == 0, dry
    assert "trust policy drift NOT fixed" in dry.stdout
    assert f'-          "{ISSUER_HOST}:sub": "{wrong_subject}"' in dry.stdout
    assert f'+          "{ISSUER_HOST}:sub": "{OPERATOR_SUBJECT}"' in dry.stdout
    plain = _apply(scenario)
    assert plain.exit_code == 0, plain
    assert "nothing to do" in plain.stdout
    assert scenario.writes_since(mark) == []
    assert _trust(scenario, EXECUTION_ROLE) == drifted

    fixed = _apply(scenario, "--yes")
    assert fixed.exit_code == 0, fixed
    assert scenario.writes_since(mark) == ["iam:UpdateAssumeRolePolicy -> 200"]
    statements = _trust(scenario, EXECUTION_ROLE)["Statement"]
    subjects = [
        s["Condition"]["StringEquals"][f"{ISSUER_HOST}:sub"] for s in statements if "Condition" in s
    ]
    assert subjects == [OPERATOR_SUBJECT]
    assert (
        _checks(scenario.hpkv("operator", "status", "--cluster", "demo", "-o", "json"))[
            "role/execution"
        ]["state"]
        == "ok"
    )


def test_given_roles_are_reused_and_not_modified(
    scenario: Scenario, player: AddonPlayer, eks
) -> None:
    iam = scenario.aws.client("iam")
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Federated": PROVIDER_ARN},
                "Action": "sts:AssumeRoleWithWebIdentity",
                "Condition": {
                    "StringEquals": {
                        f"{ISSUER_HOST}:sub": "system:serviceaccount:kube-system:fsx-csi-controller-sa",
                        f"{ISSUER_HOST}:aud": "sts.amazonaws.com",
                    }
                },
            }
        ],
    }
    arn = iam.create_role(RoleName="team-fsx", AssumeRolePolicyDocument=json.dumps(trust))["Role"][
        "Arn"
    ]
    (scenario.workdir / "hpkv.yaml").write_text(f"operator:\n  roles:\n    fsxCsiDriver: {arn}\n")
    result = _apply(scenario, "--yes")
    assert result.exit_code == 0, result
    assert eks.addons[("hpkv-eks", "aws-fsx-csi-driver")].service_account_role_arn == arn
    assert iam.list_attached_role_policies(RoleName="team-fsx")["AttachedPolicies"] == []
    names = [r["RoleName"] for r in iam.list_roles()["Roles"]]
    assert "HyperPodInference-demo-FsxCsi" not in names

    status = scenario.hpkv("operator", "status", "--cluster", "demo", "-o", "json")
    check = _checks(status)["role/fsxCsiDriver"]
    assert check["state"] == "warn"  # it lacks AmazonFSxFullAccess; hpkv only reports that
    assert "AmazonFSxFullAccess" in check["evidence"]

    removed = scenario.hpkv("operator", "remove", "--cluster", "demo", "--delete-iam", "--yes")
    assert removed.exit_code == 0, removed
    assert "kept: given in hpkv.yaml" in removed.stdout
    assert iam.get_role(RoleName="team-fsx")


def test_execution_role_without_required_prefix_is_refused(scenario: Scenario) -> None:
    scenario.hyperpod()
    (scenario.workdir / "hpkv.yaml").write_text("operator:\n  roles:\n    execution: my-role\n")
    mark = scenario.mark()
    result = _apply(scenario, "--yes")
    assert result.exit_code == 2, result
    assert "does not start with SageMakerHyperPodInference" in _one_line(result.stderr)
    assert scenario.writes_since(mark) == []


def test_versions_below_documented_minimums_are_refused(
    scenario: Scenario, shared_dir: Path, eks
) -> None:
    scenario.hyperpod()
    eks.seed_cluster("hpkv-eks", version="1.29")  # EKS's defaults for 1.29 are older
    _alb_policy(scenario)
    AddonPlayer(scenario.kube, shared_dir, eks)
    mark = scenario.mark()
    result = _apply(scenario, "--yes")
    assert result.exit_code == 1, result
    line = _one_line(result.stderr)
    assert (
        "aws-mountpoint-s3-csi-driver v1.13.0-eksbuild.1 (default for Kubernetes 1.29) is below "
        "v1.14.1-eksbuild.1" in line
    )
    assert "operator.versions.s3CsiDriver" in line
    assert scenario.writes_since(mark) == []  # refused while planning: nothing was created

    (scenario.workdir / "hpkv.yaml").write_text(
        "operator:\n  versions:\n    s3CsiDriver: latest\n    fsxCsiDriver: '1.6.0'\n"
        "    metricsServer: v0.7.2-eksbuild.4\n    certManager: latest\n"
    )
    ok = _apply(scenario, "--yes")
    assert ok.exit_code == 0, ok
    versions = {name: a.version for (_, name), a in eks.addons.items()}
    assert versions == {
        "aws-mountpoint-s3-csi-driver": "v1.14.1-eksbuild.1",  # latest for 1.29
        "aws-fsx-csi-driver": "v1.6.0-eksbuild.1",  # newest build of 1.6.0
        "metrics-server": "v0.7.2-eksbuild.4",
        "cert-manager": "v1.18.2-eksbuild.2",
        OPERATOR_ADDON: "v1.0.0-eksbuild.1",
    }


def test_unknown_pinned_version_is_a_config_error(scenario: Scenario, player: AddonPlayer) -> None:
    (scenario.workdir / "hpkv.yaml").write_text(
        "operator:\n  versions:\n    certManager: v9.9.9-eksbuild.1\n"
    )
    result = _apply(scenario, "--yes")
    assert result.exit_code == 2, result
    line = _one_line(result.stderr)
    assert "cert-manager v9.9.9-eksbuild.1 is not available for Kubernetes 1.33" in line
    assert "v1.18.2-eksbuild.2" in line


def test_pinned_upgrade_waits_on_the_update_id(
    scenario: Scenario, player: AddonPlayer, eks
) -> None:
    assert _apply(scenario, "--yes").exit_code == 0
    eks.transition_describes = 3
    (scenario.workdir / "hpkv.yaml").write_text(
        "operator:\n  versions:\n    metricsServer: latest\n"
    )
    mark = scenario.aws.mark()
    result = _apply(scenario, "--yes")
    assert result.exit_code == 0, result
    assert "version v0.7.2-eksbuild.4 -> v0.8.0-eksbuild.2 (latest)" in result.stdout
    calls = [str(c) for c in scenario.aws.calls_since(mark)]
    update_at = calls.index("eks:UpdateAddon -> 200")
    after = calls[update_at + 1 :]
    # Waited on DescribeUpdate until Successful (3 InProgress answers), never a second update.
    assert after[:4] == ["eks:DescribeUpdate -> 200"] * 4
    assert calls.count("eks:UpdateAddon -> 200") == 1
    addon = eks.addons[("hpkv-eks", "metrics-server")]
    assert addon.version == "v0.8.0-eksbuild.2" and addon.status == "ACTIVE"
    assert addon.requests[-1]["resolveConflicts"] == "OVERWRITE"


def test_degraded_fsx_addon_is_repaired_with_overwrite(
    scenario: Scenario, player: AddonPlayer, eks
) -> None:
    assert _apply(scenario, "--yes").exit_code == 0
    fsx = eks.addons[("hpkv-eks", "aws-fsx-csi-driver")]
    fsx.status = "DEGRADED"
    fsx.issues = [
        {
            "code": "InsufficientNumberOfReplicas",
            "message": "driver name fsx.csi.aws.com not found in the list of registered CSI "
            "drivers: DaemonSet kube-system/fsx-csi-node is missing",
            "resourceIds": ["fsx-csi-node"],
        }
    ]
    status = scenario.hpkv("operator", "status", "--cluster", "demo", "-o", "json")
    check = _checks(status)["addon/aws-fsx-csi-driver"]
    assert check["state"] == "fail"
    assert "resolve-conflicts OVERWRITE" in check["remediation"]

    result = _apply(scenario, "--yes")
    assert result.exit_code == 0, result
    assert "repair (DEGRADED:" in result.stdout
    assert fsx.requests[-1]["resolveConflicts"] == "OVERWRITE"
    assert fsx.status == "ACTIVE"


def test_failed_update_shows_errors_verbatim(scenario: Scenario, player: AddonPlayer, eks) -> None:
    assert _apply(scenario, "--yes").exit_code == 0
    (scenario.workdir / "hpkv.yaml").write_text("operator:\n  versions:\n    certManager: latest\n")
    eks.fail_next(
        "cert-manager",
        "UPDATE_FAILED",
        [
            {
                "code": "ConfigurationConflict",
                "message": "Conflicts found when trying to apply.",
                "resourceIds": [],
            }
        ],
    )
    result = _apply(scenario, "--yes")
    assert result.exit_code == 1, result
    line = _one_line(result.stderr.splitlines()[-1])
    assert "of add-on cert-manager is Failed: [ConfigurationConflict] Conflicts found" in line
    assert "operator.resolveConflicts" in line


def test_busy_addon_is_not_raced(scenario: Scenario, player: AddonPlayer, eks) -> None:
    assert _apply(scenario, "--yes").exit_code == 0
    (scenario.workdir / "hpkv.yaml").write_text("operator:\n  versions:\n    certManager: latest\n")
    addon = eks.addons[("hpkv-eks", "cert-manager")]
    addon.status, addon.next_status, addon.pending = "UPDATING", "ACTIVE", 2
    mark = scenario.mark()
    refused = _apply(scenario, "--yes")
    assert refused.exit_code == 1, refused
    assert "add-on cert-manager is UPDATING" in _one_line(refused.stderr)
    assert scenario.writes_since(mark) == []

    waited = _apply(scenario, "--yes", "--wait")
    assert waited.exit_code == 0, waited
    assert addon.version == "v1.19.1-eksbuild.1"


def test_addons_not_created_by_hpkv_are_kept_on_remove(
    scenario: Scenario, player: AddonPlayer, eks
) -> None:
    eks.seed_addon("hpkv-eks", "metrics-server", "v0.7.2-eksbuild.4")
    result = _apply(scenario, "--yes")
    assert result.exit_code == 0, result
    assert eks.addons[("hpkv-eks", "metrics-server")].requests == []  # left as it was
    removed = scenario.hpkv("operator", "remove", "--cluster", "demo", "--yes")
    assert removed.exit_code == 0, removed
    assert [name for (_, name) in eks.addons] == ["metrics-server"]
    assert "kept: not created by hpkv" in removed.stdout


def test_self_managed_dependencies_are_left_alone(
    scenario: Scenario, player: AddonPlayer, eks
) -> None:
    # cert-manager installed with Helm before hpkv: its CRDs exist, but there is no add-on.
    player.install("cert-manager")
    result = _apply(scenario, "--yes")
    assert result.exit_code == 0, result
    assert (
        "installed outside EKS add-ons (CRD certificates.cert-manager.io exists)" in result.stdout
    )
    assert ("hpkv-eks", "cert-manager") not in eks.addons


def test_remove_refuses_while_endpoints_exist(scenario: Scenario, player: AddonPlayer, eks) -> None:
    assert _apply(scenario, "--yes").exit_code == 0
    scenario.kube.apply_object(
        {
            "apiVersion": "inference.sagemaker.aws.amazon.com/v1",
            "kind": "InferenceEndpointConfig",
            "metadata": {"name": "qwen", "namespace": "default"},
            "spec": {
                "modelName": "qwen",
                "modelSourceConfig": {"modelSourceType": "s3"},
                "worker": {
                    "image": "x",
                    "modelInvocationPort": {"containerPort": 8000},
                    "modelVolumeMount": {"name": "m"},
                    "resources": {},
                },
            },
        }
    )
    play_endpoint(scenario.kube, "qwen", load_balancer=None)
    mark = scenario.mark()
    refused = scenario.hpkv("operator", "remove", "--cluster", "demo", "--yes")
    assert refused.exit_code == 1, refused
    line = _one_line(refused.stderr)
    assert "1 InferenceEndpointConfig(s) still exist: default/qwen" in line
    assert "--force" in line
    assert scenario.writes_since(mark) == []

    forced = scenario.hpkv("operator", "remove", "--cluster", "demo", "--yes", "--force")
    assert forced.exit_code == 0, forced
    assert "--force: 1 endpoint(s) stay without an operator: default/qwen" in forced.stdout
    assert eks.addons == {}


def test_missing_alb_policy_is_a_clear_precondition(
    scenario: Scenario, shared_dir: Path, eks
) -> None:
    scenario.hyperpod()
    AddonPlayer(scenario.kube, shared_dir, eks)
    mark = scenario.mark()
    result = _apply(scenario, "--yes")
    assert result.exit_code == 1, result
    line = _one_line(result.stderr)
    assert "AWSLoadBalancerControllerIAMPolicy" in line and "operator.albPolicyArn" in line
    assert scenario.writes_since(mark) == []


def test_apply_without_yes_off_a_terminal_needs_confirmation(
    scenario: Scenario, player: AddonPlayer
) -> None:
    mark = scenario.mark()
    result = _apply(scenario)
    assert result.exit_code == 2, result
    assert "without confirmation" in _one_line(result.stderr)
    assert scenario.writes_since(mark) == []


def test_operator_deployment_never_available_times_out(
    scenario: Scenario, shared_dir: Path, eks
) -> None:
    scenario.hyperpod()
    _alb_policy(scenario)
    AddonPlayer(scenario.kube, shared_dir, eks, operator_ready=False)
    result = _apply(scenario, "--yes", "--timeout", "1")
    assert result.exit_code == 1, result
    line = _one_line(result.stderr.splitlines()[-1])
    assert "operator-deployment" in line and "not Available" in line
    assert "kubectl logs -n hyperpod-inference-system" in line


def test_status_before_anything_is_installed_warns(scenario: Scenario, player: AddonPlayer) -> None:
    result = scenario.hpkv("operator", "status", "--cluster", "demo", "-o", "json")
    assert result.exit_code == 1, result  # WARNING: not installed yet, nothing broken
    checks = _checks(result)
    assert checks["cluster"]["state"] == "ok"
    assert checks[f"addon/{OPERATOR_ADDON}"]["evidence"] == "not installed"
    assert {c["state"] for name, c in checks.items() if name != "cluster"} == {"warn"}
    assert checks["role/execution"]["remediation"] == "run 'hpkv operator apply'"


def test_status_of_an_unknown_cluster_is_unknown(scenario: Scenario) -> None:
    scenario.hyperpod()
    result = scenario.hpkv("operator", "status", "--cluster", "nope")
    assert result.exit_code == 3, result
    assert "HyperPod cluster 'nope' not found" in _one_line(result.stderr)


def test_update_keeps_configuration_keys_hpkv_does_not_manage(
    scenario: Scenario, player: AddonPlayer, eks
) -> None:
    gated = "arn:aws:iam::123456789012:role/js-gated"
    eks.seed_addon(
        "hpkv-eks",
        OPERATOR_ADDON,
        "v1.3.0-eksbuild.1",
        configuration_values=json.dumps(
            {
                "executionRoleArn": "arn:aws:iam::123456789012:role/SageMakerHyperPodInference-old",
                "jumpstartGatedModelDownloadRoleArn": gated,
            }
        ),
    )
    result = _apply(scenario, "--yes")
    assert result.exit_code == 0, result
    assert "update: configurationValues" in result.stdout
    values = json.loads(eks.addons[("hpkv-eks", OPERATOR_ADDON)].configuration_values)
    assert values["jumpstartGatedModelDownloadRoleArn"] == gated
    assert values["executionRoleArn"].endswith(f"role/{EXECUTION_ROLE}")

    mark = scenario.mark()
    assert _apply(scenario, "--yes").exit_code == 0
    assert scenario.writes_since(mark) == []
