"""EKS: clusters are moto's; this extension seeds them so their endpoint and CA point at the test
kube-apiserver, and emulates the add-on actions moto lacks (CreateAddon, DescribeAddon, UpdateAddon,
DeleteAddon, ListAddons, DescribeAddonVersions, DescribeUpdate) with the real API's rules:

* an add-on is ``CREATING`` after CreateAddon, ``UPDATING`` after UpdateAddon and ``DELETING`` after
  DeleteAddon; it settles after ``transition_describes`` DescribeAddon/DescribeUpdate calls, to
  ``ACTIVE`` (or gone) unless a test scripted a failure with :meth:`EksExtension.fail_next`
  (``CREATE_FAILED``/``DEGRADED``/``UPDATE_FAILED`` with health issues);
* CreateAddon on an existing add-on, and UpdateAddon/DeleteAddon while a change is in progress, fail
  with ResourceInUseException;
* unknown add-on names, versions outside the catalog or incompatible with the cluster's Kubernetes
  version, and ``configurationValues`` that are not a JSON object (or break the add-on's schema)
  fail with InvalidParameterException;
* UpdateAddon returns an update ID; DescribeUpdate reports ``InProgress`` then ``Successful`` or
  ``Failed`` (with the errors), and moves the add-on with it.

``on_active`` / ``on_deleted`` hooks run when an add-on becomes ACTIVE or is deleted; tests use them
to play what the add-on installs in Kubernetes (CSIDrivers, CRDs, the operator Deployment).
"""

from __future__ import annotations

import copy
import datetime
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.harness.aws.protocol import AwsError, ParsedRequest
from tests.harness.aws.server import Extension

KUBERNETES_VERSIONS = ("1.29", "1.30", "1.31", "1.32", "1.33", "1.34")


@dataclass(frozen=True)
class CatalogVersion:
    version: str
    kubernetes: tuple[str, ...]
    default_for: tuple[str, ...] = ()
    requires_iam: bool = False

    def describe(self) -> dict[str, Any]:
        return {
            "addonVersion": self.version,
            "architecture": ["amd64", "arm64"],
            "computeTypes": ["ec2", "hyperpod"],
            "compatibilities": [
                {
                    "clusterVersion": k8s,
                    "platformVersions": ["*"],
                    "defaultVersion": k8s in self.default_for,
                }
                for k8s in self.kubernetes
            ],
            "requiresConfiguration": False,
            "requiresIamPermissions": self.requires_iam,
        }


@dataclass(frozen=True)
class CatalogAddon:
    name: str
    type: str
    owner: str
    publisher: str
    namespace: str
    versions: tuple[CatalogVersion, ...]
    schema: dict[str, Any] | None = None

    def describe(self, kubernetes_version: str | None) -> dict[str, Any]:
        versions = [
            v
            for v in self.versions
            if kubernetes_version is None or kubernetes_version in v.kubernetes
        ]
        return {
            "addonName": self.name,
            "type": self.type,
            "owner": self.owner,
            "publisher": self.publisher,
            "defaultNamespace": self.namespace,
            "addonVersions": [v.describe() for v in reversed(versions)],
        }


def _k8s(first: str, last: str) -> tuple[str, ...]:
    versions = KUBERNETES_VERSIONS
    return versions[versions.index(first) : versions.index(last) + 1]


_INFERENCE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "executionRoleArn": {"type": "string"},
        "tlsCertificateS3Bucket": {"type": "string"},
        "hyperpodClusterArn": {"type": "string"},
        "jumpstartGatedModelDownloadRoleArn": {"type": "string"},
        "alb": {"type": "object"},
        "keda": {"type": "object"},
    },
}

# A catalog shaped like DescribeAddonVersions' answer: the versions the HyperPod inference docs
# name as minimums are present, with older ones below them and newer ones above.
CATALOG: dict[str, CatalogAddon] = {
    addon.name: addon
    for addon in (
        CatalogAddon(
            "aws-mountpoint-s3-csi-driver",
            "storage",
            "aws",
            "s3",
            "kube-system",
            (
                CatalogVersion("v1.13.0-eksbuild.1", _k8s("1.29", "1.32"), ("1.29",), True),
                CatalogVersion(
                    "v1.14.1-eksbuild.1", _k8s("1.29", "1.34"), ("1.30", "1.31", "1.32"), True
                ),
                CatalogVersion("v1.15.0-eksbuild.1", _k8s("1.31", "1.34"), ("1.33", "1.34"), True),
                CatalogVersion("v2.1.0-eksbuild.1", _k8s("1.32", "1.34"), (), True),
            ),
        ),
        CatalogAddon(
            "aws-fsx-csi-driver",
            "storage",
            "aws",
            "fsx",
            "kube-system",
            (
                CatalogVersion("v1.5.0-eksbuild.1", _k8s("1.29", "1.31"), ("1.29",), True),
                CatalogVersion(
                    "v1.6.0-eksbuild.1",
                    _k8s("1.29", "1.34"),
                    ("1.30", "1.31", "1.32", "1.33"),
                    True,
                ),
                CatalogVersion("v1.7.0-eksbuild.1", _k8s("1.32", "1.34"), ("1.34",), True),
            ),
        ),
        CatalogAddon(
            "metrics-server",
            "observability",
            "community",
            "eks",
            "kube-system",
            (
                CatalogVersion("v0.7.2-eksbuild.3", _k8s("1.29", "1.32"), ("1.29",)),
                CatalogVersion(
                    "v0.7.2-eksbuild.4",
                    _k8s("1.29", "1.34"),
                    ("1.30", "1.31", "1.32", "1.33", "1.34"),
                ),
                CatalogVersion("v0.8.0-eksbuild.2", _k8s("1.31", "1.34")),
            ),
        ),
        CatalogAddon(
            "cert-manager",
            "security",
            "community",
            "eks",
            "cert-manager",
            (
                CatalogVersion("v1.17.2-eksbuild.1", _k8s("1.29", "1.32"), ("1.29",)),
                CatalogVersion(
                    "v1.18.2-eksbuild.2",
                    _k8s("1.29", "1.34"),
                    ("1.30", "1.31", "1.32", "1.33", "1.34"),
                ),
                CatalogVersion("v1.19.1-eksbuild.1", _k8s("1.31", "1.34")),
            ),
        ),
        CatalogAddon(
            "amazon-sagemaker-hyperpod-inference",
            "machine-learning",
            "aws",
            "sagemaker",
            "hyperpod-inference-system",
            (
                CatalogVersion("v1.0.0-eksbuild.1", _k8s("1.29", "1.33"), ("1.29",), True),
                CatalogVersion("v1.2.1-eksbuild.1", _k8s("1.30", "1.34"), (), True),
                CatalogVersion(
                    "v1.3.0-eksbuild.1",
                    _k8s("1.30", "1.34"),
                    ("1.30", "1.31", "1.32", "1.33", "1.34"),
                    True,
                ),
            ),
            schema=_INFERENCE_SCHEMA,
        ),
        CatalogAddon(
            "aws-ebs-csi-driver",
            "storage",
            "aws",
            "eks",
            "kube-system",
            (
                CatalogVersion("v1.47.0-eksbuild.2", KUBERNETES_VERSIONS, (), True),
                CatalogVersion(
                    "v1.48.0-eksbuild.1", KUBERNETES_VERSIONS, KUBERNETES_VERSIONS, True
                ),
            ),
        ),
        CatalogAddon(
            "vpc-cni",
            "networking",
            "aws",
            "eks",
            "kube-system",
            (CatalogVersion("v1.19.5-eksbuild.1", KUBERNETES_VERSIONS, KUBERNETES_VERSIONS, True),),
        ),
        CatalogAddon(
            "coredns",
            "networking",
            "aws",
            "eks",
            "kube-system",
            (CatalogVersion("v1.11.4-eksbuild.14", KUBERNETES_VERSIONS, KUBERNETES_VERSIONS),),
        ),
    )
}

_BUSY = {"CREATING", "UPDATING", "DELETING"}
_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+$")


@dataclass
class Outcome:
    """How the next change of an add-on ends (scripted by a test)."""

    status: str
    issues: list[dict[str, Any]]


@dataclass
class AddonUpdate:
    id: str
    params: list[dict[str, str]]
    status: str = "InProgress"
    errors: list[dict[str, Any]] = field(default_factory=list)
    created: datetime.datetime = field(default_factory=lambda: datetime.datetime.now(datetime.UTC))

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "type": "AddonUpdate",
            "params": self.params,
            "createdAt": self.created,
            "errors": self.errors,
        }


@dataclass
class Addon:
    cluster: str
    name: str
    version: str
    arn: str
    status: str = "CREATING"
    service_account_role_arn: str | None = None
    configuration_values: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    issues: list[dict[str, Any]] = field(default_factory=list)
    created: datetime.datetime = field(default_factory=lambda: datetime.datetime.now(datetime.UTC))
    modified: datetime.datetime = field(default_factory=lambda: datetime.datetime.now(datetime.UTC))
    pending: int = 0
    next_status: str = "ACTIVE"
    next_issues: list[dict[str, Any]] = field(default_factory=list)
    update: AddonUpdate | None = None
    preserve: bool = False
    requests: list[dict[str, Any]] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "addonName": self.name,
            "clusterName": self.cluster,
            "status": self.status,
            "addonVersion": self.version,
            "health": {"issues": copy.deepcopy(self.issues)},
            "addonArn": self.arn,
            "createdAt": self.created,
            "modifiedAt": self.modified,
            "tags": dict(self.tags),
        }
        if self.service_account_role_arn:
            data["serviceAccountRoleArn"] = self.service_account_role_arn
        if self.configuration_values is not None:
            data["configurationValues"] = self.configuration_values
        return data


class EksExtension(Extension):
    service = "eks"

    def __init__(self, emulator: Any) -> None:
        super().__init__(emulator)
        self.addons: dict[tuple[str, str], Addon] = {}
        self.updates: dict[str, tuple[str, str, AddonUpdate]] = {}
        self.outcomes: dict[str, list[Outcome]] = {}
        self.transition_describes = 1
        self.on_active: list[Callable[[Addon], None]] = []
        self.on_deleted: list[Callable[[Addon], None]] = []
        # Every CreateAddon/UpdateAddon as (operation, parameters), in order.
        self.addon_requests: list[tuple[str, dict[str, Any]]] = []

    def reset(self) -> None:
        self.addon_requests.clear()
        self.addons.clear()
        self.updates.clear()
        self.outcomes.clear()
        self.transition_describes = 1
        self.on_active.clear()
        self.on_deleted.clear()

    # --- seeding and scripting (tests) -----------------------------------------------------------
    def seed_cluster(
        self,
        name: str = "hpkv-eks",
        *,
        endpoint: str | None = None,
        ca_data: str | None = None,
        version: str = "1.33",
        oidc_issuer: str | None = None,
    ) -> Any:
        backend = self._backend()
        if name in backend.clusters:
            cluster = backend.clusters[name]
        else:
            cluster = backend.create_cluster(
                name=name,
                role_arn=f"arn:aws:iam::{self.emulator.account_id}:role/eks-cluster-role",
                resources_vpc_config={"subnetIds": ["subnet-0123456789abcdef0"]},
                version=version,
            )
        if endpoint is not None:
            cluster.endpoint = endpoint
        if ca_data is not None:
            cluster.certificate_authority = {"data": ca_data}
        cluster.version = version
        if oidc_issuer is not None:
            cluster.identity = {"oidc": {"issuer": oidc_issuer}}
        return cluster

    def seed_addon(
        self,
        cluster: str,
        name: str,
        version: str,
        *,
        status: str = "ACTIVE",
        service_account_role_arn: str | None = None,
        configuration_values: str | None = None,
        tags: dict[str, str] | None = None,
        issues: list[dict[str, Any]] | None = None,
    ) -> Addon:
        """An add-on that exists already (e.g. installed by someone else)."""
        addon = Addon(
            cluster=cluster,
            name=name,
            version=version,
            arn=self._addon_arn(cluster, name),
            status=status,
            service_account_role_arn=service_account_role_arn,
            configuration_values=configuration_values,
            tags=dict(tags or {}),
            issues=list(issues or []),
            next_status=status,
        )
        self.addons[(cluster, name)] = addon
        return addon

    def fail_next(self, addon: str, status: str, issues: list[dict[str, Any]]) -> None:
        """The next create/update of ``addon`` ends in ``status`` with these health issues."""
        self.outcomes.setdefault(addon, []).append(Outcome(status, issues))

    # --- helpers ---------------------------------------------------------------------------------
    def _backend(self) -> Any:
        import moto.backends

        return moto.backends.get_backend("eks")[self.emulator.account_id][self.emulator.region]

    def _cluster(self, name: str) -> Any:
        cluster = self._backend().clusters.get(name)
        if cluster is None:
            raise AwsError("ResourceNotFoundException", f"No cluster found for name: {name}.", 404)
        return cluster

    def _addon_arn(self, cluster: str, name: str) -> str:
        region, account = self.emulator.region, self.emulator.account_id
        return f"arn:aws:eks:{region}:{account}:addon/{cluster}/{name}/{uuid.uuid4().hex[:36]}"

    def _get(self, cluster: str, name: str) -> Addon:
        self._cluster(cluster)
        addon = self.addons.get((cluster, name))
        if addon is None:
            raise AwsError(
                "ResourceNotFoundException",
                f"No addon: {name} found in cluster: {cluster}",
                404,
            )
        return addon

    def _outcome(self, name: str) -> Outcome | None:
        queue = self.outcomes.get(name)
        return queue.pop(0) if queue else None

    def _advance(self, addon: Addon) -> None:
        if addon.status not in _BUSY:
            return
        if addon.pending > 0:
            addon.pending -= 1
            return
        addon.modified = datetime.datetime.now(datetime.UTC)
        if addon.status == "DELETING":
            del self.addons[(addon.cluster, addon.name)]
            for hook in list(self.on_deleted):
                hook(addon)
            return
        addon.status = addon.next_status
        addon.issues = list(addon.next_issues)
        if addon.update is not None:
            failed = addon.status != "ACTIVE"
            addon.update.status = "Failed" if failed else "Successful"
            if failed:
                addon.update.errors = [
                    {
                        "errorCode": issue.get("code", "Unknown"),
                        "errorMessage": issue.get("message", ""),
                        "resourceIds": issue.get("resourceIds", []),
                    }
                    for issue in addon.next_issues
                ]
        if addon.status == "ACTIVE":
            for hook in list(self.on_active):
                hook(addon)

    def _start(self, addon: Addon, busy: str) -> None:
        outcome = self._outcome(addon.name)
        addon.status = busy
        addon.issues = []
        addon.pending = self.transition_describes
        if outcome is None:
            addon.next_status, addon.next_issues = "ACTIVE", []
        else:
            addon.next_status, addon.next_issues = outcome.status, list(outcome.issues)
        if addon.pending == 0:
            self._advance(addon)

    def _version(self, catalog: CatalogAddon, version: str | None, k8s: str) -> str:
        compatible = [v for v in catalog.versions if k8s in v.kubernetes]
        if version is None:
            defaults = [v for v in compatible if k8s in v.default_for]
            if not defaults:
                raise AwsError(
                    "InvalidParameterException",
                    f"Addon {catalog.name} has no default version for Kubernetes {k8s}",
                )
            return defaults[0].version
        if not any(v.version == version for v in catalog.versions):
            raise AwsError(
                "InvalidParameterException",
                f"Addon version specified is not supported: {catalog.name} {version}",
            )
        if not any(v.version == version for v in compatible):
            raise AwsError(
                "InvalidParameterException",
                f"Addon version {version} of {catalog.name} is not supported on Kubernetes {k8s}",
            )
        return version

    def _catalog(self, name: str, k8s: str) -> CatalogAddon:
        catalog = CATALOG.get(name)
        if catalog is None or not any(k8s in v.kubernetes for v in catalog.versions):
            raise AwsError(
                "InvalidParameterException",
                f"Addon {name} specified is not supported in {k8s} kubernetes version",
            )
        return catalog

    @staticmethod
    def _check_configuration(catalog: CatalogAddon, values: str | None) -> None:
        if values is None:
            return
        try:
            parsed = json.loads(values)
        except ValueError:
            raise AwsError(
                "InvalidParameterException",
                "ConfigurationValue provided in request is not supported: Json schema validation "
                "failed: configurationValues is not valid JSON",
            ) from None
        if not isinstance(parsed, dict):
            raise AwsError(
                "InvalidParameterException",
                "ConfigurationValue provided in request is not supported: Json schema validation "
                "failed: $: must be an object",
            )
        if catalog.schema is not None:
            import jsonschema

            errors = list(jsonschema.Draft7Validator(catalog.schema).iter_errors(parsed))
            if errors:
                raise AwsError(
                    "InvalidParameterException",
                    "ConfigurationValue provided in request is not supported: Json schema "
                    f"validation failed with error: [{errors[0].message}]",
                )

    @staticmethod
    def _check_role(arn: str | None) -> None:
        if arn is not None and not _ROLE_ARN.match(arn):
            raise AwsError(
                "InvalidParameterException",
                f"serviceAccountRoleArn {arn} is not a valid IAM role ARN",
            )

    # --- operations ------------------------------------------------------------------------------
    def op_CreateAddon(self, request: ParsedRequest) -> dict[str, Any]:
        params = request.params
        cluster_name, name = params["clusterName"], params["addonName"]
        cluster = self._cluster(cluster_name)
        if (cluster_name, name) in self.addons:
            raise AwsError("ResourceInUseException", f"Addon already exists: {name}", 409)
        catalog = self._catalog(name, cluster.version)
        version = self._version(catalog, params.get("addonVersion"), cluster.version)
        self._check_configuration(catalog, params.get("configurationValues"))
        self._check_role(params.get("serviceAccountRoleArn"))
        addon = Addon(
            cluster=cluster_name,
            name=name,
            version=version,
            arn=self._addon_arn(cluster_name, name),
            service_account_role_arn=params.get("serviceAccountRoleArn"),
            configuration_values=params.get("configurationValues"),
            tags=dict(params.get("tags") or {}),
        )
        addon.requests.append(copy.deepcopy(params))
        self.addon_requests.append(("CreateAddon", copy.deepcopy(params)))
        self.addons[(cluster_name, name)] = addon
        self._start(addon, "CREATING")
        return {"addon": addon.describe()}

    def op_DescribeAddon(self, request: ParsedRequest) -> dict[str, Any]:
        addon = self._get(request.params["clusterName"], request.params["addonName"])
        self._advance(addon)
        current = self.addons.get((addon.cluster, addon.name))
        if current is None:
            raise AwsError(
                "ResourceNotFoundException",
                f"No addon: {addon.name} found in cluster: {addon.cluster}",
                404,
            )
        return {"addon": current.describe()}

    def op_ListAddons(self, request: ParsedRequest) -> dict[str, Any]:
        cluster_name = request.params["clusterName"]
        self._cluster(cluster_name)
        names = sorted(name for (cluster, name) in self.addons if cluster == cluster_name)
        start = int(request.params.get("nextToken") or 0)
        limit = int(request.params.get("maxResults") or 100)
        page = names[start : start + limit]
        result: dict[str, Any] = {"addons": page}
        if start + limit < len(names):
            result["nextToken"] = str(start + limit)
        return result

    def op_UpdateAddon(self, request: ParsedRequest) -> dict[str, Any]:
        params = request.params
        cluster_name, name = params["clusterName"], params["addonName"]
        cluster = self._cluster(cluster_name)
        addon = self._get(cluster_name, name)
        if addon.status in _BUSY:
            raise AwsError(
                "ResourceInUseException",
                f"Addon {name} is in {addon.status} state; an update is already in progress",
                409,
            )
        catalog = self._catalog(name, cluster.version)
        update_params: list[dict[str, str]] = []
        if "addonVersion" in params:
            addon.version = self._version(catalog, params["addonVersion"], cluster.version)
            update_params.append({"type": "AddonVersion", "value": addon.version})
        if "configurationValues" in params:
            self._check_configuration(catalog, params["configurationValues"])
            addon.configuration_values = params["configurationValues"] or None
            update_params.append(
                {"type": "ConfigurationValues", "value": params["configurationValues"]}
            )
        if "serviceAccountRoleArn" in params:
            self._check_role(params["serviceAccountRoleArn"] or None)
            addon.service_account_role_arn = params["serviceAccountRoleArn"] or None
            update_params.append(
                {"type": "ServiceAccountRoleArn", "value": params["serviceAccountRoleArn"]}
            )
        if "resolveConflicts" in params:
            update_params.append({"type": "ResolveConflicts", "value": params["resolveConflicts"]})
        addon.requests.append(copy.deepcopy(params))
        self.addon_requests.append(("UpdateAddon", copy.deepcopy(params)))
        update = AddonUpdate(id=str(uuid.uuid4()), params=update_params)
        addon.update = update
        self.updates[update.id] = (cluster_name, name, update)
        self._start(addon, "UPDATING")
        return {"update": update.describe()}

    def op_DeleteAddon(self, request: ParsedRequest) -> dict[str, Any]:
        params = request.params
        addon = self._get(params["clusterName"], params["addonName"])
        if addon.status in _BUSY:
            raise AwsError(
                "ResourceInUseException",
                f"Addon {addon.name} is in {addon.status} state and cannot be deleted now",
                409,
            )
        addon.requests.append(copy.deepcopy(params))
        addon.preserve = bool(params.get("preserve"))
        addon.status = "DELETING"
        addon.pending = self.transition_describes
        if addon.pending == 0:
            self._advance(addon)
        return {"addon": addon.describe()}

    def op_DescribeUpdate(self, request: ParsedRequest) -> dict[str, Any]:
        params = request.params
        cluster_name = params["name"]
        self._cluster(cluster_name)
        entry = self.updates.get(params["updateId"])
        if (
            entry is None
            or entry[0] != cluster_name
            or entry[1] != params.get("addonName", entry[1])
        ):
            raise AwsError(
                "ResourceNotFoundException", f"No update found for ID: {params['updateId']}", 404
            )
        addon = self.addons.get((entry[0], entry[1]))
        if addon is not None and addon.update is entry[2]:
            self._advance(addon)
        return {"update": entry[2].describe()}

    def op_DescribeAddonVersions(self, request: ParsedRequest) -> dict[str, Any]:
        params = request.params
        k8s = params.get("kubernetesVersion")
        name = params.get("addonName")
        addons = [a for a in CATALOG.values() if name is None or a.name == name]
        described = [a.describe(k8s) for a in addons]
        described = [d for d in described if d["addonVersions"]]
        start = int(params.get("nextToken") or 0)
        limit = int(params.get("maxResults") or 100)
        result: dict[str, Any] = {"addons": described[start : start + limit]}
        if start + limit < len(described):
            result["nextToken"] = str(start + limit)
        return result
