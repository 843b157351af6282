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
