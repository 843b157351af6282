"""SageMaker HyperPod clusters: CreateCluster, DescribeCluster, ListClusters, UpdateCluster,
DeleteCluster, ListClusterNodes (paginated with MaxResults/NextToken) — with the rules hpkv
depends on:

* UpdateCluster with ``TieredStorageConfig`` but neither ``NodeRecovery`` nor ``InstanceGroups``
  fails with ValidationException (the published runbook's "API note");
* UpdateCluster on a cluster that is not InService fails with ConflictException;
* an update moves the cluster to ``Updating`` for ``update_describes`` DescribeCluster calls, then
  back to ``InService``; ``on_in_service`` hooks then run (tests use them to play HyperPod, e.g.
  create the ai-toolkit DaemonSet).
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.harness.aws.protocol import AwsError, ParsedRequest
from tests.harness.aws.server import Extension


@dataclass
class HyperPodCluster:
    name: str
    arn: str
    instance_groups: list[dict[str, Any]]
    orchestrator: dict[str, Any] | None = None
    node_recovery: str | None = "Automatic"
    tiered_storage: dict[str, Any] | None = None
    status: str = "InService"
    failure_message: str = ""
    vpc_config: dict[str, Any] | None = None
    created: datetime.datetime = field(default_factory=lambda: datetime.datetime.now(datetime.UTC))
    pending_describes: int = 0
    next_status: str = "InService"
    update_requests: list[dict[str, Any]] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "ClusterArn": self.arn,
            "ClusterName": self.name,
            "ClusterStatus": self.status,
            "CreationTime": self.created,
            "InstanceGroups": [self._group(g) for g in self.instance_groups],
            "VpcConfig": self.vpc_config
            or {
                "SecurityGroupIds": ["sg-0123456789abcdef0"],
                "Subnets": ["subnet-0123456789abcdef0"],
            },
        }
        if self.failure_message:
            data["FailureMessage"] = self.failure_message
        if self.orchestrator:
            data["Orchestrator"] = self.orchestrator
        if self.node_recovery is not None:
            data["NodeRecovery"] = self.node_recovery
        if self.tiered_storage is not None:
            data["TieredStorageConfig"] = self.tiered_storage
        return data

    @staticmethod
    def _group(group: dict[str, Any]) -> dict[str, Any]:
        count = group.get("InstanceCount", 1)
        return {
            "InstanceGroupName": group["InstanceGroupName"],
            "InstanceType": group["InstanceType"],
            "CurrentCount": count,
            "TargetCount": count,
            "ExecutionRole": group.get(
                "ExecutionRole", "arn:aws:iam::123456789012:role/hyperpod-exec"
            ),
            "LifeCycleConfig": group.get(
                "LifeCycleConfig",
                {"SourceS3Uri": "s3://sagemaker-lcc/", "OnCreate": "on_create.sh"},
            ),
            "ThreadsPerCore": group.get("ThreadsPerCore", 1),
        }


class SageMakerExtension(Extension):
    service = "sagemaker"

    def __init__(self, emulator: Any) -> None:
        super().__init__(emulator)
        self.clusters: dict[str, HyperPodCluster] = {}
        self.update_describes = 1
        self.on_in_service: list[Callable[[HyperPodCluster], None]] = []
        self.page_size = 100  # List* page size without MaxResults (tests lower it)

    def reset(self) -> None:
        self.clusters.clear()
        self.update_describes = 1
        self.page_size = 100
        self.on_in_service.clear()

    # --- seeding (tests) ------------------------------------------------------------------------
    def seed_cluster(
        self,
        name: str,
        *,
        eks_cluster_name: str | None = "hpkv-eks",
        node_recovery: str | None = "Automatic",
        tiered_storage: dict[str, Any] | None = None,
        status: str = "InService",
        instance_groups: list[dict[str, Any]] | None = None,
    ) -> HyperPodCluster:
        region, account = self.emulator.region, self.emulator.account_id
        orchestrator = None
        if eks_cluster_name:
            orchestrator = {
                "Eks": {"ClusterArn": f"arn:aws:eks:{region}:{account}:cluster/{eks_cluster_name}"}
            }
        cluster = HyperPodCluster(
            name=name,
            arn=f"arn:aws:sagemaker:{region}:{account}:cluster/{name.lower()}0001",
            instance_groups=instance_groups
            or [{"InstanceGroupName": "gpu", "InstanceType": "ml.g6e.4xlarge", "InstanceCount": 2}],
            orchestrator=orchestrator,
            node_recovery=node_recovery,
            tiered_storage=copy.deepcopy(tiered_storage),
            status=status,
        )
        self.clusters[name] = cluster
        return cluster

    # --- helpers --------------------------------------------------------------------------------
    def _get(self, name: str) -> HyperPodCluster:
        key = name.rsplit("/", 1)[-1] if name.startswith("arn:") else name
        for cluster in self.clusters.values():
            if key in (cluster.name, cluster.arn) or name == cluster.arn:
                return cluster
        raise AwsError("ResourceNotFound", f"Cluster with name or ARN {name} not found.")

    def _advance(self, cluster: HyperPodCluster) -> None:
        if cluster.status == cluster.next_status:
            return
        if cluster.pending_describes > 0:
            cluster.pending_describes -= 1
            return
        cluster.status = cluster.next_status
        if cluster.status == "InService":
            for hook in list(self.on_in_service):
                hook(cluster)

    # --- operations -----------------------------------------------------------------------------
    def op_CreateCluster(self, request: ParsedRequest) -> dict[str, Any]:
        params = request.params
        name = params["ClusterName"]
        if name in self.clusters:
            raise AwsError("ResourceInUse", f"Cluster with name {name} already exists.")
        groups = [dict(g) for g in params.get("InstanceGroups", [])]
        if not groups:
            raise AwsError(
                "ValidationException", "InstanceGroups must contain at least one instance group."
            )
        cluster = HyperPodCluster(
            name=name,
            arn=f"arn:aws:sagemaker:{self.emulator.region}:{self.emulator.account_id}:cluster/{name.lower()}0001",
            instance_groups=groups,
            orchestrator=params.get("Orchestrator"),
            node_recovery=params.get("NodeRecovery", "Automatic"),
            tiered_storage=params.get("TieredStorageConfig"),
            vpc_config=params.get("VpcConfig"),
            status="Creating",
            pending_describes=1,
        )
        self.clusters[name] = cluster
        return {"ClusterArn": cluster.arn}

    def op_DescribeCluster(self, request: ParsedRequest) -> dict[str, Any]:
        cluster = self._get(request.params["ClusterName"])
        self._advance(cluster)
        return cluster.describe()

    def _page(
        self, request: ParsedRequest, key: str, items: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """One page of ``items`` (MaxResults, else ``page_size``) with a NextToken, as the API does."""
        params = request.params
        size = int(params.get("MaxResults") or self.page_size)
        token = params.get("NextToken")
        start = 0
        if token is not None:
            if not str(token).startswith("page-") or not str(token)[5:].isdigit():
                raise AwsError("ValidationException", f"Invalid NextToken: {token}")
            start = int(str(token)[5:])
        result: dict[str, Any] = {key: items[start : start + size]}
        if start + size < len(items):
            result["NextToken"] = f"page-{start + size}"
        return result

    def op_ListClusters(self, request: ParsedRequest) -> dict[str, Any]:
        summaries = [
            {
                "ClusterArn": c.arn,
                "ClusterName": c.name,
                "CreationTime": c.created,
                "ClusterStatus": c.status,
            }
            for c in self.clusters.values()
        ]
        return self._page(request, "ClusterSummaries", summaries)

    def op_ListClusterNodes(self, request: ParsedRequest) -> dict[str, Any]:
        cluster = self._get(request.params["ClusterName"])
        nodes = []
        for group in cluster.instance_groups:
            for i in range(group.get("InstanceCount", 1)):
                nodes.append(
                    {
                        "InstanceGroupName": group["InstanceGroupName"],
                        "InstanceId": f"i-{group['InstanceGroupName']}{i:012d}"[:19],
                        "InstanceStatus": {"Status": "Running", "Message": ""},
                        "InstanceType": group["InstanceType"],
                        "LaunchTime": cluster.created,
                    }
                )
        return self._page(request, "ClusterNodeSummaries", nodes)

    def op_UpdateCluster(self, request: ParsedRequest) -> dict[str, Any]:
        params = request.params
        cluster = self._get(params["ClusterName"])
        if cluster.status != "InService":
            raise AwsError(
                "ConflictException",
                f"Cluster {cluster.arn} is in {cluster.status} status. Update is allowed only in InService status.",
            )
        if "TieredStorageConfig" in params and not (
            {"NodeRecovery", "InstanceGroups"} & set(params)
        ):
            raise AwsError(
                "ValidationException",
                "At least one of InstanceGroups or NodeRecovery must be specified in the UpdateCluster request.",
            )
        cluster.update_requests.append(copy.deepcopy(params))
        if "TieredStorageConfig" in params:
            config = dict(params["TieredStorageConfig"])
            if config.get("Mode") == "Disable":
                config.pop("InstanceMemoryAllocationPercentage", None)
            cluster.tiered_storage = config
        if "NodeRecovery" in params:
            cluster.node_recovery = params["NodeRecovery"]
        if "InstanceGroups" in params:
            cluster.instance_groups = [dict(g) for g in params["InstanceGroups"]]
        cluster.status = "Updating"
        cluster.next_status = "InService"
        cluster.pending_describes = self.update_describes
        if cluster.pending_describes == 0:
            self._advance(cluster)
        return {"ClusterArn": cluster.arn}

    def op_DeleteCluster(self, request: ParsedRequest) -> dict[str, Any]:
        cluster = self._get(request.params["ClusterName"])
        del self.clusters[cluster.name]
        return {"ClusterArn": cluster.arn}
