"""What the runbook suites (resilience, idempotency) need to know about each registered stage.

Every stage in ``hpkv.stages.STAGES`` that ``hpkv up`` runs by default needs a
:class:`StageHarness` in :data:`STAGE_HARNESSES`; the suites are parametrized over the registry and
fail for a stage that has none (optional stages, the benchmark, are measurements with no state to
converge and are tested on their own). A harness says how to make ``hpkv up`` succeed for the
stage on the test cluster (which controllers the test plays), what the stage's end state is, which
API calls to inject faults into, and which data-loss invariants must hold after an interrupted run
is resumed.

The world every runbook test starts from (:class:`RunbookWorld`, fixture ``runbook_world``): the
HyperPod cluster ``demo`` with two one-GPU nodes and nothing installed, and the controllers the
stages need played: HyperPod (the ai-toolkit DaemonSet after UpdateCluster), the EKS add-ons (what
each installs in Kubernetes), the user's endpoint ``team-a/llama-a`` applied once the operator's
CRD exists and its worker Deployment run by a ReplicaSet/scheduler/kubelet player (pods created
through the API, so the L2 admission policy really runs), Curvine's StatefulSets/DaemonSets and
CSI provisioner, the Curvine master's web API and the pods' exec seam.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.harness.scenario import Scenario

# Counts printed at the end of the test session (tests/conftest.py pytest_terminal_summary).
COUNTS: Counter[str] = Counter()

ENDPOINT_NAMESPACE = "team-a"
ENDPOINT = "llama-a"
OPERATOR_ADDON = "amazon-sagemaker-hyperpod-inference"
OPERATOR_NAMESPACE = "hyperpod-inference-system"
OPERATOR_DEPLOYMENT = "hyperpod-inference-controller-manager"
CURVINE_NAMESPACE = "curvine"
L2_PVC = "curvine-pvc"
REMOTE_URL_ENV = "LMCACHE_REMOTE_URL"
HELM_RELEASE_TYPE = "helm.sh/release.v1"


@dataclass
class RunbookWorld:
    """The scenario plus what the stages need beyond it; players run while the world is up."""

    scenario: Scenario
    shared_dir: Path
    chart_repo: Any  # tests.harness.curvine.ChartRepo
    storage: Path  # stands in for the Curvine PVC behind the pods' exec seam
    players: list[Any] = field(default_factory=list)
    servers: list[Any] = field(default_factory=list)

    @property
    def kube(self) -> Any:
        return self.scenario.kube

    @property
    def aws(self) -> Any:
        return self.scenario.aws

    def start(self, monkeypatch: Any) -> RunbookWorld:
        from hpkv.kube.incluster import ROUTES_ENV
        from tests.harness.curvine import MasterStub
        from tests.harness.workloads import FakePods

        stub = MasterStub()
        stub.set_cluster(live=2)
        pods = FakePods(self.storage).__enter__()
        self.servers = [stub, pods]
        monkeypatch.setenv("HPKV_HELM", self.chart_repo.helm)
        monkeypatch.setenv("HPKV_CURVINE__CHART_REPO", self.chart_repo.url)
        monkeypatch.setenv("HPKV_TIMEOUT", "60s")
        monkeypatch.setenv(
            ROUTES_ENV, json.dumps({"curvine/services/curvine-master:9000": stub.url})
        )
        monkeypatch.setenv("HPKV_POD_ROUTES", pods.routes(ENDPOINT_NAMESPACE))
        self._start_players()
        return self

    def _start_players(self) -> None:
        from tests.harness.curvine import CurvinePlayer
        from tests.harness.workloads import DeploymentPlayer

        nodes = self.scenario.node_names  # the same list: nodes added later are used too
        self.players = [
            CurvinePlayer(self.kube, nodes).__enter__(),
            DeploymentPlayer(self.kube, [(ENDPOINT_NAMESPACE, ENDPOINT)], nodes).__enter__(),
        ]

    def _stop_players(self) -> None:
        for player in self.players:
            player.__exit__(None, None, None)
        self.players = []

    def stop(self) -> None:
        self._stop_players()
        stub, pods = self.servers
        stub.stop()
        pods.__exit__(None, None, None)

    def reset(self) -> None:
        """Back to an empty AWS emulator and apiserver (between iterations inside one test); the
        players stop meanwhile so they do not race the deletions."""
        self._stop_players()
        self.aws.reset()
        self.kube.reset()
        self.scenario.node_names.clear()
        self._start_players()


def no_invariants(world: RunbookWorld, reference: dict[str, Any], resumed: dict[str, Any]) -> None:
    """Stages whose resources hold no user data have no invariant beyond equal end states."""
    return None


@dataclass(frozen=True)
class StageHarness:
    name: str
    # Plays what the stage needs from AWS/Kubernetes controllers on the fresh test cluster.
    prepare: Callable[[RunbookWorld], None]
    # The stage's end state, compared between an uninterrupted run and an interrupted + resumed
    # one (the Kubernetes inventory is compared for every stage in addition).
    snapshot: Callable[[RunbookWorld], dict[str, Any]]
    # "service:Action" calls the stage makes during 'up' (a test checks the list is complete).
    aws_actions: tuple[str, ...]
    # (method, path regex) of the stage's Kubernetes requests during 'up'.
    kube_requests: tuple[tuple[str, str], ...]
    # Data-loss checks: raise AssertionError when a resumed run lost or rewrote data.
    invariants: Callable[[RunbookWorld, dict[str, Any], dict[str, Any]], None] = no_invariants


# --- stage 1: tiered storage ---------------------------------------------------------------------
def _tiered_prepare(world: RunbookWorld) -> None:
    world.scenario.play_hyperpod_tiered_storage()


def _tiered_snapshot(world: RunbookWorld) -> dict[str, Any]:
    scenario = world.scenario
    cluster = scenario.sagemaker.clusters[scenario.cluster_name]
    accepted = [r for r in cluster.update_requests if "TieredStorageConfig" in r]
    return {
        "tieredStorage": cluster.tiered_storage,
        "nodeRecovery": cluster.node_recovery,
        "status": cluster.status,
        # each accepted UpdateCluster changed the cluster once: a duplicate would show here
        "updates": [{k: v for k, v in r.items() if k != "ClusterName"} for r in accepted],
    }


def _tiered_invariants(
    world: RunbookWorld, reference: dict[str, Any], resumed: dict[str, Any]
) -> None:
    # NodeRecovery is never changed, InstanceGroups never sent (they hold the nodes)
    assert resumed["nodeRecovery"] == reference["nodeRecovery"]
    assert all("InstanceGroups" not in u for u in resumed["updates"]), resumed["updates"]


TIERED_STORAGE = StageHarness(
    name="tiered-storage",
    prepare=_tiered_prepare,
    snapshot=_tiered_snapshot,
    aws_actions=("sagemaker:DescribeCluster", "sagemaker:UpdateCluster", "eks:DescribeCluster"),
    kube_requests=(
        ("GET", r"^/api/v1/?$"),
        ("GET", r"^/api/v1/nodes$"),
        ("GET", r"/daemonsets/ai-toolkit$"),
        ("GET", r"/namespaces/aws-hyperpod/pods$"),
    ),
    invariants=_tiered_invariants,
)


# --- stage 2: the inference operator -------------------------------------------------------------
TLS_BUCKET = "hyperpod-tls-demo-123456789012"


def _operator_prepare(world: RunbookWorld) -> None:
    from tests.harness.inference import AddonPlayer, create_alb_policy

    create_alb_policy(world.aws)
    eks = world.aws.extensions["eks"]
    AddonPlayer(world.kube, world.shared_dir, eks)

    def deploy_endpoint(addon: Any) -> None:
        # The user's endpoint (applied by GitOps, say) is reconciled once the operator runs: the
        # InferenceEndpointConfig and the worker Deployment the operator renders for it.
        if addon.name != OPERATOR_ADDON:
            return
        from tests.harness.workloads import create_endpoint, operator_deployment

        create_endpoint(world.kube, world.shared_dir, ENDPOINT_NAMESPACE, ENDPOINT)
        world.kube.apply_object(operator_deployment(ENDPOINT_NAMESPACE, ENDPOINT, replicas=2))

    eks.on_active.append(deploy_endpoint)


def _operator_snapshot(world: RunbookWorld) -> dict[str, Any]:
    iam = world.aws.client("iam")
    eks = world.aws.extensions["eks"]
    roles = {}
    for role in iam.list_roles()["Roles"]:
        name = role["RoleName"]
        roles[name] = {
            "attached": sorted(
                p["PolicyArn"]
                for p in iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"]
            ),
            "inline": sorted(iam.list_role_policies(RoleName=name)["PolicyNames"]),
        }
    operator = world.kube.get_object(
        "apps/v1", "Deployment", OPERATOR_DEPLOYMENT, OPERATOR_NAMESPACE
    )
    return {
        "addons": {
            name: {
                "version": addon.version,
                "status": addon.status,
                "role": addon.service_account_role_arn,
                "configuration": addon.configuration_values,
            }
            for (_cluster, name), addon in sorted(eks.addons.items())
        },
        # every accepted CreateAddon/UpdateAddon: a repeated one would show here
        "addonRequests": [op for op, _params in eks.addon_requests],
        "roles": roles,
        "oidcProviders": sorted(
            p["Arn"] for p in iam.list_open_id_connect_providers()["OpenIDConnectProviderList"]
        ),
        "buckets": sorted(b["Name"] for b in world.aws.client("s3").list_buckets()["Buckets"]),
        "operatorReplicas": (operator or {}).get("spec", {}).get("replicas"),
    }


def _operator_invariants(
    world: RunbookWorld, reference: dict[str, Any], resumed: dict[str, Any]
) -> None:
    # the operator's replica count is what the operator set (hpkv pauses it only in --mode patch,
    # and must always restore it)
    assert resumed["operatorReplicas"] == reference["operatorReplicas"] == 1
    assert resumed["addonRequests"].count("CreateAddon") == len(resumed["addons"])


OPERATOR = StageHarness(
    name="operator",
    prepare=_operator_prepare,
    snapshot=_operator_snapshot,
    aws_actions=(
        "iam:GetOpenIDConnectProvider",
        "iam:CreateOpenIDConnectProvider",
        # S3 is rest-xml: the emulator logs "METHOD /path" (HeadBucket; CreateBucket and
        # PutBucketTagging)
        f"s3:HEAD /{TLS_BUCKET}",
        f"s3:PUT /{TLS_BUCKET}",
        "iam:GetRole",
        "iam:GetPolicy",
        "iam:CreateRole",
        # the IRSA code is shared with stage 3: its calls are faulted once, here
        "iam:ListAttachedRolePolicies",
        "iam:AttachRolePolicy",
        "iam:PutRolePolicy",
        "eks:DescribeAddon",
        "eks:DescribeAddonVersions",
        "eks:CreateAddon",
    ),
    kube_requests=(
        ("GET", r"^/apis/storage\.k8s\.io/v1/csidrivers/"),
        ("GET", r"^/apis/apiextensions\.k8s\.io/v1/customresourcedefinitions/"),
        ("GET", rf"^/apis/apps/v1/namespaces/{OPERATOR_NAMESPACE}/deployments/"),
    ),
    invariants=_operator_invariants,
)


# --- stage 3: Curvine ----------------------------------------------------------------------------
def _curvine_prepare(world: RunbookWorld) -> None:
    from tests.harness.curvine import seed_aws_managed_policy

    seed_aws_managed_policy(world.aws, "AmazonEBSCSIDriverPolicy")


def helm_revisions(world: RunbookWorld) -> dict[str, list[int]]:
    """Release -> revisions, from the release records Helm keeps in Secrets."""
    status, body = world.kube.raw("GET", "/api/v1/secrets?labelSelector=owner%3Dhelm")
    assert status == 200, body
    found: dict[str, list[int]] = {}
    for secret in json.loads(body)["items"]:
        labels = secret["metadata"].get("labels") or {}
        key = f"{secret['metadata']['namespace']}/{labels.get('name')}"
        found.setdefault(key, []).append(int(labels.get("version", 0)))
    return {k: sorted(v) for k, v in sorted(found.items())}


def _pvcs(world: RunbookWorld) -> dict[str, str]:
    """namespace/name -> UID of every PVC (a recreated claim has a new UID)."""
    status, body = world.kube.raw("GET", "/api/v1/persistentvolumeclaims")
    assert status == 200, body
    return {
        f"{p['metadata']['namespace']}/{p['metadata']['name']}": p["metadata"]["uid"]
        for p in json.loads(body)["items"]
    }


def _format_flags(world: RunbookWorld) -> dict[int, bool]:
    """Curvine release revision -> whether it sent any cluster.format* value (which wipes data)."""
    import base64
    import gzip

    status, body = world.kube.raw(
        "GET",
        f"/api/v1/namespaces/{CURVINE_NAMESPACE}/secrets?labelSelector=owner%3Dhelm,name%3Dcurvine",
    )
    assert status == 200, body
    flags = {}
    for secret in json.loads(body)["items"]:
        data = base64.b64decode(base64.b64decode(secret["data"]["release"]))
        release = json.loads(gzip.decompress(data))
        cluster = (release.get("config") or {}).get("cluster") or {}
        flags[int(release["version"])] = any(
            cluster.get(k) for k in ("formatMaster", "formatWorker", "formatJournal")
        )
    return dict(sorted(flags.items()))


def _curvine_snapshot(world: RunbookWorld) -> dict[str, Any]:
    eks = world.aws.extensions["eks"]
    addon = eks.addons.get(("hpkv-eks", "aws-ebs-csi-driver"))
    return {
        "helm": helm_revisions(world),
        "formatFlags": _format_flags(world),
        "ebsCsiAddon": (addon.version, addon.status) if addon else None,
        "pvcs": sorted(_pvcs(world)),
    }


def _curvine_invariants(
    world: RunbookWorld, reference: dict[str, Any], resumed: dict[str, Any]
) -> None:
    # Curvine is never reformatted: no revision sent a format flag (chart 0.4.1 needs none)
    assert not any(resumed["formatFlags"].values()), resumed["formatFlags"]
    # each release was installed once, never upgraded again by a resumed run
    assert resumed["helm"] == reference["helm"]


CURVINE = StageHarness(
    name="curvine",
    prepare=_curvine_prepare,
    snapshot=_curvine_snapshot,
    aws_actions=(
        "eks:DescribeAddon",
        "eks:DescribeAddonVersions",
        "eks:CreateAddon",
        "iam:GetOpenIDConnectProvider",
        "iam:GetRole",
        "iam:GetPolicy",
        "iam:CreateRole",
        "iam:AttachRolePolicy",
        "iam:PutRolePolicy",
    ),
    kube_requests=(
        ("GET", r"^/api/v1/nodes$"),
        ("GET", r"^/apis/storage\.k8s\.io/v1/storageclasses$"),
        ("PATCH", r"^/apis/storage\.k8s\.io/v1/storageclasses/"),
        ("GET", rf"^/api/v1/namespaces/{CURVINE_NAMESPACE}/persistentvolumeclaims$"),
        ("GET", rf"^/api/v1/namespaces/{CURVINE_NAMESPACE}/pods$"),
        ("PATCH", rf"^/api/v1/namespaces/{ENDPOINT_NAMESPACE}/persistentvolumeclaims/"),
    ),
    invariants=_curvine_invariants,
)


# --- stage 4: L2 wiring --------------------------------------------------------------------------
def _endpoint_pods(world: RunbookWorld) -> list[dict[str, Any]]:
    from tests.harness.workloads import list_pods

    return [
        p
        for p in list_pods(world.kube, ENDPOINT_NAMESPACE, ENDPOINT)
        if not p["metadata"].get("deletionTimestamp")
    ]


def _remote_urls(pod: dict[str, Any]) -> list[str]:
    container = next(c for c in pod["spec"]["containers"] if c["name"] == ENDPOINT)
    return [e.get("value", "") for e in container.get("env") or [] if e["name"] == REMOTE_URL_ENV]


def _l2_snapshot(world: RunbookWorld) -> dict[str, Any]:
    deployment = world.kube.get_object("apps/v1", "Deployment", ENDPOINT, ENDPOINT_NAMESPACE)
    pods = _endpoint_pods(world)
    return {
        "remoteUrls": sorted(tuple(_remote_urls(p)) for p in pods),
        "wired": sorted(
            (p["metadata"].get("annotations") or {}).get("hpkv.io/l2-wiring", "") for p in pods
        ),
        "deploymentReplicas": (deployment or {}).get("spec", {}).get("replicas"),
        "template": json.dumps((deployment or {}).get("spec", {}).get("template"), sort_keys=True),
    }


def _l2_invariants(world: RunbookWorld, reference: dict[str, Any], resumed: dict[str, Any]) -> None:
    # exactly one LMCACHE_REMOTE_URL per vLLM pod, the Curvine one
    assert resumed["remoteUrls"], "no endpoint pods"
    assert all(len(urls) == 1 and urls[0].startswith("fs://") for urls in resumed["remoteUrls"])
    # the model's replica count and the operator-rendered template are untouched (policy mode)
    assert resumed["deploymentReplicas"] == reference["deploymentReplicas"] == 2
    assert resumed["template"] == reference["template"]
    assert (
        world.kube.get_object(
            "v1", "ConfigMap", f"hpkv-l2-patch-state-{ENDPOINT}", ENDPOINT_NAMESPACE
        )
        is None
    )


L2 = StageHarness(
    name="l2",
    prepare=lambda world: None,  # the endpoint arrives with the operator (stage 2's prepare)
    snapshot=_l2_snapshot,
    aws_actions=(),
    kube_requests=(
        ("GET", rf"^/api/v1/namespaces/{ENDPOINT_NAMESPACE}/persistentvolumeclaims/"),
        ("PATCH", r"^/apis/admissionregistration\.k8s\.io/v1/mutatingadmissionpolicies/"),
        ("PATCH", r"^/apis/admissionregistration\.k8s\.io/v1/mutatingadmissionpolicybindings/"),
        ("GET", rf"^/api/v1/namespaces/{ENDPOINT_NAMESPACE}/pods$"),
        ("POST", r"/pods/[^/]+/eviction$"),
    ),
    invariants=_l2_invariants,
)

STAGE_HARNESSES: dict[str, StageHarness] = {
    h.name: h for h in (TIERED_STORAGE, OPERATOR, CURVINE, L2)
}


def delete_endpoint(world: RunbookWorld) -> None:
    """The user deletes the endpoint; the operator and the garbage collector delete its
    Deployment and pods."""
    kube = world.kube
    kube.delete_object(
        {
            "apiVersion": "inference.sagemaker.aws.amazon.com/v1",
            "kind": "InferenceEndpointConfig",
            "metadata": {"name": ENDPOINT, "namespace": ENDPOINT_NAMESPACE},
        }
    )
    kube.delete_object(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": ENDPOINT, "namespace": ENDPOINT_NAMESPACE},
        }
    )
    kube.raw(
        "DELETE",
        f"/api/v1/namespaces/{ENDPOINT_NAMESPACE}/pods?labelSelector=app%3D{ENDPOINT}"
        "&gracePeriodSeconds=0",
    )


def runbook_stages() -> list[str]:
    """The stages 'hpkv up' runs by default (optional ones, the benchmark, are measurements)."""
    from hpkv.stages import stage_class, stage_names

    return [name for name in stage_names() if not stage_class(name).optional]


def harness_for(stage: str) -> StageHarness:
    import pytest

    harness = STAGE_HARNESSES.get(stage)
    if harness is None:
        pytest.fail(
            f"stage '{stage}' is registered in hpkv.stages.STAGES but has no StageHarness: add one "
            "to STAGE_HARNESSES in tests/harness/runbook.py (prepare, snapshot, fault targets, "
            "invariants) so the resilience suite covers it"
        )
    return harness


# --- the cluster every runbook test starts from --------------------------------------------------
def fresh_cluster(world: RunbookWorld, *, nodes: int = 2) -> None:
    """HyperPod cluster 'demo' with GPU nodes and nothing installed; controllers played for every
    registered stage."""
    scenario = world.scenario
    scenario.hyperpod(node_recovery="Automatic")
    scenario.nodes(nodes)
    for name in runbook_stages():
        if name in STAGE_HARNESSES:
            STAGE_HARNESSES[name].prepare(world)


def end_state(world: RunbookWorld) -> dict[str, Any]:
    """Every stage's snapshot plus the Kubernetes inventory (objects beyond the baseline)."""
    state: dict[str, Any] = {
        name: STAGE_HARNESSES[name].snapshot(world)
        for name in runbook_stages()
        if name in STAGE_HARNESSES
    }
    state["kubernetes"] = kubernetes_inventory(world)
    return state


def state_differences(state: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """What differs between two end states, readable in an assertion message: for list values
    the extra and missing items, else both values."""

    def items(value: Any) -> set[str]:
        return set(map(str, value or []))

    return {
        key: {
            "extra": sorted(items(state.get(key)) - items(reference.get(key))),
            "missing": sorted(items(reference.get(key)) - items(state.get(key))),
        }
        if isinstance(state.get(key), list)
        else {"now": state.get(key), "reference": reference.get(key)}
        for key in sorted(set(state) | set(reference))
        if state.get(key) != reference.get(key)
    }


def kubernetes_inventory(world: RunbookWorld) -> list[tuple[str, str, str, str]]:
    """Objects beyond the baseline as a sorted list (a duplicate shows twice). Names the API
    server or a played controller generates are replaced by what identifies the object: pods
    made from a generateName by their app, PersistentVolumes by their claim."""
    found = []
    for res, obj in world.kube.inventory_objects():
        meta = obj["metadata"]
        name = meta["name"]
        if meta.get("generateName"):
            name = f"{(meta.get('labels') or {}).get('app', meta['generateName'])}-<generated>"
        elif res["name"] == "persistentvolumes":
            claim = obj["spec"].get("claimRef") or {}
            name = f"<volume of {claim.get('namespace')}/{claim.get('name')}>"
        elif res["name"] == "ipaddresses":  # a Service's ClusterIP, allocated at random
            parent = obj["spec"].get("parentRef") or {}
            name = (
                f"<ip of {parent.get('resource')} {parent.get('namespace')}/{parent.get('name')}>"
            )
        found.append((res["groupVersion"], res["name"], meta.get("namespace", ""), name))
    return sorted(found)


def reset(world: RunbookWorld) -> None:
    """Back to an empty AWS emulator and apiserver (between iterations inside one test)."""
    world.reset()


_HEADER = re.compile(r"^\[(\d+)/(\d+)\] ([a-z0-9-]+): ")


def stage_of_lines(lines: list[str], first: str) -> list[str]:
    """The stage each progress line belongs to (lines without a header: the previous stage's)."""
    owners, current = [], first
    for line in lines:
        match = _HEADER.match(line)
        if match:
            current = match.group(3)
        owners.append(current)
    return owners


def summary_lines(counts: Counter[str]) -> list[str]:
    """The lines the test session prints at its end (only for the suites that ran)."""
    lines = []
    faults = counts["faults.aws"] + counts["faults.kube"]
    if faults or counts["faults.kill"]:
        lines.append(
            f"resilience: {faults} faults injected (AWS {counts['faults.aws']}, Kubernetes "
            f"{counts['faults.kube']}), {counts['faults.kill']} processes killed at step "
            f"boundaries; {counts['resume.writes']} writes made by {counts['resume.runs']} re-runs"
        )
    if counts["inputs"]:
        lines.append(f"bad input: {counts['inputs']} malformed inputs tried")
    if counts["idempotency.runs"]:
        lines.append(
            f"idempotency: {counts['idempotency.writes']} mutating calls on second runs of "
            f"'hpkv up'/'hpkv down' ({counts['idempotency.runs']} audited)"
        )
    return lines
