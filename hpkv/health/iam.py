"""``hpkv diagnose --iam``: ask IAM's policy simulator whether each identity may do what hpkv needs.

The caller (``sts:GetCallerIdentity``; an assumed-role session is simulated as its role) is checked
against the actions every command needs (``COMMON_ACTIONS``), each stage's ``IAM_ACTIONS`` and
those of ``hpkv diagnose`` itself; the EBS CSI driver's role (from the ``eks.amazonaws.com/role-arn``
annotation of ``kube-system/ebs-csi-controller-sa``, or ``--ebs-csi-role``) against the HyperPod
volume actions. Each need names its resource as an ARN template filled in from DescribeCluster, so
both the simulation and the suggested policy are scoped to this cluster. Wildcard actions
(``eks:Describe*``) are simulated as every matching operation of the service.

Each stage module exports ``IAM_ACTIONS``: what its code calls (grep its boto3 calls when changing
it); ``tests/health/test_iam.py`` checks every botocore operation hpkv calls has a need.
"""

from __future__ import annotations

import fnmatch
import importlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hpkv.concurrency import fan_out
from hpkv.errors import AccessDenied, HpkvError
from hpkv.stages.base import CheckState, IamNeed

if TYPE_CHECKING:
    from hpkv.context import RunContext

CLUSTER = "{cluster_arn}"
EKS_CLUSTER = "{eks_cluster_arn}"
ROLES = "arn:{partition}:iam::{account}:role/*"
OIDC_PROVIDERS = "arn:{partition}:iam::{account}:oidc-provider/*"
ADDONS = "arn:{partition}:eks:{region}:{account}:addon/{eks_cluster}/*/*"
TLS_BUCKETS = "arn:{partition}:s3:::hyperpod-tls-*"

COMMON_ACTIONS: list[IamNeed] = [
    IamNeed("sts:GetCallerIdentity", "*", "identify the caller; EKS tokens are signed with it"),
    IamNeed("sagemaker:DescribeCluster", CLUSTER, "find the HyperPod cluster and its EKS cluster"),
    IamNeed("eks:DescribeCluster", EKS_CLUSTER, "EKS endpoint and CA for Kubernetes access"),
]

INIT_ACTIONS: list[IamNeed] = [
    IamNeed("sagemaker:ListClusters", "*", "hpkv init: find the HyperPod clusters"),
    IamNeed("sagemaker:ListClusterNodes", CLUSTER, "hpkv init: count GPU nodes and instance types"),
]

DIAGNOSE_ACTIONS: list[IamNeed] = [
    IamNeed("iam:SimulatePrincipalPolicy", "{caller_arn}", "this preflight"),
    IamNeed("iam:GetRole", ROLES, "role trust policies for the support bundle"),
    IamNeed("eks:ListAddons", EKS_CLUSTER, "add-on descriptions for the support bundle"),
    IamNeed("eks:DescribeAddon", ADDONS, "add-on descriptions for the support bundle"),
]

EBS_CSI_ROLE_ACTIONS: list[IamNeed] = [
    IamNeed(
        "sagemaker:AttachClusterNodeVolume",
        CLUSTER,
        "attach EBS volumes to HyperPod nodes (else ValidationException)",
    ),
    IamNeed("sagemaker:DetachClusterNodeVolume", CLUSTER, "detach EBS volumes from HyperPod nodes"),
    IamNeed("eks:Describe*", "*", "the EBS CSI driver describes the EKS cluster on HyperPod"),
]

EBS_CSI_SERVICE_ACCOUNT = ("kube-system", "ebs-csi-controller-sa")
IRSA_ANNOTATION = "eks.amazonaws.com/role-arn"
ALLOWED = "allowed"


def stage_actions(only: Sequence[str] | None = None) -> dict[str, list[IamNeed]]:
    """Needs per group: common, each stage (its module's ``IAM_ACTIONS``), init, diagnose."""
    from hpkv.stages import STAGES

    groups: dict[str, list[IamNeed]] = {"common": list(COMMON_ACTIONS)}
    for name, module, _cls in STAGES:
        groups[name] = list(importlib.import_module(module).IAM_ACTIONS)
    groups["init"] = list(INIT_ACTIONS)
    groups["diagnose"] = list(DIAGNOSE_ACTIONS)
    if only:
        groups = {k: v for k, v in groups.items() if k in only or k == "common"}
    return groups


@dataclass
class Facts:
    partition: str
    region: str
    account: str
    caller_arn: str = ""
    cluster_arn: str = ""
    eks_cluster_arn: str = ""
    eks_cluster: str = "*"

    def resolve(self, template: str) -> str:
        return template.format(
            partition=self.partition,
            region=self.region,
            account=self.account,
            caller_arn=self.caller_arn or f"arn:{self.partition}:iam::{self.account}:*",
            cluster_arn=self.cluster_arn
            or f"arn:{self.partition}:sagemaker:{self.region}:{self.account}:cluster/*",
            eks_cluster_arn=self.eks_cluster_arn
            or f"arn:{self.partition}:eks:{self.region}:{self.account}:cluster/*",
            eks_cluster=self.eks_cluster,
        )


@dataclass
class Missing:
    group: str
    need: IamNeed
    resource: str
    decision: str  # implicitDeny | explicitDeny
    denied: list[str]  # the concrete actions denied (several for a wildcard need)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.group,
            "action": self.need.action,
            "resource": self.resource,
            "decision": self.decision,
            "deniedActions": self.denied,
            "why": self.need.why,
        }


@dataclass
class PrincipalReport:
    role: str  # caller | ebs-csi-driver
    arn: str = ""
    simulated_arn: str = ""
    checked: int = 0
    missing: list[Missing] = field(default_factory=list)
    error: str = ""
    note: str = ""

    @property
    def state(self) -> CheckState:
        if self.error:
            return CheckState.UNKNOWN
        return CheckState.FAIL if self.missing else CheckState.OK

    def policy(self) -> dict[str, Any] | None:
        return least_privilege_policy(m for m in self.missing if m.decision == "implicitDeny")

    def to_dict(self) -> dict[str, Any]:
        return {
            "principal": self.role,
            "arn": self.arn,
            "simulatedArn": self.simulated_arn,
            "state": self.state.value,
            "checked": self.checked,
            "missing": [m.to_dict() for m in self.missing],
            "policy": self.policy(),
            "error": self.error,
            "note": self.note,
        }


@dataclass
class IamReport:
    principals: list[PrincipalReport]

    @property
    def state(self) -> CheckState:
        from hpkv.stages.base import worst_state

        return worst_state(p.state for p in self.principals)

    def to_dict(self) -> dict[str, Any]:
        from hpkv.output import STATE_LABEL

        return {
            "state": STATE_LABEL[self.state.value],
            "principals": [p.to_dict() for p in self.principals],
        }


def least_privilege_policy(missing: Any) -> dict[str, Any] | None:
    """An IAM policy document allowing exactly the missing needs, one statement per resource."""
    by_resource: dict[str, set[str]] = {}
    for item in missing:
        by_resource.setdefault(item.resource, set()).add(item.need.action)
    if not by_resource:
        return None
    statements = []
    used: dict[str, int] = {}
    for resource in sorted(by_resource):
        actions = sorted(by_resource[resource])
        services = sorted({a.split(":")[0] for a in actions})
        base = "Hpkv" + "".join(s.capitalize() for s in services)
        used[base] = used.get(base, 0) + 1
        sid = base if used[base] == 1 else f"{base}{used[base]}"
        statements.append(
            {
                "Sid": sid,
                "Effect": "Allow",
                "Action": actions if len(actions) > 1 else actions[0],
                "Resource": resource,
            }
        )
    return {"Version": "2012-10-17", "Statement": statements}


# --- running the preflight -------------------------------------------------------------------------
def preflight(
    ctx: RunContext, *, only: Sequence[str] | None = None, ebs_csi_role: str | None = None
) -> IamReport:
    identity = ctx.aws.caller_identity()
    arn = str(identity["Arn"])
    partition, account = arn.split(":")[1], str(identity["Account"])
    facts = Facts(partition, ctx.aws.region, account, caller_arn=arn)
    _cluster_facts(ctx, facts)
    caller_groups = stage_actions(only)
    ebs_role, ebs_note = _ebs_csi_role(ctx, ebs_csi_role)
    jobs = [lambda: _principal(ctx, "caller", arn, caller_groups, facts)]
    if ebs_role:
        jobs.append(
            lambda: _principal(
                ctx, "ebs-csi-driver", ebs_role, {"ebs-csi-driver": EBS_CSI_ROLE_ACTIONS}, facts
            )
        )
    principals = fan_out(jobs)
    if not ebs_role:
        principals.append(PrincipalReport("ebs-csi-driver", note=ebs_note))
    else:
        principals[1].note = ebs_note
    return IamReport(principals)


def _cluster_facts(ctx: RunContext, facts: Facts) -> None:
    """Fill in the cluster ARNs when DescribeCluster is allowed (else wildcard ARNs are used)."""
    from hpkv import reads
    from hpkv.aws import sagemaker

    try:
        cluster = reads.hyperpod_cluster(ctx)
    except HpkvError:
        return
    facts.cluster_arn = str(cluster.get("ClusterArn") or "")
    eks_arn = sagemaker.eks_cluster_arn(cluster)
    if eks_arn:
        facts.eks_cluster_arn = eks_arn
        facts.eks_cluster = eks_arn.rsplit("/", 1)[-1]


def _ebs_csi_role(ctx: RunContext, explicit: str | None) -> tuple[str | None, str]:
    if explicit:
        return explicit, "from --ebs-csi-role"
    from hpkv.kube import is_status, kube_errors

    namespace, name = EBS_CSI_SERVICE_ACCOUNT
    where = f"ServiceAccount {namespace}/{name}"
    try:
        with kube_errors(f"read {where}"):
            try:
                account = ctx.kube.core.read_namespaced_service_account(name, namespace)
            except Exception as exc:
                if is_status(exc, 404):
                    return None, (
                        f"not checked: no {where} (the EBS CSI driver is not installed); pass "
                        "--ebs-csi-role ARN to check a role anyway"
                    )
                raise
    except HpkvError as exc:
        return None, f"not checked: {exc.one_line()}"
    role = (account.metadata.annotations or {}).get(IRSA_ANNOTATION)
    if not role:
        return None, (
            f"not checked: {where} has no {IRSA_ANNOTATION} annotation (IRSA is not set up for "
            "the driver); pass --ebs-csi-role ARN to check a role anyway"
        )
    return role, f"from the {IRSA_ANNOTATION} annotation of {where}"


def simulation_arn(ctx: RunContext, arn: str) -> str | None:
    """The ARN the simulator accepts for an identity ARN (None: cannot be simulated)."""
    parts = arn.split(":", 5)
    if len(parts) < 6:
        return None
    resource = parts[5]
    if resource.startswith(("user/", "role/", "group/")):
        return arn
    if resource.startswith("assumed-role/"):
        role_name = resource.split("/")[1]
        try:
            from hpkv.aws import translate_errors

            with translate_errors(f"iam:GetRole on {role_name}"):
                return str(ctx.aws.iam.get_role(RoleName=role_name)["Role"]["Arn"])
        except HpkvError:
            # Without GetRole, assume the role has no path (most roles).
            return f"arn:{parts[1]}:iam::{parts[4]}:role/{role_name}"
    return None


def _principal(
    ctx: RunContext, role: str, arn: str, groups: dict[str, list[IamNeed]], facts: Facts
) -> PrincipalReport:
    report = PrincipalReport(role, arn=arn)
    if arn.endswith(":root"):
        report.note = "the account's root user is allowed every action; nothing to simulate"
        return report
    simulated = simulation_arn(ctx, arn)
    if simulated is None:
        report.error = f"the policy simulator cannot evaluate {arn} (only users and roles)"
        return report
    report.simulated_arn = simulated
    wanted: dict[str, set[str]] = {}
    for needs in groups.values():
        for need in needs:
            wanted.setdefault(facts.resolve(need.resource), set()).update(expand(need.action))
    try:
        decisions = simulate(ctx, simulated, wanted)
    except AccessDenied as exc:
        report.error = (
            f"{exc.message}. Fix: allow iam:SimulatePrincipalPolicy on {simulated} to run this "
            "preflight"
        )
        return report
    except HpkvError as exc:
        report.error = exc.one_line()
        return report
    report.checked = len(decisions)
    for group, needs in groups.items():
        for need in needs:
            resource = facts.resolve(need.resource)
            denied = {a: decisions[(a, resource)] for a in expand(need.action)}
            denied = {a: d for a, d in denied.items() if d != ALLOWED}
            if denied:
                decision = "explicitDeny" if "explicitDeny" in denied.values() else "implicitDeny"
                report.missing.append(Missing(group, need, resource, decision, sorted(denied)))
    return report


def expand(action: str) -> list[str]:
    """Concrete actions for an action that may end in a wildcard (from botocore's models)."""
    if "*" not in action and "?" not in action:
        return [action]
    import botocore.session

    service, pattern = action.split(":", 1)
    model = botocore.session.get_session().get_service_model(service)
    return [f"{service}:{op}" for op in model.operation_names if fnmatch.fnmatchcase(op, pattern)]


def simulate(
    ctx: RunContext, principal_arn: str, wanted: dict[str, set[str]]
) -> dict[tuple[str, str], str]:
    """{(action, resource): decision} from SimulatePrincipalPolicy, one call per resource."""
    from hpkv.aws import translate_errors

    def run(resource: str, actions: list[str]) -> dict[tuple[str, str], str]:
        found: dict[tuple[str, str], str] = {}
        paginator = ctx.aws.iam.get_paginator("simulate_principal_policy")
        for start in range(0, len(actions), 100):
            kwargs: dict[str, Any] = {
                "PolicySourceArn": principal_arn,
                "ActionNames": actions[start : start + 100],
            }
            if resource != "*":
                kwargs["ResourceArns"] = [resource]
            with translate_errors(f"iam:SimulatePrincipalPolicy for {principal_arn}"):
                for page in paginator.paginate(**kwargs):
                    for result in page.get("EvaluationResults", []):
                        found[(result["EvalActionName"], resource)] = result["EvalDecision"]
        return found

    ordered = [(resource, sorted(actions)) for resource, actions in sorted(wanted.items())]
    jobs = [lambda r=r, a=a: run(r, a) for r, a in ordered]
    decisions: dict[tuple[str, str], str] = {}
    for part in fan_out(jobs):
        decisions.update(part)
    for resource, actions in wanted.items():
        for action in actions:
            decisions.setdefault((action, resource), "implicitDeny")
    return decisions


def policy_json(policy: dict[str, Any]) -> str:
    return json.dumps(policy, indent=2)
