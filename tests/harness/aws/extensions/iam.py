"""IAM: moto's, plus the AWS managed policies hpkv attaches.

moto knows AWS managed policies but loads them only when configured to, and then all ~1,400 of
them on every backend reset. This extension seeds just the ones the tests need, from moto's own
bundled copy of the AWS managed policy data, after each reset. Add names to ``SEEDED`` as stages
need them.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from tests.harness.aws.server import Extension

SEEDED = (
    "AmazonSageMakerHyperPodInferenceAccess",
    "AmazonSageMakerHyperPodGatedModelAccess",
    "AmazonFSxFullAccess",
    "AmazonEBSCSIDriverPolicy",
)


@cache
def _managed_policy_data() -> dict[str, Any]:
    from moto.iam.aws_managed_policies import aws_managed_policies_data

    data = json.loads(aws_managed_policies_data)
    return {name: data[name] for name in SEEDED if name in data}


class IamExtension(Extension):
    service = "iam"

    def reset(self) -> None:
        import moto.backends
        from moto.iam.models import AWSManagedPolicy

        backend = moto.backends.get_backend("iam")[self.emulator.account_id]["aws"]
        for name, data in _managed_policy_data().items():
            policy = AWSManagedPolicy.from_data(name, self.emulator.account_id, "us-east-1", data)
            backend.managed_policies[policy.arn] = policy
