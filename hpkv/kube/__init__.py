"""Kubernetes access with the official client.

How the cluster is chosen:

1. ``--context`` (with ``--kubeconfig`` or ``KUBECONFIG``/``~/.kube/config``) is used as given.
2. Otherwise, with ``--cluster``, hpkv finds the EKS cluster behind the HyperPod cluster
   (DescribeCluster ``Orchestrator.Eks.ClusterArn``) and uses a kubeconfig context that points at
   it (same API server URL, or a context/cluster named by the EKS ARN). When none does, hpkv
   authenticates by itself: endpoint and CA from EKS DescribeCluster, a bearer token from a
   presigned STS GetCallerIdentity request (as aws-iam-authenticator does). AWS credentials alone
   suffice.
3. Otherwise the kubeconfig's current context.

Writes use server-side apply (field manager ``hpkv``) or deletes, so retried requests (429/5xx,
retried by urllib3) are idempotent.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from functools import cached_property
from typing import TYPE_CHECKING, Any

from hpkv import __version__
from hpkv.errors import (
    AccessDenied,
    ApiError,
    ConnectionFailed,
    CredentialsError,
    HpkvError,
    NotFound,
    PreconditionFailed,
    UsageError,
)

if TYPE_CHECKING:
    from hpkv.aws import AwsClients
    from hpkv.config import Settings
    from hpkv.output.reporter import Reporter

FIELD_MANAGER = "hpkv"
USER_AGENT = f"hpkv/{__version__}"


def default_kubeconfig_path(explicit: str | None = None) -> str | None:
    if explicit:
        return os.path.expanduser(explicit)
    env = os.environ.get("KUBECONFIG")
    if env:
        return env.split(os.pathsep)[0]
    path = os.path.expanduser("~/.kube/config")
    return path if os.path.exists(path) else None


class KubeClients:
    """Lazily built Kubernetes API client and typed API accessors."""

    def __init__(
        self,
        settings: Settings,
        *,
        aws: Callable[[], AwsClients] | None = None,
        reporter: Reporter | None = None,
        clusters: Callable[[], tuple[dict[str, Any], dict[str, Any] | None]] | None = None,
    ) -> None:
        """``clusters`` returns (SageMaker DescribeCluster, EKS DescribeCluster or None): the run
        context passes its memoized reads, so connecting costs no extra AWS call in a health run."""
        self.settings = settings
        self._aws = aws
        self._clusters = clusters
        self.reporter = reporter
        self.description = ""
        self.kubeconfig_path: str | None = None
        self.context_name: str | None = None
        self.token_auth = False
        self._lock = threading.Lock()
        self._tmpdir = tempfile.TemporaryDirectory(prefix="hpkv-kube-")

    # --- connection -----------------------------------------------------------------------------
    @cached_property
    def api_client(self) -> Any:
        with self._lock:
            client = self._connect()
        client.user_agent = USER_AGENT
        return client

    def _connect(self) -> Any:
        path = default_kubeconfig_path(self.settings.kubeconfig)
        if path is not None and os.path.isdir(path):
            raise UsageError(
                f"kubeconfig {path} is a directory",
                fix="point --kubeconfig (or KUBECONFIG) at the kubeconfig file itself",
            )
        if self.settings.kubeconfig and (path is None or not os.path.isfile(path)):
            raise UsageError(
                f"kubeconfig {self.settings.kubeconfig} does not exist",
                fix="pass an existing file to --kubeconfig, or omit it to use ~/.kube/config",
            )
        if self.settings.context:
            return self._from_kubeconfig(path, self.settings.context)
        if self.settings.cluster and self._aws is not None:
            return self._for_hyperpod_cluster(path, self.settings.cluster)
        if path is None:
            raise UsageError(
                "no Kubernetes cluster selected (no kubeconfig found)",
                fix="pass --cluster NAME (hpkv then authenticates with AWS credentials) or --context",
            )
        return self._from_kubeconfig(path, None)

    def _from_kubeconfig(self, path: str | None, context: str | None) -> Any:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException

        if path is None:
            raise UsageError(
                f"no kubeconfig found to look up context '{context}'",
                fix="pass --kubeconfig PATH or export KUBECONFIG",
            )
        contexts = self._contexts(path)
        names = [c["name"] for c in contexts]
        if context is not None and context not in names:
            raise NotFound(
                f"context '{context}' is not in kubeconfig {path}",
                fix=f"use one of: {', '.join(names) or '(none)'}; or omit --context",
            )
        self._check_exec_plugin(path, context or self._current_context(path))
        configuration = client.Configuration()
        try:
            config.load_kube_config(
                config_file=path,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        except ConfigException as exc:
            raise UsageError(
                f"kubeconfig {path} is unusable: {exc}",
                fix="repair it (e.g. 'aws eks update-kubeconfig --name <eks-cluster>') or pass --cluster",
            ) from None
        except (OSError, ValueError, TypeError) as exc:
            raise UsageError(
                f"kubeconfig {path} could not be loaded: {exc}",
                fix="repair the file or point --kubeconfig at a valid one",
            ) from None
        self.kubeconfig_path = path
        self.context_name = context or self._current_context(path)
        if not urllib.parse.urlparse(configuration.host or "").hostname:
            raise UsageError(
                f"kubeconfig {path}: context '{self.context_name}' has no server URL",
                fix="set the cluster entry's 'server:' (or run 'aws eks update-kubeconfig'), or "
                "pass --cluster without --context",
            )
        self.description = f"context '{self.context_name}' ({configuration.host})"
        return self._client(configuration)

    def _check_exec_plugin(self, path: str, context: str | None) -> None:
        """A user that runs a credential plugin (e.g. 'aws eks get-token') needs it installed;
        the kubernetes client would only log the failure and carry on unauthenticated."""
        data = getattr(self, "_kubeconfig_data", None) or {}
        ctx = next((c for c in data.get("contexts") or [] if c.get("name") == context), None)
        user_name = ((ctx or {}).get("context") or {}).get("user")
        users = [u for u in data.get("users") or [] if isinstance(u, dict)]
        user = next((u.get("user") or {} for u in users if u.get("name") == user_name), {})
        command = (user.get("exec") or {}).get("command") if isinstance(user, dict) else None
        if command and not shutil.which(str(command)):
            raise UsageError(
                f"kubeconfig {path}: user '{user_name}' runs {command}, which is not installed",
                fix="install it (for 'aws eks get-token': the AWS CLI), or pass --cluster without "
                "--context and hpkv authenticates with your AWS credentials",
            )

    def _contexts(self, path: str) -> list[dict[str, Any]]:
        import yaml

        try:
            with open(path, encoding="utf-8") as handle:
                data = yaml.safe_load(handle) or {}
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(
                f"cannot read kubeconfig {path}: {exc}", fix="check the path and permissions"
            ) from None
        except yaml.YAMLError:
            raise UsageError(
                f"kubeconfig {path} is not valid YAML", fix="repair it or pass another --kubeconfig"
            ) from None
        if not isinstance(data, dict):
            raise UsageError(
                f"kubeconfig {path} is not a kubeconfig mapping",
                fix="repair it or pass another --kubeconfig",
            )
        self._kubeconfig_data = data
        contexts = data.get("contexts") or []
        return [c for c in contexts if isinstance(c, dict) and "name" in c]

    def _current_context(self, path: str) -> str | None:
        data = getattr(self, "_kubeconfig_data", None) or {}
        return data.get("current-context")

    def _client(self, configuration: Any) -> Any:
        import urllib3
        from kubernetes import client

        configuration.retries = urllib3.Retry(
            total=6,
            connect=3,
            read=2,
            status=6,
            backoff_factor=0.2,
            status_forcelist=(429, 500, 502, 503, 504),
            allowed_methods=None,
            respect_retry_after_header=True,
            raise_on_status=False,
        )
        # status runs checks concurrently: allow as many connections as worker threads
        configuration.connection_pool_maxsize = 64
        return client.ApiClient(configuration)

    def _for_hyperpod_cluster(self, path: str | None, cluster_name: str) -> Any:
        aws = self._aws() if self._aws else None
        assert aws is not None
        hyperpod, eks_cluster = (
            self._clusters() if self._clusters else self._describe(aws, cluster_name)
        )
        if eks_cluster is None:
            raise PreconditionFailed(
                f"HyperPod cluster '{hyperpod.get('ClusterName', cluster_name)}' is not "
                "orchestrated by EKS",
                fix="hpkv supports HyperPod clusters with the EKS orchestrator only",
            )
        endpoint = eks_cluster.get("endpoint") or ""
        arn = eks_cluster.get("arn") or ""
        if path is not None:
            match = self._matching_context(path, endpoint, arn, eks_cluster.get("name", ""))
            if match is not None:
                return self._from_kubeconfig(path, match)
        return self._token_client(aws, eks_cluster)

    @staticmethod
    def _describe(
        aws: AwsClients, cluster_name: str
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        from hpkv.aws import eks as eks_api
        from hpkv.aws import sagemaker

        hyperpod = sagemaker.describe_cluster(aws, cluster_name)
        eks_name = sagemaker.eks_cluster_name(hyperpod)
        return hyperpod, eks_api.describe_cluster(aws, eks_name) if eks_name else None

    def _matching_context(self, path: str, endpoint: str, arn: str, eks_name: str) -> str | None:
        contexts = self._contexts(path)
        data = getattr(self, "_kubeconfig_data", {}) or {}
        clusters = {
            c.get("name"): (c.get("cluster") or {})
            for c in data.get("clusters") or []
            if isinstance(c, dict)
        }
        wanted = endpoint.rstrip("/").lower()
        for ctx in contexts:
            cluster_ref = (ctx.get("context") or {}).get("cluster")
            server = str(clusters.get(cluster_ref, {}).get("server", "")).rstrip("/").lower()
            if (wanted and server == wanted) or (arn and arn in (ctx["name"], cluster_ref)):
                return ctx["name"]
        return None

    def _token_client(self, aws: AwsClients, eks_cluster: dict[str, Any]) -> Any:
        import base64

        from kubernetes import client

        from hpkv.kube.eks_auth import TokenSource

        endpoint = eks_cluster.get("endpoint")
        ca_data = (eks_cluster.get("certificateAuthority") or {}).get("data")
        name = eks_cluster.get("name", "")
        if not endpoint or not ca_data:
            raise PreconditionFailed(
                f"EKS cluster '{name}' has no API endpoint yet (status {eks_cluster.get('status')})",
                fix="wait until the EKS cluster is ACTIVE",
            )
        ca_path = os.path.join(self._tmpdir.name, "ca.crt")
        with open(ca_path, "wb") as handle:
            handle.write(base64.b64decode(ca_data))
        tokens = TokenSource(aws, name)
        configuration = client.Configuration()
        configuration.host = endpoint
        configuration.ssl_ca_cert = ca_path
        configuration.api_key = {"authorization": tokens.token()}
        configuration.api_key_prefix = {"authorization": "Bearer"}
        configuration.refresh_api_key_hook = tokens.refresh_hook
        self.token_auth = True
        self.token_source = tokens
        self.description = f"EKS cluster '{name}' ({endpoint}, token from AWS credentials)"
        return self._client(configuration)

    def kubeconfig_for_tools(self) -> tuple[str | None, str | None]:
        """(kubeconfig path, context) for external tools such as helm.

        With token auth a private kubeconfig (mode 0600, removed at exit) holds a fresh token.
        """
        client = self.api_client
        if not self.token_auth:
            return self.kubeconfig_path, self.context_name
        import yaml

        configuration = client.configuration
        data = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "eks",
                    "cluster": {
                        "server": configuration.host,
                        "certificate-authority": configuration.ssl_ca_cert,
                    },
                }
            ],
            "users": [{"name": "hpkv", "user": {"token": self.token_source.token()}}],
            "contexts": [{"name": "hpkv", "context": {"cluster": "eks", "user": "hpkv"}}],
            "current-context": "hpkv",
        }
        path = os.path.join(self._tmpdir.name, "kubeconfig")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            yaml.safe_dump(data, handle)
        return path, "hpkv"

    # --- typed APIs -----------------------------------------------------------------------------
    @cached_property
    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api_client)

    @cached_property
    def apps(self) -> Any:
        from kubernetes import client

        return client.AppsV1Api(self.api_client)

    @cached_property
    def batch(self) -> Any:
        from kubernetes import client

        return client.BatchV1Api(self.api_client)

    @cached_property
    def storage(self) -> Any:
        from kubernetes import client

        return client.StorageV1Api(self.api_client)

    @cached_property
    def apiextensions(self) -> Any:
        from kubernetes import client

        return client.ApiextensionsV1Api(self.api_client)

    @cached_property
    def custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.api_client)

    @cached_property
    def dynamic(self) -> Any:
        from kubernetes.dynamic import DynamicClient

        cache_file = os.path.join(self._tmpdir.name, "discovery.json")
        with kube_errors("discover the Kubernetes API"):
            return DynamicClient(self.api_client, cache_file=cache_file)

    def resource(self, api_version: str, kind: str) -> Any:
        """The dynamic-client resource for apiVersion/kind; NotFound if the API is not served."""
        from kubernetes.dynamic.exceptions import ResourceNotFoundError

        try:
            with kube_errors(f"discover {kind}.{api_version}"):
                return self.dynamic.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:
            raise NotFound(
                f"the cluster does not serve {kind} ({api_version})",
                fix="install the component that provides this API",
            ) from None

    def serves(self, api_version: str, kind: str) -> bool:
        return kind in self.served_kinds(api_version)

    def served_kinds(self, api_version: str) -> set[str]:
        """Kinds served under ``api_version``: one discovery request for that group version
        (``/apis/<group>/<version>``), not the whole API; empty when it is not served."""
        path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        data = self.get_json(path, what=f"discover {api_version}")
        return {
            r.get("kind", "") for r in (data or {}).get("resources", []) if "/" not in r["name"]
        }

    def get_json(self, path: str, *, what: str) -> Any:
        """GET an API path as JSON; None on 404."""
        api = self.api_client
        with kube_errors(what):
            method, url, headers, body, _post = api.param_serialize(
                method="GET",
                resource_path=path,
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
            )
            response = api.call_api(method, url, header_params=headers, body=body)
            response.read()
            if response.status == 404:
                return None
            if not 200 <= response.status <= 299:
                api.response_deserialize(response, {"200": "object"})  # raises ApiException
            data = json.loads(response.data or b"null")
        return data

    def server_version(self) -> dict[str, Any]:
        from kubernetes import client

        with kube_errors("read the Kubernetes version"):
            info = client.VersionApi(self.api_client).get_code()
        return {"major": info.major, "minor": info.minor, "gitVersion": info.git_version}


def status_reason(exc: BaseException) -> str:
    body = getattr(exc, "body", None)
    if body:
        try:
            data = json.loads(body)
            if isinstance(data, dict) and data.get("message"):
                return str(data["message"])
        except (ValueError, TypeError):
            pass
    return str(getattr(exc, "reason", "") or exc)


@contextlib.contextmanager
def kube_errors(action: str) -> Iterator[None]:
    """Translate kubernetes-client and transport exceptions into one-line HpkvErrors."""
    import urllib3.exceptions
    from kubernetes.client.exceptions import ApiException

    try:
        yield
    except HpkvError:
        raise
    except ApiException as exc:
        raise api_exception_error(exc, action) from None
    except urllib3.exceptions.MaxRetryError as exc:
        reason = exc.reason
        if isinstance(reason, urllib3.exceptions.ResponseError):
            raise ApiError(
                f"the Kubernetes API kept failing while trying to {action} ({reason})",
                fix="check the API server's health, then retry",
            ) from None
        raise ConnectionFailed(
            f"cannot reach the Kubernetes API to {action}: {reason}",
            fix="check --context/--kubeconfig, network access and the cluster endpoint",
        ) from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise ConnectionFailed(
            f"cannot reach the Kubernetes API to {action}: {exc}",
            fix="check --context/--kubeconfig, network access and the cluster endpoint",
        ) from None


def api_exception_error(exc: Any, action: str) -> HpkvError:
    status = getattr(exc, "status", 0) or 0
    reason = status_reason(exc)
    if status == 401:
        return CredentialsError(
            "the Kubernetes API rejected the credentials (401 Unauthorized)",
            fix="refresh them: check AWS credentials (EKS token) or the kubeconfig user",
        )
    if status == 403:
        return AccessDenied(
            f"Kubernetes denied {action}: {reason}",
            fix="grant the user RBAC for this (or an EKS access entry with cluster admin)",
        )
    if status == 404:
        return NotFound(f"{action}: {reason}", fix="check the name and namespace")
    if status == 409:
        return PreconditionFailed(
            f"{action}: conflict: {reason}", fix="retry; another writer changed it"
        )
    if status == 422:
        return ApiError(f"the API server rejected {action}: {reason}", fix="correct the object")
    if status == 429 or status >= 500:
        return ApiError(
            f"the Kubernetes API kept failing while trying to {action} ({status}: {reason})",
            fix="check the API server's health (and EKS service health), then retry",
        )
    return ApiError(
        f"{action} failed ({status}): {reason}", fix="retry; rerun with --debug for details"
    )


def is_status(exc: BaseException, status: int) -> bool:
    return getattr(exc, "status", None) == status
