"""EKS bearer tokens from AWS credentials, as aws-iam-authenticator makes them.

The token is ``k8s-aws-v1.`` + base64url(presigned STS GetCallerIdentity URL) with the cluster name
signed in the ``x-k8s-aws-id`` header. EKS accepts it for 15 minutes; hpkv refreshes it after 10.
"""

from __future__ import annotations

import base64
import time
from typing import TYPE_CHECKING, Any

from hpkv.aws import translate_errors

if TYPE_CHECKING:
    from hpkv.aws import AwsClients

TOKEN_PREFIX = "k8s-aws-v1."
CLUSTER_ID_HEADER = "x-k8s-aws-id"
PRESIGN_SECONDS = 60
REFRESH_AFTER_SECONDS = 600


def presigned_caller_identity_url(aws: AwsClients, cluster_name: str) -> str:
    from botocore.signers import RequestSigner

    sts = aws.sts
    with translate_errors("sign an EKS token (sts:GetCallerIdentity)"):
        credentials = aws.session.get_credentials()
        if credentials is None:
            import botocore.exceptions

            raise botocore.exceptions.NoCredentialsError()
        signer = RequestSigner(
            sts.meta.service_model.service_id,
            aws.region,
            "sts",
            "v4",
            credentials,
            sts.meta.events,
        )
        endpoint = sts.meta.endpoint_url.rstrip("/")
        request = {
            "method": "GET",
            "url": f"{endpoint}/?Action=GetCallerIdentity&Version=2011-06-15",
            "body": {},
            "headers": {CLUSTER_ID_HEADER: cluster_name},
            "context": {},
        }
        return signer.generate_presigned_url(
            request, region_name=aws.region, expires_in=PRESIGN_SECONDS, operation_name=""
        )


def make_token(aws: AwsClients, cluster_name: str) -> str:
    url = presigned_caller_identity_url(aws, cluster_name)
    encoded = base64.urlsafe_b64encode(url.encode("utf-8")).decode("ascii").rstrip("=")
    return TOKEN_PREFIX + encoded


class TokenSource:
    """Creates tokens and refreshes them for the kubernetes client's refresh_api_key_hook."""

    def __init__(self, aws: AwsClients, cluster_name: str) -> None:
        self.aws = aws
        self.cluster_name = cluster_name
        self._token = ""
        self._issued = 0.0

    def token(self) -> str:
        if not self._token or time.monotonic() - self._issued > REFRESH_AFTER_SECONDS:
            self._token = make_token(self.aws, self.cluster_name)
            self._issued = time.monotonic()
        return self._token

    def refresh_hook(self, configuration: Any) -> None:
        configuration.api_key["authorization"] = self.token()
