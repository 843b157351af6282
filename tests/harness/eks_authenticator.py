"""A webhook token authenticator for the test kube-apiserver that accepts EKS tokens.

It does what aws-iam-authenticator does on EKS: decode ``k8s-aws-v1.<base64url presigned URL>``,
check it is a presigned STS GetCallerIdentity request that signs the ``x-k8s-aws-id`` header with
the expected cluster name and has not expired, then send that request (to the AWS emulator) and map
the returned ARN to a Kubernetes user.
"""

from __future__ import annotations

import base64
import datetime
import json
import threading
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PREFIX = "k8s-aws-v1."


class EksAuthenticator:
    def __init__(self, sts_endpoint: str, cluster_name: str = "hpkv-eks") -> None:
        self.sts_endpoint = sts_endpoint.rstrip("/")
        self.cluster_name = cluster_name
        self.denied_arns: set[str] = set()
        self.reviews: list[dict[str, Any]] = []
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/authenticate"

    def start(self) -> EksAuthenticator:
        authenticator = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                review = json.loads(self.rfile.read(length) or b"{}")
                token = review.get("spec", {}).get("token", "")
                status = authenticator.review(token)
                body = json.dumps(
                    {
                        "apiVersion": "authentication.k8s.io/v1",
                        "kind": "TokenReview",
                        "status": status,
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True, name="eks-authn").start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def review(self, token: str) -> dict[str, Any]:
        result = self._review(token)
        self.reviews.append(result)
        return result

    def _review(self, token: str) -> dict[str, Any]:
        if not token.startswith(PREFIX):
            return {"authenticated": False, "error": "not an EKS token"}
        encoded = token[len(PREFIX) :]
        try:
            url = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
        except ValueError:
            return {"authenticated": False, "error": "token is not base64url"}
        parsed = urllib.parse.urlparse(url)
        query = urllib.parse.parse_qs(parsed.query)
        if f"{parsed.scheme}://{parsed.netloc}" != self.sts_endpoint:
            return {"authenticated": False, "error": f"unexpected STS endpoint {parsed.netloc}"}
        if query.get("Action") != ["GetCallerIdentity"]:
            return {"authenticated": False, "error": "not a GetCallerIdentity request"}
        signed = (query.get("X-Amz-SignedHeaders") or [""])[0].split(";")
        if "x-k8s-aws-id" not in signed:
            return {"authenticated": False, "error": "x-k8s-aws-id header is not signed"}
        try:
            issued = datetime.datetime.strptime(query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ").replace(
                tzinfo=datetime.UTC
            )
            expires = int(query["X-Amz-Expires"][0])
        except (KeyError, ValueError):
            return {"authenticated": False, "error": "missing X-Amz-Date/X-Amz-Expires"}
        # EKS accepts tokens for 15 minutes regardless of the presign expiry.
        if datetime.datetime.now(datetime.UTC) > issued + datetime.timedelta(
            seconds=max(expires, 900)
        ):
            return {"authenticated": False, "error": "token expired"}
        request = urllib.request.Request(url, headers={"x-k8s-aws-id": self.cluster_name})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                xml = response.read()
        except OSError as exc:
            return {"authenticated": False, "error": f"STS call failed: {exc}"}
        arn_node = ET.fromstring(xml).find(".//{*}Arn")
        arn = arn_node.text if arn_node is not None else ""
        if not arn or arn in self.denied_arns:
            return {"authenticated": False, "error": f"{arn} is not mapped to a Kubernetes user"}
        return {
            "authenticated": True,
            "user": {"username": f"eks:{arn}", "uid": arn, "groups": ["system:masters"]},
        }
