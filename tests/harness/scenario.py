"""A HyperPod cluster as the tests see it: the AWS emulator and the kube harness wired together.

The HyperPod cluster's EKS orchestrator points at an EKS cluster whose endpoint and CA are the test
kube-apiserver's, so hpkv follows the same path it follows in AWS.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.harness.aws import AwsEmulator
from tests.harness.cli import CliResult, run_hpkv
from tests.harness.kube import KubeHarness
from tests.harness.play import add_nodes, play_daemonset

CLUSTER = "demo"
EKS_CLUSTER = "hpkv-eks"


@dataclass
class Scenario:
    aws: AwsEmulator
    kube: KubeHarness
    workdir: Path
    kubeconfig: Path
    cluster_name: str = CLUSTER
    eks_name: str = EKS_CLUSTER
    node_names: list[str] = field(default_factory=list)
    proxy: Any = None  # a KubeProxy when the test routes hpkv's Kubernetes traffic through it

    @property
    def sagemaker(self) -> Any:
        return self.aws.extensions["sagemaker"]

    def hyperpod(self, **kwargs: Any) -> Any:
        """Seed the HyperPod cluster (and its EKS cluster, pointing at the test apiserver)."""
        if self.proxy is not None:
            self.proxy.write_kubeconfig(self.kubeconfig)
        self.aws.extensions["eks"].seed_cluster(
            self.eks_name,
            endpoint=self.proxy.url if self.proxy is not None else self.kube.url,
            ca_data=self.kube.ca_data(),
            oidc_issuer=f"https://oidc.eks.{self.aws.region}.amazonaws.com/id/0123456789ABCDEF0123456789ABCDEF",
        )
        kwargs.setdefault("eks_cluster_name", self.eks_name)
        return self.sagemaker.seed_cluster(self.cluster_name, **kwargs)

    def nodes(self, count: int = 2, **kwargs: Any) -> list[str]:
        names = [
            f"hyperpod-i-{i:04d}" for i in range(len(self.node_names), len(self.node_names) + count)
        ]
        self.node_names += add_nodes(self.kube, names, **kwargs)
        return names

    def ai_toolkit(self, ready_nodes: Sequence[str] | None = None) -> None:
        play_daemonset(
            self.kube, "aws-hyperpod", "ai-toolkit", self.node_names, ready_nodes=ready_nodes
        )

    def play_hyperpod_tiered_storage(self) -> None:
        """When the cluster returns to InService, deploy or remove the ai-toolkit DaemonSet."""

        def on_in_service(cluster: Any) -> None:
            mode = (cluster.tiered_storage or {}).get("Mode")
            if mode == "Enable":
                self.ai_toolkit()
            else:
                ds = {
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "metadata": {"name": "ai-toolkit", "namespace": "aws-hyperpod"},
                }
                self.kube.delete_object(ds)
                for node in self.node_names:
                    self.kube.delete_object(
                        {
                            "apiVersion": "v1",
                            "kind": "Pod",
                            "metadata": {"name": f"ai-toolkit-{node}", "namespace": "aws-hyperpod"},
                        }
                    )

        self.sagemaker.on_in_service.append(on_in_service)

    def hpkv(
        self, *args: str, input: str | None = None, env: dict[str, str] | None = None
    ) -> CliResult:
        return run_hpkv(list(args), input=input, env=env)

    # --- write accounting -----------------------------------------------------------------------
    def mark(self) -> tuple[int, int]:
        return self.aws.mark(), self.kube.audit_mark()

    def writes_since(self, mark: tuple[int, int]) -> list[str]:
        aws_mark, kube_mark = mark
        return [str(c) for c in self.aws.writes_since(aws_mark)] + [
            str(e) for e in self.kube.writes_since(kube_mark)
        ]
