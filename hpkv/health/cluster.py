"""The cluster-wide section of ``hpkv status`` and ``hpkv diagnose``: the EKS cluster behind the
HyperPod cluster, the Kubernetes API and the nodes, plus the generic detectors
(``hpkv.health.detectors``). It follows the stage contract but is not a stage: nothing to apply.
"""

from __future__ import annotations

from typing import Any

from hpkv import reads
from hpkv.kube import inspect
from hpkv.stages.base import Check, CheckSpec, CheckState, Detector, Stage
from hpkv.stages.tiered_storage import HYPERPOD_NODE_LABEL, HYPERPOD_NODE_VALUE


class ClusterSection(Stage):
    name = "cluster"
    title = "HyperPod cluster, EKS and Kubernetes"
    number = 0

    def status(self) -> list[Check]:
        return self.run_check_functions()

    def check_functions(self) -> list[CheckSpec]:
        return [
            CheckSpec("eks-cluster", lambda: [self._eks_check()], requires_install=False),
            CheckSpec("kubernetes-api", lambda: [self._api_check()], requires_install=False),
            CheckSpec("nodes", lambda: [self._nodes_check()], requires_install=False),
        ]

    def detectors(self) -> list[Detector]:
        from hpkv.health import detectors

        return detectors.generic_detectors(self.ctx)

    # --- checks ------------------------------------------------------------------------------
    def _eks_check(self) -> Check:
        cluster = reads.eks_cluster(self.ctx)
        if cluster is None:
            return self.check(
                "eks-cluster",
                CheckState.FAIL,
                f"HyperPod cluster '{self.ctx.settings.cluster}' has no EKS orchestrator",
                "hpkv supports HyperPod clusters orchestrated by EKS only",
            )
        name, status = cluster.get("name", "?"), cluster.get("status", "UNKNOWN")
        evidence = f"{name} is {status}, Kubernetes {cluster.get('version', '?')}"
        if status == "ACTIVE":
            return self.check("eks-cluster", CheckState.OK, evidence)
        if status in ("FAILED", "DELETING"):
            return self.check(
                "eks-cluster", CheckState.FAIL, evidence, "see the EKS console for the cause"
            )
        return self.check(
            "eks-cluster", CheckState.WARN, evidence, "wait for the EKS cluster to be ACTIVE"
        )

    def _api_check(self) -> Check:
        version = reads.server_version(self.ctx)
        return self.check(
            "kubernetes-api",
            CheckState.OK,
            f"{version['gitVersion']} reached via {self.ctx.kube.description}",
        )

    def _nodes_check(self) -> Check:
        nodes = reads.nodes(self.ctx)
        hyperpod = [n for n in nodes if _is_hyperpod(n)]
        not_ready = sorted(n.metadata.name for n in nodes if not inspect.node_ready(n))
        evidence = (
            f"{len(nodes) - len(not_ready)} of {len(nodes)} nodes Ready "
            f"({len(hyperpod)} HyperPod nodes)"
        )
        if not nodes or len(not_ready) == len(nodes):
            return self.check(
                "nodes",
                CheckState.FAIL,
                evidence,
                "check the HyperPod instance groups ('aws sagemaker list-cluster-nodes')",
            )
        if not_ready:
            shown = ", ".join(not_ready[:10]) + (" ..." if len(not_ready) > 10 else "")
            return self.check(
                "nodes",
                CheckState.WARN,
                f"{evidence}; NotReady: {shown}",
                "kubectl describe node <name> (HyperPod replaces unhealthy nodes when "
                "NodeRecovery is Automatic)",
            )
        if not hyperpod:
            return self.check(
                "nodes",
                CheckState.WARN,
                evidence,
                f"HyperPod nodes carry the label {HYPERPOD_NODE_LABEL}={HYPERPOD_NODE_VALUE}; "
                "check the "
                "kubeconfig context points at the HyperPod cluster's EKS",
            )
        return self.check("nodes", CheckState.OK, evidence)


def _is_hyperpod(node: Any) -> bool:
    return (node.metadata.labels or {}).get(HYPERPOD_NODE_LABEL) == HYPERPOD_NODE_VALUE
