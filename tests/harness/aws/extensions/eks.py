"""EKS: clusters are moto's; this extension seeds them so their endpoint and CA point at the test
kube-apiserver, and is where the add-on actions (CreateAddon, DescribeAddon, UpdateAddon,
DeleteAddon, ListAddons, DescribeAddonVersions, DescribeUpdate) are emulated.
"""

from __future__ import annotations

from typing import Any

from tests.harness.aws.server import Extension


class EksExtension(Extension):
    service = "eks"

    def seed_cluster(
        self,
        name: str = "hpkv-eks",
        *,
        endpoint: str | None = None,
        ca_data: str | None = None,
        version: str = "1.33",
        oidc_issuer: str | None = None,
    ) -> Any:
        import moto.backends

        backend = moto.backends.get_backend("eks")[self.emulator.account_id][self.emulator.region]
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

    # --- add-ons (minimal: CreateAddon, DescribeAddon, UpdateAddon, DescribeUpdate) -------------
    # A new add-on is CREATING and an updated one UPDATING for ``addon_settle_describes``
    # DescribeAddon calls, then ACTIVE (or ``addon_final_status``). Duplicates and updates while
    # busy fail with ResourceInUseException, as EKS does.
    ADDON_VERSIONS: tuple[str, ...] = ("v1.48.0-eksbuild.1", "v1.47.0-eksbuild.2")
    addon_settle_describes = 1
    addon_final_status = "ACTIVE"

    @property
    def addons(self) -> dict[tuple[str, str], dict[str, Any]]:
        if not hasattr(self, "_addons"):
            self._addons: dict[tuple[str, str], dict[str, Any]] = {}
            self._addon_pending: dict[tuple[str, str], int] = {}
            self._addon_updates: dict[str, dict[str, Any]] = {}
            self.addon_requests: list[tuple[str, dict[str, Any]]] = []
        return self._addons

    def reset(self) -> None:
        self.addons.clear()
        self._addon_pending.clear()
        self._addon_updates.clear()
        self.addon_requests.clear()
        self.addon_settle_describes = 1
        self.addon_final_status = "ACTIVE"

    def _eks_cluster(self, name: str) -> Any:
        import moto.backends

        from tests.harness.aws.protocol import AwsError

        backend = moto.backends.get_backend("eks")[self.emulator.account_id][self.emulator.region]
        if name not in backend.clusters:
            raise AwsError("ResourceNotFoundException", f"No cluster found for name: {name}.", 404)
        return backend.clusters[name]

    def _addon(self, cluster: str, name: str) -> dict[str, Any]:
        from tests.harness.aws.protocol import AwsError

        self._eks_cluster(cluster)
        addon = self.addons.get((cluster, name))
        if addon is None:
            raise AwsError(
                "ResourceNotFoundException",
                f"No addon: {name} found in cluster: {cluster}",
                404,
            )
        return addon

    def _check_addon_params(self, params: dict[str, Any]) -> None:
        import re

        from tests.harness.aws.protocol import AwsError

        role = params.get("serviceAccountRoleArn")
        if role is not None and not re.fullmatch(
            r"arn:aws[\w-]*:iam::\d{12}:role/[\w+=,.@/-]+", role
        ):
            raise AwsError(
                "InvalidParameterException", f"Role ARN {role} is not a valid IAM role ARN."
            )
        version = params.get("addonVersion")
        if version is not None and version not in self.ADDON_VERSIONS:
            raise AwsError(
                "InvalidParameterException",
                f"Addon version specified is not supported: {version}",
            )

    def seed_addon(self, cluster: str, name: str, **fields: Any) -> dict[str, Any]:
        """An add-on that already exists (ACTIVE unless ``status`` says otherwise)."""
        import datetime

        now = datetime.datetime.now(datetime.UTC)
        addon = {
            "addonName": name,
            "clusterName": cluster,
            "status": "ACTIVE",
            "addonVersion": self.ADDON_VERSIONS[0],
            "health": {"issues": []},
            "addonArn": f"arn:aws:eks:{self.emulator.region}:{self.emulator.account_id}:addon/{cluster}/{name}/0",
            "createdAt": now,
            "modifiedAt": now,
            "tags": {},
            **fields,
        }
        self.addons[(cluster, name)] = addon
        return addon

    def op_CreateAddon(self, request: Any) -> dict[str, Any]:
        from tests.harness.aws.protocol import AwsError

        params = request.params
        cluster, name = params["clusterName"], params["addonName"]
        self._eks_cluster(cluster)
        if (cluster, name) in self.addons:
            raise AwsError("ResourceInUseException", "Addon already exists.", 409)
        self._check_addon_params(params)
        self.addon_requests.append(("CreateAddon", dict(params)))
        fields = {
            k: params[k] for k in ("serviceAccountRoleArn", "configurationValues") if k in params
        }
        addon = self.seed_addon(
            cluster,
            name,
            status="CREATING",
            addonVersion=params.get("addonVersion", self.ADDON_VERSIONS[0]),
            tags=params.get("tags", {}),
            **fields,
        )
        self._addon_pending[(cluster, name)] = self.addon_settle_describes
        return {"addon": addon}

    def op_DescribeAddon(self, request: Any) -> dict[str, Any]:
        key = (request.params["clusterName"], request.params["addonName"])
        addon = self._addon(*key)
        if addon["status"] in ("CREATING", "UPDATING"):
            if self._addon_pending.get(key, 0) > 0:
                self._addon_pending[key] -= 1
            else:
                addon["status"] = self.addon_final_status
                for update in self._addon_updates.values():
                    if update["_key"] == key and update["status"] == "InProgress":
                        update["status"] = "Successful"
        return {"addon": addon}

    def op_UpdateAddon(self, request: Any) -> dict[str, Any]:
        import datetime
        import uuid

        from tests.harness.aws.protocol import AwsError

        params = request.params
        key = (params["clusterName"], params["addonName"])
        addon = self._addon(*key)
        if addon["status"] not in ("ACTIVE", "DEGRADED", "CREATE_FAILED", "UPDATE_FAILED"):
            raise AwsError(
                "ResourceInUseException",
                f"Addon {key[1]} cannot be updated as it is currently in {addon['status']} state",
                409,
            )
        self._check_addon_params(params)
        self.addon_requests.append(("UpdateAddon", dict(params)))
        changed = []
        for field_name, update_type in (
            ("addonVersion", "AddonVersion"),
            ("serviceAccountRoleArn", "ServiceAccountRoleArn"),
            ("configurationValues", "ConfigurationValues"),
        ):
            if field_name in params:
                addon[field_name] = params[field_name]
                changed.append({"type": update_type, "value": params[field_name]})
        addon["status"] = "UPDATING"
        addon["modifiedAt"] = datetime.datetime.now(datetime.UTC)
        self._addon_pending[key] = self.addon_settle_describes
        update = {
            "id": str(uuid.uuid4()),
            "status": "InProgress",
            "type": "AddonUpdate",
            "params": changed,
            "createdAt": addon["modifiedAt"],
            "errors": [],
        }
        self._addon_updates[update["id"]] = {**update, "_key": key}
        return {"update": update}

    def op_DescribeUpdate(self, request: Any) -> dict[str, Any]:
        from tests.harness.aws.protocol import AwsError

        update = self._addon_updates.get(request.params["updateId"])
        if update is None or update["_key"][0] != request.params["name"]:
            raise AwsError(
                "ResourceNotFoundException",
                f"No update found for ID: {request.params['updateId']}",
                404,
            )
        return {"update": {k: v for k, v in update.items() if k != "_key"}}
