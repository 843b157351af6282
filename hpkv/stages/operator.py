"""Stage 2: the HyperPod Inference Operator (EKS add-on ``amazon-sagemaker-hyperpod-inference``)
and what it depends on.

Order of ``apply`` (each step is planned from a read of the live state, so a converged cluster
yields only ``none`` actions and zero writes):

1. the IAM OIDC provider for the EKS cluster's issuer (IRSA needs it);
2. the TLS certificate bucket (``hyperpod-tls-...``);
3. the IRSA roles: the operator's execution role ``SageMakerHyperPodInference-<cluster>`` (trust:
   sagemaker.amazonaws.com plus the operator's service account), the S3 Mountpoint CSI, FSx CSI,
   ALB controller and KEDA roles. Any of them may be an existing role named in hpkv.yaml; hpkv then
   leaves its permissions alone. A trust policy that lacks what the operator needs is drift: it is
   reported with the exact difference and rewritten only with ``--yes``;
4. the EKS add-ons in dependency order: ``aws-mountpoint-s3-csi-driver``, ``aws-fsx-csi-driver``,
   ``metrics-server``, ``cert-manager``, then the operator add-on with its configuration values.
   Versions are chosen as eksctl does (the default for the cluster's Kubernetes version, ``latest``
   or a pinned version) and refused below the documented minimums. hpkv waits on every change: on
   the add-on's status after CreateAddon and on the update ID after UpdateAddon;
5. verification in Kubernetes: the CSIDrivers, the cert-manager CRDs, the operator Deployment and
   the InferenceEndpointConfig CRD.

``remove`` goes in reverse, deletes only add-ons hpkv created (tagged ``hpkv:managed-by``), refuses
while InferenceEndpointConfigs exist (``--force`` overrides) and keeps IAM roles and the bucket unless
``--delete-iam`` is given (then only those hpkv created are deleted; the OIDC provider is kept).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hpkv import reads
from hpkv.aws import addon_plan, eks, iam, irsa, s3, sagemaker
from hpkv.aws.irsa import trust_drift, trust_drift_finding
from hpkv.context import poll_interval
from hpkv.errors import ConfigError, HpkvError, NotFound, PreconditionFailed, WaitTimeout
from hpkv.stages.base import (
    Action,
    ApplyResult,
    Check,
    CheckSpec,
    CheckState,
    Detector,
    Finding,
    IamNeed,
    Plan,
    Severity,
    Stage,
    Verb,
)
from hpkv.topology import (
    ENDPOINT_KIND,
    ENDPOINT_PLURAL,
    INFERENCE_API_VERSION,
    INFERENCE_GROUP,
    OPERATOR_DEPLOYMENT,
    OPERATOR_NAMESPACE,
    OPERATOR_SERVICE_ACCOUNT,
)

if TYPE_CHECKING:
    from hpkv.runbook.profile import ClusterProfile
    from hpkv.topology import EndpointRef

INFERENCE_ACCESS_POLICY = "arn:aws:iam::aws:policy/AmazonSageMakerHyperPodInferenceAccess"
FSX_ACCESS_POLICY = "arn:aws:iam::aws:policy/AmazonFSxFullAccess"
ALB_POLICY_NAME = "AWSLoadBalancerControllerIAMPolicy"
ALB_POLICY_URL = (
    "https://raw.githubusercontent.com/kubernetes-sigs/aws-load-balancer-controller/v2.13.0/"
    "docs/install/iam_policy.json"
)
ALB_POLICY_FIX = (
    f"create it from the AWS Load Balancer Controller's policy ('curl -o iam_policy.json "
    f"{ALB_POLICY_URL}' then 'aws iam create-policy --policy-name {ALB_POLICY_NAME} "
    "--policy-document file://iam_policy.json'), or set operator.albPolicyArn"
)
EXECUTION_ROLE_PREFIX = "SageMakerHyperPodInference"
TLS_BUCKET_PREFIX = "hyperpod-tls-"
HELM_OPERATOR_DEPLOYMENT = "hyperpod-inference-operator-controller-manager"
CSI_DRIVERS = ("s3.csi.aws.com", "fsx.csi.aws.com")
CERT_MANAGER_CRDS = ("certificates.cert-manager.io", "certificaterequests.cert-manager.io")
CERT_MANAGER_KINDS = {
    CERT_MANAGER_CRDS[0]: "Certificate",
    CERT_MANAGER_CRDS[1]: "CertificateRequest",
}
CERT_MANAGER_API = "cert-manager.io/v1"
ENDPOINT_CRD = f"{ENDPOINT_PLURAL}.{INFERENCE_GROUP}"
METRICS_API_SERVICE = "v1beta1.metrics.k8s.io"


@dataclass(frozen=True)
class RoleSpec:
    key: str
    title: str
    suffix: str
    namespace: str
    service_account: str
    sagemaker_trust: bool = False
    managed: tuple[str, ...] = ()


@dataclass(frozen=True)
class AddonSpec:
    key: str
    name: str
    minimum: str
    role: str | None = None


ROLES: tuple[RoleSpec, ...] = (
    RoleSpec(
        "execution",
        "operator execution role",
        "",
        OPERATOR_NAMESPACE,
        OPERATOR_SERVICE_ACCOUNT,
        sagemaker_trust=True,
        managed=(INFERENCE_ACCESS_POLICY,),
    ),
    RoleSpec("s3CsiDriver", "S3 Mountpoint CSI role", "S3Csi", "kube-system", "s3-csi-driver-sa"),
    RoleSpec(
        "fsxCsiDriver",
        "FSx CSI role",
        "FsxCsi",
        "kube-system",
        "fsx-csi-controller-sa",
        managed=(FSX_ACCESS_POLICY,),
    ),
    RoleSpec(
        "alb", "ALB controller role", "Alb", OPERATOR_NAMESPACE, "aws-load-balancer-controller"
    ),
    RoleSpec("keda", "KEDA role", "Keda", OPERATOR_NAMESPACE, "keda-operator"),
)
ROLE_BY_KEY = {r.key: r for r in ROLES}

ADDONS: tuple[AddonSpec, ...] = (
    AddonSpec(
        "s3CsiDriver", "aws-mountpoint-s3-csi-driver", "v1.14.1-eksbuild.1", role="s3CsiDriver"
    ),
    AddonSpec("fsxCsiDriver", "aws-fsx-csi-driver", "v1.6.0-eksbuild.1", role="fsxCsiDriver"),
    AddonSpec("metricsServer", "metrics-server", "v0.7.2-eksbuild.4"),
    AddonSpec("certManager", "cert-manager", "v1.18.2-eksbuild.2"),
    AddonSpec("inferenceOperator", "amazon-sagemaker-hyperpod-inference", "v1.0.0-eksbuild.1"),
)
OPERATOR_ADDON = ADDONS[-1].name
FSX_NODE_DAEMONSET = ("kube-system", "fsx-csi-node")

# What this stage calls (hpkv.aws.iam, irsa, s3, eks, addon_plan), for 'hpkv diagnose --iam'.
_ROLES = "arn:{partition}:iam::{account}:role/*"
_TLS_BUCKETS = "arn:{partition}:s3:::hyperpod-tls-*"

IAM_ACTIONS: list[IamNeed] = [
    *addon_plan.iam_needs("install and track the operator's EKS add-ons"),
    *irsa.iam_needs("IRSA roles of the operator and its add-ons"),
    *(
        IamNeed(f"iam:{action}", _ROLES, "'hpkv operator remove --delete-iam'")
        for action in (
            "ListRoleTags",
            "ListRolePolicies",
            "DetachRolePolicy",
            "DeleteRolePolicy",
            "DeleteRole",
        )
    ),
    *(
        IamNeed(f"s3:{action}", _TLS_BUCKETS, "the operator's TLS certificate bucket")
        for action in (
            "ListBucket",
            "CreateBucket",
            "PutBucketTagging",
            "GetBucketTagging",
            "ListBucketVersions",
            "DeleteBucket",
        )
    ),
    *(
        IamNeed(f"s3:{action}", _TLS_BUCKETS + "/*", "empty the TLS bucket on --delete-iam")
        for action in ("DeleteObject", "DeleteObjectVersion")
    ),
]

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "versions": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                spec.key: {
                    "type": "string",
                    "pattern": eks.VERSION_POLICY_PATTERN,
                    "description": f"'default', 'latest' or a {spec.name} add-on version "
                    f"(at least {spec.minimum})",
                }
                for spec in ADDONS
            },
        },
        "roles": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                spec.key: {
                    "type": "string",
                    "minLength": 1,
                    "description": f"the name or ARN of an existing IAM role to use as the "
                    f"{spec.title}",
                }
                for spec in ROLES
            },
        },
        "tlsBucket": {
            "type": "string",
            "pattern": r"^(s3://)?[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/?$",
            "description": "an S3 bucket name (hpkv creates it if missing)",
        },
        "albPolicyArn": {
            "type": "string",
            "pattern": r"^arn:aws[a-z-]*:iam::(\d{12}|aws):policy/.+$",
            "description": "the ARN of the AWS Load Balancer Controller IAM policy",
        },
        "modelBuckets": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "description": "S3 buckets the S3 CSI driver may read model weights from",
        },
        "resolveConflicts": {"type": "string", "enum": ["OVERWRITE", "PRESERVE", "NONE"]},
    },
}
CONFIG_DEFAULTS: dict[str, Any] = {"resolveConflicts": "OVERWRITE"}

# Known causes of unhealthy add-ons, matched against "[code] message" of each health issue.
_REMEDIES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"no endpoints available for service", re.I),
        "a webhook the add-on calls has no ready endpoints (seen when Kueue is scaled to 0: "
        "kueue-webhook-service); start that webhook's Deployment again (e.g. 'kubectl -n "
        "kueue-system scale deployment kueue-controller-manager --replicas=1'), then rerun "
        "'hpkv operator apply', which deletes the failed add-on with --preserve and re-creates "
        "it with the same configuration",
    ),
    (
        re.compile(r"fsx\.csi\.aws\.com.*not found|fsx-csi-node", re.I),
        "the fsx-csi-node DaemonSet is missing; rerun 'hpkv operator apply', which updates "
        "aws-fsx-csi-driver with resolve-conflicts OVERWRITE to restore it",
    ),
    (
        re.compile(EXECUTION_ROLE_PREFIX, re.I),
        f"the execution role's name must start with {EXECUTION_ROLE_PREFIX}: let hpkv create it "
        "or set operator.roles.execution to such a role",
    ),
    (
        re.compile(r"\[(AccessDenied|AddonPermissionFailure)\]"),
        "the add-on's IAM role lacks a permission or does not trust its service account: check "
        "'hpkv operator status' for trust-policy drift and fix it with 'hpkv operator apply --yes'",
    ),
    (
        re.compile(r"\[ConfigurationConflict\]"),
        "resources the add-on manages already exist outside it; set operator.resolveConflicts "
        "to OVERWRITE (the default) and rerun 'hpkv operator apply'",
    ),
    (
        re.compile(r"\[InsufficientNumberOfReplicas\]"),
        "the add-on's pods are not ready: check them with 'kubectl get pods -A' for scheduling, "
        "image or webhook problems",
    ),
)


def remedies(issues: list[str]) -> str:
    found: list[str] = []
    for issue in issues:
        for pattern, remedy in _REMEDIES:
            if pattern.search(issue) and remedy not in found:
                found.append(remedy)
    return (
        "; ".join(found) or "fix the cause in the health issues, then rerun 'hpkv operator apply'"
    )


# --- names ----------------------------------------------------------------------------------------
def _bounded(prefix: str, variable: str, suffix: str, limit: int) -> str:
    """prefix + variable + suffix within ``limit`` characters (variable shortened, plus a hash)."""
    name = f"{prefix}{variable}{suffix}"
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(variable.encode()).hexdigest()[:6]
    keep = limit - len(prefix) - len(suffix) - len(digest) - 1
    return f"{prefix}{variable[:keep].rstrip('-')}-{digest}{suffix}"


def role_name(spec: RoleSpec, cluster: str) -> str:
    if spec.key == "execution":
        return _bounded(f"{EXECUTION_ROLE_PREFIX}-", cluster, "", 64)
    return _bounded("HyperPodInference-", cluster, f"-{spec.suffix}", 64)


def default_tls_bucket(cluster: str, account: str) -> str:
    cleaned = re.sub(r"[^a-z0-9-]+", "-", cluster.lower()).strip("-") or "cluster"
    return _bounded(TLS_BUCKET_PREFIX, cleaned, f"-{account}", 63)


# --- version choice ------------------------------------------------------------------------------
def choose_version(
    spec: AddonSpec,
    policy: str,
    versions: list[dict[str, Any]],
    kubernetes_version: str,
    live_version: str | None,
) -> tuple[str, str]:
    """(version, why) for an operator dependency (see :func:`hpkv.aws.eks.choose_version`)."""
    return eks.choose_version(
        spec.name,
        policy,
        versions,
        kubernetes_version,
        live_version,
        config_key=f"operator.versions.{spec.key}",
        minimum=spec.minimum,
    )


# --- the stage ----------------------------------------------------------------------------------------
@dataclass
class Target:
    """The clusters and account the stage works on (read once per command)."""

    hyperpod_name: str
    hyperpod_arn: str
    eks_name: str
    kubernetes_version: str
    issuer: str
    account: str
    region: str

    @property
    def provider_arn(self) -> str:
        return iam.oidc_provider_arn(self.account, self.issuer)


@dataclass
class RoleState:
    spec: RoleSpec
    name: str
    arn: str
    given: bool
    live: dict[str, Any] | None
    attached: list[str] = field(default_factory=list)


class OperatorStage(Stage):
    name = "operator"
    title = "HyperPod Inference Operator and its dependencies (EKS add-ons, IAM)"
    number = 2
    remove_flags = frozenset({"delete_iam"})

    # --- configuration --------------------------------------------------------------------------
    @property
    def config(self) -> dict[str, Any]:
        return self.ctx.settings.section("operator")

    def version_policy(self, spec: AddonSpec) -> str:
        return str((self.config.get("versions") or {}).get(spec.key) or "default")

    def given_role(self, spec: RoleSpec) -> str | None:
        value = (self.config.get("roles") or {}).get(spec.key)
        if (
            value
            and spec.key == "execution"
            and not iam.role_name(value).startswith(EXECUTION_ROLE_PREFIX)
        ):
            raise ConfigError(
                f"operator.roles.execution: role '{iam.role_name(value)}' does not start with "
                f"{EXECUTION_ROLE_PREFIX}; the operator add-on rejects such an execution role",
                fix=f"name a role {EXECUTION_ROLE_PREFIX}-..., or remove the key so hpkv creates "
                "one",
            )
        return value or None

    def tls_bucket(self, target: Target) -> str:
        value = self.config.get("tlsBucket")
        if value:
            return str(value).removeprefix("s3://").rstrip("/")
        return default_tls_bucket(target.hyperpod_name, target.account)

    def resolve_conflicts(self) -> str:
        return str(self.config.get("resolveConflicts") or "OVERWRITE")

    # --- reads: where ---------------------------------------------------------------------------
    def target(self) -> Target:
        """The clusters (shared reads: one DescribeCluster each per health run; plans read
        afresh)."""
        name = self.ctx.require_cluster()
        hyperpod = reads.hyperpod_cluster(self.ctx)
        cluster = reads.eks_cluster(self.ctx)
        if cluster is None:
            raise PreconditionFailed(
                f"HyperPod cluster '{name}' is not orchestrated by EKS",
                fix="the inference operator needs a HyperPod cluster with the EKS orchestrator",
            )
        eks_name = str(cluster["name"])
        issuer = eks.oidc_issuer(cluster)
        if not issuer:
            raise PreconditionFailed(
                f"EKS cluster '{eks_name}' has no OIDC issuer",
                fix="wait until the EKS cluster is ACTIVE; IRSA needs its OIDC issuer",
            )
        # The cluster's own account (the caller manages it, so IAM calls land there too).
        account = str(hyperpod["ClusterArn"]).split(":")[4]
        return Target(
            hyperpod_name=hyperpod.get("ClusterName", name),
            hyperpod_arn=hyperpod["ClusterArn"],
            eks_name=eks_name,
            kubernetes_version=str(cluster.get("version", "")),
            issuer=issuer,
            account=account,
            region=self.ctx.aws.region,
        )

    # --- reads: desired IAM documents -----------------------------------------------------------
    def trust_statements(self, spec: RoleSpec, target: Target) -> list[dict[str, Any]]:
        subject = iam.service_account_subject(spec.namespace, spec.service_account)
        found = [iam.irsa_statement(target.provider_arn, target.issuer, subject)]
        if spec.sagemaker_trust:
            found.insert(0, iam.service_statement("sagemaker.amazonaws.com"))
        return found

    def inline_policy(self, spec: RoleSpec, target: Target) -> tuple[str, dict[str, Any]] | None:
        if spec.key == "execution":
            bucket = self.tls_bucket(target)
            return "hpkv-tls-certificates", iam.policy_document(
                [
                    {
                        "Sid": "TlsBucketObjects",
                        "Effect": "Allow",
                        "Action": [
                            "s3:GetObject",
                            "s3:PutObject",
                            "s3:PutObjectTagging",
                            "s3:DeleteObject",
                        ],
                        "Resource": [f"arn:aws:s3:::{bucket}/*"],
                    },
                    {
                        "Sid": "TlsBucketList",
                        "Effect": "Allow",
                        "Action": ["s3:ListBucket"],
                        "Resource": [f"arn:aws:s3:::{bucket}"],
                    },
                    {
                        "Sid": "TagCertificates",
                        "Effect": "Allow",
                        "Action": ["acm:AddTagsToCertificate"],
                        "Resource": [f"arn:aws:acm:{target.region}:{target.account}:certificate/*"],
                    },
                ]
            )
        if spec.key == "s3CsiDriver":
            buckets = list(self.config.get("modelBuckets") or ["*"])
            return "hpkv-model-read", iam.policy_document(
                [
                    {
                        "Sid": "MountpointListBuckets",
                        "Effect": "Allow",
                        "Action": ["s3:ListBucket"],
                        "Resource": [f"arn:aws:s3:::{b}" for b in buckets],
                    },
                    {
                        "Sid": "MountpointReadObjects",
                        "Effect": "Allow",
                        "Action": ["s3:GetObject"],
                        "Resource": [f"arn:aws:s3:::{b}/*" for b in buckets],
                    },
                ]
            )
        if spec.key == "keda":
            return "hpkv-keda-metrics", iam.policy_document(
                [
                    {
                        "Sid": "CloudWatchMetrics",
                        "Effect": "Allow",
                        "Action": [
                            "cloudwatch:GetMetricData",
                            "cloudwatch:GetMetricStatistics",
                            "cloudwatch:ListMetrics",
                        ],
                        "Resource": "*",
                    },
                    {
                        "Sid": "PrometheusQueries",
                        "Effect": "Allow",
                        "Action": [
                            "aps:QueryMetrics",
                            "aps:GetLabels",
                            "aps:GetSeries",
                            "aps:GetMetricMetadata",
                        ],
                        "Resource": "*",
                    },
                ]
            )
        return None

    def alb_policy_arn(self, target: Target) -> str:
        return str(
            self.config.get("albPolicyArn")
            or f"arn:aws:iam::{target.account}:policy/{ALB_POLICY_NAME}"
        )

    def managed_policies(self, spec: RoleSpec, target: Target) -> list[str]:
        if spec.key == "alb":
            return [self.alb_policy_arn(target)]
        return list(spec.managed)

    def role_state(self, spec: RoleSpec, target: Target) -> RoleState:
        from hpkv.concurrency import fan_out

        given = self.given_role(spec)
        name = iam.role_name(given) if given else role_name(spec, target.hyperpod_name)

        def attached() -> list[str] | None:
            try:
                return reads.attached_policies(self.ctx, name)
            except NotFound:
                return None  # no such role: GetRole says so

        # Both at once: the policies of a role that exists are wanted anyway.
        live, policies = fan_out([lambda: reads.role(self.ctx, name), attached])
        arn = live["Arn"] if live else f"arn:aws:iam::{target.account}:role/{name}"
        return RoleState(spec, name, arn, given is not None, live, policies or [] if live else [])

    # --- reads: add-on configuration ----------------------------------------------------------
    def addon_configuration(self, target: Target, roles: dict[str, RoleState]) -> dict[str, Any]:
        return {
            "executionRoleArn": roles["execution"].arn,
            "tlsCertificateS3Bucket": self.tls_bucket(target),
            "hyperpodClusterArn": target.hyperpod_arn,
            "alb": {"serviceAccount": {"create": True, "roleArn": roles["alb"].arn}},
            "keda": {"auth": {"aws": {"irsa": {"roleArn": roles["keda"].arn}}}},
        }

    def desired_addon(
        self, spec: AddonSpec, target: Target, roles: dict[str, RoleState]
    ) -> dict[str, Any]:
        """The add-on's settings hpkv manages (version aside)."""
        desired: dict[str, Any] = {}
        if spec.role:
            desired["serviceAccountRoleArn"] = roles[spec.role].arn
        if spec.name == OPERATOR_ADDON:
            desired["configurationValues"] = self.addon_configuration(target, roles)
        return desired

    # --- status ---------------------------------------------------------------------------------
    def status(self) -> list[Check]:
        # Without the clusters nothing can be checked: the first check raises (UNKNOWN, exit 3).
        return self.run_check_functions()

    def check_functions(self) -> list[CheckSpec]:
        """Independent checks (``hpkv status`` runs them side by side; reads are shared)."""
        specs = [
            CheckSpec("cluster", lambda: [self._cluster_check(self.target())]),
            CheckSpec("oidc-provider", lambda: [self._guarded("oidc-provider", self._oidc)]),
            CheckSpec("tls-bucket", lambda: [self._guarded("tls-bucket", self._bucket)]),
        ]
        specs += [
            CheckSpec(f"role/{spec.key}", lambda spec=spec: [self._role_row(spec)])
            for spec in ROLES
        ]
        specs += [
            CheckSpec(
                f"addon/{spec.name}",
                lambda spec=spec: [
                    self._guarded(f"addon/{spec.name}", lambda: self._addon_row(spec))
                ],
            )
            for spec in ADDONS
        ]
        specs += [
            CheckSpec(name, lambda check=check: self._kubernetes_row(check))
            for name, check in self._kubernetes_check_functions().items()
        ]
        return specs

    def installed(self) -> bool | None:
        """The operator add-on exists (in any state), or a Helm-installed operator runs."""
        from hpkv.kube import kube_errors

        if reads.addon(self.ctx, OPERATOR_ADDON) is not None:
            return True
        for name in (OPERATOR_DEPLOYMENT, HELM_OPERATOR_DEPLOYMENT):
            with kube_errors(f"read Deployment {OPERATOR_NAMESPACE}/{name}"):
                if self._deployment(name) is not None:
                    return True
        return False

    def namespaces(self) -> list[str]:
        return [OPERATOR_NAMESPACE]

    def iam_roles(self) -> list[str]:
        cluster = self.target().hyperpod_name
        return [iam.role_name(self.given_role(spec) or role_name(spec, cluster)) for spec in ROLES]

    def _cluster_check(self, target: Target) -> Check:
        return self.check(
            "cluster",
            CheckState.OK,
            f"HyperPod {target.hyperpod_name} on EKS {target.eks_name} "
            f"(Kubernetes {target.kubernetes_version})",
        )

    def _oidc(self) -> Check:
        return self._oidc_check(self.target())

    def _bucket(self) -> Check:
        return self._bucket_check(self.target())

    def _role_row(self, spec: RoleSpec) -> Check:
        target = self.target()
        try:
            role = self.role_state(spec, target)
        except HpkvError as exc:
            return self.check(f"role/{spec.key}", CheckState.UNKNOWN, exc.one_line(), exc.fix or "")
        return self._role_check(role, target)

    def _roles(self, target: Target) -> dict[str, RoleState]:
        """Every role's state (each read once per health run); roles that cannot be read are left
        out."""
        from hpkv.concurrency import fan_out

        def state(spec: RoleSpec) -> RoleState | None:
            try:
                return self.role_state(spec, target)
            except HpkvError:
                return None

        states = fan_out([lambda spec=spec: state(spec) for spec in ROLES])
        return {r.spec.key: r for r in states if r is not None}

    def _addon_row(self, spec: AddonSpec) -> Check:
        from hpkv.concurrency import fan_out

        target = self.target()
        wants_roles = spec.role is not None or spec.name == OPERATOR_ADDON
        # The add-on and the roles its settings name, read side by side.
        roles, _addon = fan_out(
            [
                lambda: self._roles(target) if wants_roles else {},
                lambda: reads.addon(self.ctx, spec.name),
            ]
        )
        return self._addon_check(spec, target, roles)

    def _operator_addon_exists(self) -> bool:
        return reads.addon(self.ctx, OPERATOR_ADDON) is not None

    def _kubernetes_row(self, check: Callable[[CheckState], Check]) -> list[Check]:
        # Before the operator add-on exists, what it installs is expected to be missing.
        try:
            missing = CheckState.FAIL if self._operator_addon_exists() else CheckState.WARN
        except HpkvError:
            missing = CheckState.FAIL
        return self._kubernetes_guarded([check], missing)

    def _guarded(self, name: str, check: Callable[[], Check]) -> Check:
        """Run one check; an API error becomes an UNKNOWN check instead of ending the report."""
        try:
            return check()
        except HpkvError as exc:
            return self.check(name, CheckState.UNKNOWN, exc.one_line(), exc.fix or "")

    def _oidc_check(self, target: Target) -> Check:
        if iam.oidc_provider_exists(self.ctx.aws, target.provider_arn):
            return self.check("oidc-provider", CheckState.OK, f"{target.provider_arn} exists")
        return self.check(
            "oidc-provider",
            CheckState.WARN,
            f"no IAM OIDC provider for {target.issuer} (IRSA cannot work)",
            "run 'hpkv operator apply'",
        )

    def _bucket_check(self, target: Target) -> Check:
        bucket = self.tls_bucket(target)
        state = s3.bucket_state(self.ctx.aws, bucket)
        if state == "present":
            return self.check("tls-bucket", CheckState.OK, f"s3://{bucket} exists")
        if state == "forbidden":
            return self.check(
                "tls-bucket",
                CheckState.FAIL,
                f"s3://{bucket} exists but belongs to another account",
                "set operator.tlsBucket to a bucket name of your own",
            )
        return self.check(
            "tls-bucket",
            CheckState.WARN,
            f"s3://{bucket} does not exist",
            "run 'hpkv operator apply'",
        )

    def _role_check(self, role: RoleState, target: Target) -> Check:
        name = f"role/{role.spec.key}"
        origin = "given in hpkv.yaml" if role.given else "managed by hpkv"
        if role.live is None:
            return self.check(
                name,
                CheckState.FAIL if role.given else CheckState.WARN,
                f"{role.name} ({origin}) does not exist",
                "create it, or remove operator.roles." + role.spec.key
                if role.given
                else "run 'hpkv operator apply'",
            )
        drift = trust_drift(
            role.live.get("AssumeRolePolicyDocument"), self.trust_statements(role.spec, target)
        )
        if drift is not None:
            return self.check(
                name,
                CheckState.WARN,
                f"{role.name} ({origin}): trust policy {drift.summary}",
                "review the difference with 'hpkv operator apply --dry-run', fix it with "
                "'hpkv operator apply --yes'",
            )
        missing = [p for p in self.managed_policies(role.spec, target) if p not in role.attached]
        if missing:
            return self.check(
                name,
                CheckState.WARN,
                f"{role.name} ({origin}) lacks policy {', '.join(missing)}",
                f"attach it: aws iam attach-role-policy --role-name {role.name} --policy-arn "
                f"{missing[0]}"
                if role.given
                else "run 'hpkv operator apply'",
            )
        return self.check(
            name, CheckState.OK, f"{role.name} ({origin}): trust and policies in place"
        )

    def _addon_check(self, spec: AddonSpec, target: Target, roles: dict[str, RoleState]) -> Check:
        name = f"addon/{spec.name}"
        live = reads.addon(self.ctx, spec.name)
        if live is None:
            return self.check(name, CheckState.WARN, "not installed", "run 'hpkv operator apply'")
        status, version = live.get("status"), live.get("addonVersion", "?")
        issues = eks.health_issues(live)
        if status in eks.FAILED:
            return self.check(
                name,
                CheckState.FAIL,
                f"{status} at {version}: {eks.health_summary(live)}",
                remedies(issues),
            )
        if status in eks.BUSY:
            return self.check(name, CheckState.WARN, f"{status} ({version})", "wait, then recheck")
        if eks.version_key(version) < eks.version_key(spec.minimum):
            return self.check(
                name,
                CheckState.FAIL,
                f"ACTIVE at {version}, below the documented minimum {spec.minimum}",
                "run 'hpkv operator apply' to upgrade it",
            )
        if roles and all(r in roles for r in ("execution", "alb", "keda")):
            differences = addon_plan.setting_differences(
                live, self.desired_addon(spec, target, roles)
            )
            if differences:
                return self.check(
                    name,
                    CheckState.WARN,
                    f"ACTIVE at {version}; differs from hpkv.yaml in {', '.join(differences)}",
                    "run 'hpkv operator apply'",
                )
        return self.check(name, CheckState.OK, f"ACTIVE at {version}")

    # --- Kubernetes verification ----------------------------------------------------------------
    def kubernetes_checks(self, *, missing: CheckState = CheckState.FAIL) -> list[Check]:
        """The operator's footprint in Kubernetes; ``missing`` is the state of an absent part."""
        return self._kubernetes_guarded(list(self._kubernetes_check_functions().values()), missing)

    def _kubernetes_guarded(
        self, checks: list[Callable[[CheckState], Check]], missing: CheckState
    ) -> list[Check]:
        try:
            return [check(missing) for check in checks]
        except HpkvError as exc:
            return [
                self.check(
                    "kubernetes", CheckState.UNKNOWN, exc.one_line(), exc.fix or "check access"
                )
            ]

    def _kubernetes_check_functions(self) -> dict[str, Callable[[CheckState], Check]]:
        found: dict[str, Callable[[CheckState], Check]] = {
            f"csidriver/{driver}": lambda missing, d=driver: self._csi_driver_check(d, missing)
            for driver in CSI_DRIVERS
        }
        found["cert-manager-crds"] = self._cert_manager_check
        found["operator-deployment"] = lambda missing: self._deployment_check(
            self._deployment(OPERATOR_DEPLOYMENT), missing
        )
        found["endpoint-crd"] = self._endpoint_crd_check
        return found

    def _deployment(self, name: str) -> Any:
        return reads.optional(
            self.ctx,
            ("kube:deployment", OPERATOR_NAMESPACE, name),
            f"Deployment {OPERATOR_NAMESPACE}/{name}",
            lambda: self.ctx.kube.apps.read_namespaced_deployment(name, OPERATOR_NAMESPACE),
        )

    def _csi_driver(self, driver: str) -> Any:
        return reads.optional(
            self.ctx,
            ("kube:csidriver", driver),
            f"CSIDriver {driver}",
            lambda: self.ctx.kube.storage.read_csi_driver(driver),
        )

    def missing_cert_manager_crds(self) -> list[str]:
        # Served kinds: one small discovery request instead of reading the (large) CRDs.
        served = reads.served_kinds(self.ctx, CERT_MANAGER_API)
        return [
            crd
            for crd in CERT_MANAGER_CRDS
            if CERT_MANAGER_KINDS[crd] not in served and reads.crd(self.ctx, crd) is None
        ]

    def _endpoint_crd_check(self, missing: CheckState) -> Check:
        # The CRD is thousands of lines: discovery says whether it is served (Established).
        if reads.serves(self.ctx, INFERENCE_API_VERSION, ENDPOINT_KIND):
            return self.check("endpoint-crd", CheckState.OK, f"CRD {ENDPOINT_CRD} Established")
        return self._crd_check(reads.crd(self.ctx, ENDPOINT_CRD), missing)

    def _csi_driver_check(self, driver: str, missing: CheckState) -> Check:
        found = self._csi_driver(driver)
        return self.check(
            f"csidriver/{driver}",
            CheckState.OK if found else missing,
            "registered" if found else "missing (its CSI add-on is not running)",
            "" if found else "check the CSI driver add-on with 'hpkv operator status'",
        )

    def _cert_manager_check(self, missing: CheckState) -> Check:
        absent = self.missing_cert_manager_crds()
        return self.check(
            "cert-manager-crds",
            missing if absent else CheckState.OK,
            f"missing: {', '.join(absent)}" if absent else "present",
            "check the cert-manager add-on" if absent else "",
        )

    def _deployment_check(self, deployment: Any, missing: CheckState) -> Check:
        name = "operator-deployment"
        where = f"{OPERATOR_NAMESPACE}/{OPERATOR_DEPLOYMENT}"
        if deployment is None:
            return self.check(
                name, missing, f"Deployment {where} not found", "check the operator add-on"
            )
        status = deployment.status
        conditions = {c.type: c for c in (status.conditions or [])} if status else {}
        available = conditions.get("Available")
        ready = (
            f"{(status.ready_replicas or 0) if status else 0}/{deployment.spec.replicas or 0} ready"
        )
        if available is not None and available.status == "True":
            return self.check(name, CheckState.OK, f"Deployment {where} Available ({ready})")
        reason = (
            f"{available.reason}: {available.message}" if available else "no Available condition"
        )
        return self.check(
            name,
            CheckState.FAIL,
            f"Deployment {where} not Available ({ready}; {reason})",
            f"kubectl logs -n {OPERATOR_NAMESPACE} deployment/{OPERATOR_DEPLOYMENT}",
        )

    def _crd_check(self, crd: Any, missing: CheckState) -> Check:
        name = "endpoint-crd"
        if crd is None:
            return self.check(
                name, missing, f"CRD {ENDPOINT_CRD} not found", "check the operator add-on"
            )
        conditions = {c.type: c.status for c in (crd.status.conditions or [])} if crd.status else {}
        if conditions.get("Established") == "True":
            return self.check(name, CheckState.OK, f"CRD {ENDPOINT_CRD} Established")
        return self.check(
            name,
            CheckState.FAIL,
            f"CRD {ENDPOINT_CRD} not Established",
            "check the operator add-on and the API server",
        )

    def _self_managed(self) -> dict[str, str]:
        """Add-on name -> evidence, for dependencies already installed outside EKS add-ons.

        Creating an add-on over them would take them over (or fail with ConfigurationConflict), so
        hpkv leaves them alone, as the HyperPod CLI's migration script does.
        """
        from hpkv.kube import is_status, kube_errors

        kube = self.ctx.kube
        found: dict[str, str] = {}

        def exists(reader: Callable[[], Any], what: str) -> bool:
            with kube_errors(f"read {what}"):
                try:
                    reader()
                except Exception as exc:
                    if is_status(exc, 404):
                        return False
                    raise
            return True

        if exists(lambda: kube.storage.read_csi_driver("s3.csi.aws.com"), "CSIDriver"):
            found["aws-mountpoint-s3-csi-driver"] = "CSIDriver s3.csi.aws.com exists"
        if exists(lambda: kube.storage.read_csi_driver("fsx.csi.aws.com"), "CSIDriver"):
            found["aws-fsx-csi-driver"] = "CSIDriver fsx.csi.aws.com exists"
        if exists(
            lambda: kube.apiextensions.read_custom_resource_definition(CERT_MANAGER_CRDS[0]),
            "CRD",
        ):
            found["cert-manager"] = f"CRD {CERT_MANAGER_CRDS[0]} exists"
        if exists(lambda: self._read_api_service(METRICS_API_SERVICE), "APIService"):
            found["metrics-server"] = f"APIService {METRICS_API_SERVICE} exists"
        if exists(
            lambda: kube.apps.read_namespaced_deployment(
                HELM_OPERATOR_DEPLOYMENT, OPERATOR_NAMESPACE
            ),
            "Deployment",
        ):
            found[OPERATOR_ADDON] = f"Helm Deployment {HELM_OPERATOR_DEPLOYMENT} exists"
        return found

    def _read_api_service(self, name: str) -> Any:
        from kubernetes import client

        return client.ApiregistrationV1Api(self.ctx.kube.api_client).read_api_service(name)

    # --- diagnose -------------------------------------------------------------------------------
    def detectors(self) -> list[Detector]:
        def detector(
            what: str, title: str, component: str, fn: Any, *, requires_install: bool = True
        ) -> Detector:
            return Detector.of(
                f"operator.{what}",
                title,
                component,
                fn,
                stage=self.name,
                requires_install=requires_install,
            )

        return [
            # Add-ons, webhooks and roles are checked before the operator add-on exists too: a
            # failed dependency or a dead webhook is what keeps it from being installed.
            detector("addon-unhealthy", "EKS add-on failed or degraded", "eks-addons",
                     self._detect_addons, requires_install=False),
            detector("webhook-without-endpoints", "Webhook Service without ready endpoints",
                     "kubernetes", self._detect_webhooks, requires_install=False),
            detector("irsa-trust-drift", "IRSA role trust policy drift", "iam",
                     self._detect_trust_drift, requires_install=False),
            detector("csi-driver-missing", "CSIDriver or FSx node DaemonSet missing", "csi",
                     self._detect_csi),
            detector("cert-manager-crds-missing", "cert-manager CRDs missing", "cert-manager",
                     self._detect_cert_manager),
        ]  # fmt: skip

    def _detect_addons(self, detector: Detector) -> list[Finding]:
        from hpkv.concurrency import fan_out

        cluster = reads.eks_cluster(self.ctx)
        if cluster is None:
            return []
        live = fan_out([lambda spec=spec: reads.addon(self.ctx, spec.name) for spec in ADDONS])
        return [
            addon_plan.failed_addon_finding(detector, cluster["name"], addon, remedies)
            for addon in live
            if addon is not None and addon.get("status") in eks.FAILED
        ]

    def _detect_webhooks(self, detector: Detector) -> list[Finding]:
        from hpkv.concurrency import fan_out

        callers = self._webhook_services()
        services = sorted(callers)
        states = fan_out([lambda key=key: self._service_endpoints(*key) for key in services])
        findings = []
        for key, state in zip(services, states, strict=True):
            if state is None:
                continue
            findings.append(self._webhook_finding(detector, key, state, callers[key]))
        return findings

    def _webhook_services(self) -> dict[tuple[str, str], list[str]]:
        """(namespace, service) -> what calls it: the endpoint CRD's conversion webhook and every
        admission webhook that fails closed (failurePolicy Fail)."""
        from kubernetes import client

        from hpkv.kube import kube_errors

        callers: dict[tuple[str, str], list[str]] = {}
        # As JSON, not as the client's models: its schema alone is thousands of lines.
        crd = self.ctx.kube.get_json(
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{ENDPOINT_CRD}",
            what=f"read CRD {ENDPOINT_CRD}",
        )
        conversion = ((crd or {}).get("spec") or {}).get("conversion") or {}
        service = ((conversion.get("webhook") or {}).get("clientConfig") or {}).get("service")
        if conversion.get("strategy") == "Webhook" and service:
            key = (service.get("namespace", ""), service.get("name", ""))
            callers.setdefault(key, []).append(f"the conversion webhook of CRD {ENDPOINT_CRD}")
        api = client.AdmissionregistrationV1Api(self.ctx.kube.api_client)
        with kube_errors("list webhook configurations"):
            configs = [
                ("MutatingWebhookConfiguration", api.list_mutating_webhook_configuration().items),
                (
                    "ValidatingWebhookConfiguration",
                    api.list_validating_webhook_configuration().items,
                ),
            ]
        for kind, items in configs:
            for config in items:
                for hook in config.webhooks or []:
                    service = hook.client_config.service
                    if service is None or (hook.failure_policy or "Fail") != "Fail":
                        continue
                    key = (service.namespace, service.name)
                    callers.setdefault(key, []).append(
                        f"webhook {hook.name} ({kind} {config.metadata.name})"
                    )
        return callers

    def _service_endpoints(self, namespace: str, name: str) -> str | None:
        """Why a Service has no ready endpoints, or None when it has some."""
        from hpkv.kube import is_status, kube_errors

        with kube_errors(f"read Service {namespace}/{name}"):
            try:
                self.ctx.kube.core.read_namespaced_service(name, namespace)
            except Exception as exc:
                if is_status(exc, 404):
                    return "does not exist"
                raise
        for endpoint_slice in reads.endpoint_slices(self.ctx, namespace, name):
            for endpoint in endpoint_slice.endpoints or []:
                ready = endpoint.conditions.ready if endpoint.conditions else None
                if endpoint.addresses and ready is not False:
                    return None
        return "has no ready endpoints (its pods are not running or not Ready)"

    def _webhook_finding(
        self, detector: Detector, key: tuple[str, str], state: str, callers: list[str]
    ) -> Finding:
        namespace, name = key
        evidence = (
            f"Service {namespace}/{name} {state}; it serves {', '.join(callers[:3])}: the API "
            f"server refuses those requests ('no endpoints available for service \"{name}\"'), "
            f"and the operator add-on's install ends CREATE_FAILED"
        )
        if "kueue" in f"{namespace}/{name}":
            fix = (
                "Kueue is scaled to 0 or down: start it again ('kubectl -n "
                f"{namespace} scale deployment kueue-controller-manager --replicas=1'), then "
                "rerun 'hpkv operator apply' (it re-creates a CREATE_FAILED add-on with --preserve)"
            )
        elif namespace == OPERATOR_NAMESPACE:
            fix = (
                f"the operator's pods are not serving: 'kubectl -n {OPERATOR_NAMESPACE} get pods' "
                f"and 'kubectl -n {OPERATOR_NAMESPACE} logs deployment/{OPERATOR_DEPLOYMENT}'; "
                "then rerun 'hpkv operator apply'"
            )
        else:
            fix = (
                f"start the workload behind Service {namespace}/{name} (kubectl -n {namespace} "
                "get pods), or delete the webhook configuration if its component was removed"
            )
        return detector.finding(
            Severity.CRITICAL,
            evidence,
            fix,
            [f"Service/{namespace}/{name}"],
            title=f"webhook Service {namespace}/{name} without ready endpoints",
        )

    def _detect_trust_drift(self, detector: Detector) -> list[Finding]:
        target = self.target()
        findings = []
        for role in self._roles(target).values():
            if role.live is None:
                continue
            drift = trust_drift(
                role.live.get("AssumeRolePolicyDocument"), self.trust_statements(role.spec, target)
            )
            if drift is not None:
                findings.append(
                    trust_drift_finding(
                        detector,
                        role.name,
                        role.spec.title,
                        drift,
                        "review the difference with 'hpkv operator apply --dry-run', fix it with "
                        "'hpkv operator apply --yes' (statements for other principals are kept)",
                    )
                )
        return findings

    def _detect_csi(self, detector: Detector) -> list[Finding]:
        from hpkv.concurrency import fan_out

        cluster = reads.eks_cluster(self.ctx)
        eks_name = cluster["name"] if cluster else "<eks-cluster>"
        findings = []
        drivers = fan_out([lambda d=driver: self._csi_driver(d) for driver in CSI_DRIVERS])
        for driver, found, addon in zip(
            CSI_DRIVERS,
            drivers,
            ("aws-mountpoint-s3-csi-driver", "aws-fsx-csi-driver"),
            strict=True,
        ):
            if found is not None:
                continue
            installed = reads.addon(self.ctx, addon) is not None
            fix = (
                f"repair the add-on: aws eks update-addon --cluster-name {eks_name} --addon-name "
                f"{addon} --resolve-conflicts OVERWRITE"
                if installed
                else f"install it: 'hpkv operator apply' (creates the {addon} add-on)"
            )
            findings.append(
                detector.finding(
                    Severity.CRITICAL,
                    f"CSIDriver {driver} does not exist: the operator's check-csi-drivers init "
                    "container waits for it (the operator never starts) and models cannot be "
                    f"mounted from {'S3' if 's3' in driver else 'FSx'}",
                    fix,
                    [f"CSIDriver/{driver}"],
                    title=f"CSIDriver {driver} missing",
                )
            )
        if reads.addon(self.ctx, "aws-fsx-csi-driver") is not None:
            findings += self._fsx_node_findings(detector, eks_name)
        return findings

    def _fsx_node_findings(self, detector: Detector, eks_name: str) -> list[Finding]:
        namespace, name = FSX_NODE_DAEMONSET
        where = f"DaemonSet/{namespace}/{name}"
        repair = (
            f"aws eks update-addon --cluster-name {eks_name} --addon-name aws-fsx-csi-driver "
            "--resolve-conflicts OVERWRITE (restores the add-on's DaemonSet)"
        )
        ds = reads.optional(
            self.ctx,
            ("kube:daemonset", namespace, name),
            f"DaemonSet {namespace}/{name}",
            lambda: self.ctx.kube.apps.read_namespaced_daemon_set(name, namespace),
        )
        if ds is None:
            return [
                detector.finding(
                    Severity.CRITICAL,
                    f"{where} (the FSx CSI node plugin) does not exist: FSx volumes fail to "
                    "mount with 'driver name fsx.csi.aws.com not found in the list of registered "
                    "CSI drivers'",
                    repair,
                    [where],
                    title="FSx CSI node DaemonSet missing",
                )
            ]
        desired = (ds.status.desired_number_scheduled or 0) if ds.status else 0
        ready = (ds.status.number_ready or 0) if ds.status else 0
        if ready >= desired:
            return []
        return [
            detector.finding(
                Severity.WARNING,
                f"{where} is ready on {ready} of {desired} nodes: FSx volumes cannot mount on "
                "the others",
                f"kubectl -n {namespace} get pods -l app={name} -o wide; if it stays, {repair}",
                [where],
                title="FSx CSI node plugin not on every node",
            )
        ]

    def _detect_cert_manager(self, detector: Detector) -> list[Finding]:
        absent = self.missing_cert_manager_crds()
        if not absent:
            return []
        cert_manager = reads.addon(self.ctx, "cert-manager")
        fix = (
            "the cert-manager add-on is "
            + (cert_manager.get("status", "?") if cert_manager else "not installed")
            + ": run 'hpkv operator apply' (installs or repairs it); a self-managed cert-manager "
            "must install its CRDs (installCRDs=true)"
        )
        return [
            detector.finding(
                Severity.CRITICAL,
                f"CRD(s) {', '.join(absent)} missing: the operator's check-csi-drivers init "
                "container waits for them and the operator never starts (no TLS certificates "
                "for endpoints)",
                fix,
                [f"CustomResourceDefinition/{crd}" for crd in absent],
            )
        ]

    # --- plan -----------------------------------------------------------------------------------
    def plan(self, **_: Any) -> Plan:
        target = self.target()
        plan = Plan(stage=self.name)
        plan.add(self._plan_oidc(target))
        plan.add(self._plan_bucket(target))
        roles: dict[str, RoleState] = {}
        for spec in ROLES:
            roles[spec.key] = self.role_state(spec, target)
            self._plan_role(plan, roles[spec.key], target)
        try:
            self_managed = self._self_managed()
        except HpkvError as exc:
            self_managed = {}
            plan.notes.append(
                f"could not look for dependencies installed outside EKS add-ons: {exc.message}"
            )
        for spec in ADDONS:
            plan.add(self._plan_addon(spec, target, roles, self_managed))
        return plan

    def _plan_oidc(self, target: Target) -> Action:
        return irsa.plan_oidc_provider(
            self.ctx.aws, target.account, target.issuer, iam.MANAGED_TAGS
        )

    def _plan_bucket(self, target: Target) -> Action:
        bucket = self.tls_bucket(target)
        what = f"s3 bucket/{bucket}"
        state = s3.bucket_state(self.ctx.aws, bucket)
        if state == "present":
            return Action(what, Verb.NONE, "exists")
        if state == "forbidden":
            raise PreconditionFailed(
                f"S3 bucket {bucket} exists but belongs to another account",
                fix="set operator.tlsBucket in hpkv.yaml to a bucket name of your own",
            )
        return Action(
            what,
            Verb.CREATE,
            f"create the operator's TLS certificate bucket in {target.region}",
            None,
            {"bucket": bucket, "region": target.region},
            run=lambda: s3.create_bucket(self.ctx.aws, bucket, tags=iam.MANAGED_TAGS),
        )

    def _plan_role(self, plan: Plan, role: RoleState, target: Target) -> None:
        spec = role.spec
        if role.live is None and role.given:
            raise PreconditionFailed(
                f"role {role.name} (operator.roles.{spec.key}) does not exist",
                fix="create it, or remove the key so hpkv creates one",
            )
        wanted = self.wanted_role(role, target)
        actions = irsa.plan_role_with_permissions(
            self.ctx.aws,
            wanted,
            role.live,
            role.attached,
            fix_trust=self.ctx.options.yes,
            notes=plan.notes,
        )
        origin = "given in hpkv.yaml" if role.given else "up to date"
        for action in actions or [Action(wanted.target, Verb.NONE, f"{spec.title}: {origin}")]:
            plan.add(action)

    def wanted_role(self, role: RoleState, target: Target) -> irsa.IrsaRole:
        """The role as hpkv wants it. A role given in hpkv.yaml keeps its permissions: hpkv
        checks only its trust."""
        spec = role.spec
        return irsa.IrsaRole(
            name=role.name,
            title=spec.title,
            subject=iam.service_account_subject(spec.namespace, spec.service_account),
            trust=self.trust_statements(spec, target),
            managed=() if role.given else tuple(self.managed_policies(spec, target)),
            inline=None if role.given else self.inline_policy(spec, target),
            description=f"hpkv: {spec.title} for HyperPod cluster {target.hyperpod_name}",
            policy_fixes={self.alb_policy_arn(target): ALB_POLICY_FIX} if spec.key == "alb" else {},
        )

    def _plan_addon(
        self,
        spec: AddonSpec,
        target: Target,
        roles: dict[str, RoleState],
        self_managed: dict[str, str],
    ) -> Action:
        live = self._settled_addon(spec, target)
        if live is None and spec.name in self_managed:
            evidence = self_managed[spec.name]
            if spec.name == OPERATOR_ADDON:
                raise PreconditionFailed(
                    f"the inference operator is installed with Helm ({evidence} in "
                    f"{OPERATOR_NAMESPACE}); hpkv manages the EKS add-on",
                    fix="migrate it with the HyperPod CLI's helm_chart/HyperPodHelmChart/charts/"
                    "inference-operator/migration/helm_to_addon.sh, or uninstall the Helm release",
                )
            return Action(
                f"eks addon/{spec.name}",
                Verb.NONE,
                f"installed outside EKS add-ons ({evidence}); left alone",
            )
        wanted = addon_plan.AddonWanted(
            cluster=target.eks_name,
            name=spec.name,
            kubernetes_version=target.kubernetes_version,
            version_policy=self.version_policy(spec),
            config_key=f"operator.versions.{spec.key}",
            settings=self.desired_addon(spec, target, roles),
            resolve_create=self.resolve_conflicts(),
            resolve_update=self.resolve_conflicts(),
            minimum=spec.minimum,
            minimum_source="the HyperPod Inference Operator documents",
            remedy=remedies,
        )
        return addon_plan.plan_addon(self.ctx, wanted, live)

    def _settled_addon(self, spec: AddonSpec, target: Target) -> dict[str, Any] | None:
        """DescribeAddon; a busy add-on is waited for with --wait, refused otherwise."""
        live = eks.describe_addon(self.ctx.aws, target.eks_name, spec.name)
        if live is None or live.get("status") not in eks.BUSY:
            return live
        if self.ctx.options.wait is not True:
            raise PreconditionFailed(
                f"add-on {spec.name} is {live['status']}; hpkv does not start a second change",
                fix="rerun with --wait to wait for it, or retry when it is done",
            )
        deleted = live["status"] == "DELETING"
        with self.ctx.reporter.waiting(f"waiting for add-on {spec.name} ({live['status']})"):
            try:
                return eks.wait_addon(
                    self.ctx.aws,
                    target.eks_name,
                    spec.name,
                    deleted=deleted,
                    timeout=self.ctx.options.timeout,
                    delay=poll_interval(10.0),
                )
            except eks.AddonWaitFailed as exc:
                return exc.addon

    def apply(self, plan: Plan) -> ApplyResult:
        result = self.run_plan(plan)
        result.notes.extend(n.split("\n", 1)[0] for n in plan.notes)
        if self.ctx.options.wait is False:
            result.notes.append(
                "not verifying Kubernetes (--no-wait); check with 'hpkv operator status'"
            )
            return result
        result.checks.extend(self._wait_kubernetes())
        return result

    def _wait_kubernetes(self) -> list[Check]:
        deadline = time.monotonic() + self.ctx.options.timeout
        with self.ctx.reporter.waiting("waiting for the operator to be ready in Kubernetes"):
            while True:
                checks = self.kubernetes_checks()
                failing = [c for c in checks if c.state is not CheckState.OK]
                if not failing:
                    return checks
                if time.monotonic() >= deadline:
                    first = failing[0]
                    raise WaitTimeout(
                        f"the operator was not ready in Kubernetes within "
                        f"{int(self.ctx.options.timeout)}s: {first.name}: {first.evidence}",
                        fix=first.remediation or "check 'hpkv operator status'",
                    )
                time.sleep(min(poll_interval(5.0), max(0.0, deadline - time.monotonic())))

    # --- remove ---------------------------------------------------------------------------------
    def endpoints(self) -> list[EndpointRef]:
        from hpkv.topology import list_endpoints

        return list_endpoints(self.ctx.kube)

    def plan_remove(self, *, delete_iam: bool = False, force: bool = False, **_: Any) -> Plan:
        target = self.target()
        plan = Plan(stage=self.name)
        try:
            endpoints = self.endpoints()
        except HpkvError as exc:
            if not force:
                raise PreconditionFailed(
                    f"cannot check for InferenceEndpointConfigs: {exc.message}",
                    fix="fix Kubernetes access, or pass --force to remove the operator anyway",
                ) from None
            endpoints = []
            plan.notes.append(f"could not check for endpoints ({exc.message}); --force given")
        if endpoints:
            shown = ", ".join(str(e) for e in endpoints[:5]) + (
                " ..." if len(endpoints) > 5 else ""
            )
            if not force:
                raise PreconditionFailed(
                    f"{len(endpoints)} InferenceEndpointConfig(s) still exist: {shown}",
                    fix="delete them first ('hpkv endpoint delete NAME -n NAMESPACE'), or pass "
                    "--force to remove the operator anyway (they stop being reconciled)",
                )
            plan.notes.append(
                f"--force: {len(endpoints)} endpoint(s) stay without an operator: {shown}"
            )
        for spec in reversed(ADDONS):
            plan.add(self._plan_remove_addon(spec, target))
        if not delete_iam:
            plan.kept.extend(self.kept_without_delete_iam(target))
            return plan
        for spec in ROLES:
            plan.add(self._plan_remove_role(spec, target))
        plan.add(self._plan_remove_bucket(target))
        plan.add(
            Action(
                f"iam oidc-provider/{iam.issuer_host(target.issuer)}",
                Verb.NONE,
                "kept: other IRSA roles of this cluster may depend on it",
            )
        )
        return plan

    def _plan_remove_addon(self, spec: AddonSpec, target: Target) -> Action:
        what = f"eks addon/{spec.name}"
        live = self._settled_addon(spec, target)
        if live is None:
            return Action(what, Verb.NONE, "not installed")
        tags = live.get("tags") or {}
        if tags.get(iam.MANAGED_BY_TAG) != iam.MANAGED_BY_VALUE:
            return Action(what, Verb.NONE, "kept: not created by hpkv")
        return Action(
            what,
            Verb.DELETE,
            f"delete {live.get('addonVersion')} and the Kubernetes resources it installed",
            {"addonVersion": live.get("addonVersion"), "status": live.get("status")},
            None,
            run=lambda: self._delete_addon(spec, target),
        )

    def _delete_addon(self, spec: AddonSpec, target: Target) -> None:
        if eks.describe_addon(self.ctx.aws, target.eks_name, spec.name) is None:
            return
        eks.delete_addon(self.ctx.aws, target.eks_name, spec.name)
        addon_plan.wait_for(self.ctx, target.eks_name, spec.name, deleted=True, remedy=remedies)

    def _plan_remove_role(self, spec: RoleSpec, target: Target) -> Action:
        given = self.given_role(spec)
        name = iam.role_name(given) if given else role_name(spec, target.hyperpod_name)
        what = f"iam role/{name}"
        if given:
            return Action(what, Verb.NONE, "kept: given in hpkv.yaml")
        live = iam.get_role(self.ctx.aws, name)
        if live is None:
            return Action(what, Verb.NONE, "already absent")
        if not iam.is_managed_by_hpkv({"Tags": iam.role_tags(self.ctx.aws, name)}):
            return Action(what, Verb.NONE, "kept: not created by hpkv")
        return Action(
            what,
            Verb.DELETE,
            f"delete the {spec.title} (detach policies, delete inline policies)",
            {"exists": True},
            None,
            run=lambda: iam.delete_role(self.ctx.aws, name),
        )

    def _plan_remove_bucket(self, target: Target) -> Action:
        bucket = self.tls_bucket(target)
        what = f"s3 bucket/{bucket}"
        if s3.bucket_state(self.ctx.aws, bucket) != "present":
            return Action(what, Verb.NONE, "absent or not ours")
        tags = s3.bucket_tags(self.ctx.aws, bucket)
        if tags.get(iam.MANAGED_BY_TAG) != iam.MANAGED_BY_VALUE:
            return Action(what, Verb.NONE, "kept: not created by hpkv")
        return Action(
            what,
            Verb.DELETE,
            "empty and delete the TLS certificate bucket",
            {"exists": True},
            None,
            run=lambda: s3.delete_bucket(self.ctx.aws, bucket),
            destructive=True,
        )

    def remove(self, plan: Plan) -> ApplyResult:
        result = self.run_plan(plan)
        result.notes.extend(n.split("\n", 1)[0] for n in plan.notes)
        return result

    def kept_without_delete_iam(self, target: Target) -> list[str]:
        """What a removal without --delete-iam leaves in place (``Plan.kept``)."""
        roles = [
            iam.role_name(self.given_role(spec) or role_name(spec, target.hyperpod_name))
            for spec in ROLES
        ]
        return [
            f"IAM roles {', '.join(roles)} (--delete-iam deletes those hpkv created)",
            f"TLS certificate bucket s3://{self.tls_bucket(target)} (--delete-iam deletes it "
            "when hpkv created it)",
            f"IAM OIDC provider {iam.issuer_host(target.issuer)} (other IRSA roles of the cluster "
            "may use it)",
        ]

    # --- offline plan (hpkv up --offline) --------------------------------------------------------
    def target_from(
        self, hyperpod: dict[str, Any], cluster: dict[str, Any], account: str, region: str
    ) -> Target:
        """The Target from DescribeCluster answers (SageMaker, EKS) already at hand."""
        return Target(
            hyperpod_name=hyperpod["ClusterName"],
            hyperpod_arn=hyperpod["ClusterArn"],
            eks_name=sagemaker.eks_cluster_name(hyperpod) or str(cluster.get("name", "")),
            kubernetes_version=str(cluster.get("version", "")),
            issuer=eks.oidc_issuer(cluster) or "",
            account=account,
            region=region,
        )

    def plan_offline(self, profile: ClusterProfile) -> Plan:
        """The plan for the profile's cluster with nothing of this stage in place except the
        add-ons it lists, from the same desired state the live plan uses (no API call)."""
        target = self.target_from(
            profile.describe_hyperpod(), profile.describe_eks(), profile.account, profile.region
        )
        plan = Plan(stage=self.name)
        plan.add(irsa.oidc_provider_creation(None, target.issuer, iam.MANAGED_TAGS))
        bucket = self.tls_bucket(target)
        plan.add(
            Action(
                f"s3 bucket/{bucket}",
                Verb.CREATE,
                f"create the operator's TLS certificate bucket in {target.region}",
                None,
                {"bucket": bucket, "region": target.region},
            )
        )
        roles: dict[str, RoleState] = {}
        for spec in ROLES:
            given = self.given_role(spec)
            name = iam.role_name(given) if given else role_name(spec, target.hyperpod_name)
            arn = f"arn:aws:iam::{target.account}:role/{name}"
            roles[spec.key] = RoleState(spec, name, arn, given is not None, None)
            wanted = self.wanted_role(roles[spec.key], target)
            if given:
                plan.add(
                    Action(
                        wanted.target,
                        Verb.NONE,
                        f"{spec.title}: given in hpkv.yaml (trust "
                        "checked when planning against the cluster)",
                    )
                )
            else:
                plan.add(irsa.role_creation(None, wanted))
        installed = {str(a.get("name")): a for a in profile.addons}
        for spec in ADDONS:
            plan.add(self._offline_addon(spec, target, roles, installed.get(spec.name)))
        plan.notes.append(
            f"the ALB controller role needs the IAM policy {self.alb_policy_arn(target)}: "
            + ALB_POLICY_FIX
        )
        plan.notes.append(
            "add-on versions are chosen from EKS DescribeAddonVersions when planning against the "
            f"cluster; then hpkv waits for each add-on to be ACTIVE and for the operator's "
            f"Deployment and the {ENDPOINT_CRD} CRD in Kubernetes"
        )
        return plan

    def _offline_addon(
        self,
        spec: AddonSpec,
        target: Target,
        roles: dict[str, RoleState],
        installed: dict[str, Any] | None,
    ) -> Action:
        what = f"eks addon/{spec.name}"
        settings = self.desired_addon(spec, target, roles)
        if installed is not None:
            version = installed.get("version") or "?"
            return Action(
                what,
                Verb.NONE,
                f"{version} installed (its settings are compared when planning "
                "against the cluster)",
            )
        policy = self.version_policy(spec)
        version = {
            "default": f"EKS's default for Kubernetes {target.kubernetes_version}",
            "latest": "the latest version",
        }.get(policy, policy)
        return Action(
            what,
            Verb.CREATE,
            f"create {version} (at least {spec.minimum})",
            None,
            {"addonVersion": version, **settings},
        )
