"""A real kube-apiserver + etcd for tests.

Built from the ``k8s.io/kubernetes`` Go module by ``scripts/build-kube-harness.sh`` (pinned 1.36.x)
and started once per test session. There is no kubelet and there are no controllers: tests play the
controllers by writing objects and status subresources.

Users (static tokens, all but ``readonly`` in ``system:masters``):

* ``hpkv``: the identity the tool under test uses (its writes are counted from the audit log);
* ``harness``: the tests' own client, playing controllers;
* ``readonly``: bound to the ``view`` ClusterRole, for permission-denied tests;
* EKS tokens (``k8s-aws-v1.``...) are checked by a webhook that calls the presigned STS URL against
  the AWS emulator, as aws-iam-authenticator does.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.harness.binaries import harness_binary

WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
SYSTEM_NAMESPACES = {"default", "kube-system", "kube-public", "kube-node-lease"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _write_certs(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a serving certificate for 127.0.0.1/localhost, made with cryptography."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hpkv-test-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName("kubernetes.default.svc"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = (
        directory / "ca.crt",
        directory / "apiserver.crt",
        directory / "apiserver.key",
    )
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca_path, cert_path, key_path


def _write_sa_key(path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )


@dataclass
class AuditEntry:
    verb: str
    user: str
    resource: str
    namespace: str
    name: str
    subresource: str
    code: int
    user_agent: str

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        sub = f"/{self.subresource}" if self.subresource else ""
        return f"{self.verb} {self.resource}{sub} {where}{self.name} -> {self.code}"


@dataclass
class KubeHarness:
    workdir: Path
    tokens: dict[str, str] = field(default_factory=dict)
    port: int = 0
    etcd_port: int = 0
    webhook_url: str | None = None
    _procs: list[subprocess.Popen] = field(default_factory=list)
    _baseline: set[tuple[str, str, str, str]] = field(default_factory=set)
    _resources: list[dict[str, Any]] | None = None

    # --- lifecycle ------------------------------------------------------------------------------
    @classmethod
    def start(cls, *, webhook_url: str | None = None) -> KubeHarness:
        workdir = Path(tempfile.mkdtemp(prefix="hpkv-kube-"))
        harness = cls(workdir=workdir, webhook_url=webhook_url)
        harness._start()
        return harness

    def _start(self) -> None:
        etcd = harness_binary("etcd")
        apiserver = harness_binary("kube-apiserver")
        self.etcd_port, peer_port, self.port = free_port(), free_port(), free_port()
        logs = self.workdir / "logs"
        logs.mkdir()
        self._procs.append(
            subprocess.Popen(
                [
                    str(etcd),
                    "--data-dir",
                    str(self.workdir / "etcd"),
                    "--listen-client-urls",
                    f"http://127.0.0.1:{self.etcd_port}",
                    "--advertise-client-urls",
                    f"http://127.0.0.1:{self.etcd_port}",
                    "--listen-peer-urls",
                    f"http://127.0.0.1:{peer_port}",
                    "--initial-advertise-peer-urls",
                    f"http://127.0.0.1:{peer_port}",
                    "--initial-cluster",
                    f"default=http://127.0.0.1:{peer_port}",
                    "--unsafe-no-fsync",
                    "--log-level",
                    "warn",
                ],
                stdout=(logs / "etcd.log").open("w"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        ca, cert, key = _write_certs(self.workdir)
        self.ca_path = ca
        sa_key = self.workdir / "sa.key"
        _write_sa_key(sa_key)
        self.tokens = {
            "hpkv": secrets.token_hex(16),
            "harness": secrets.token_hex(16),
            "readonly": secrets.token_hex(16),
        }
        token_file = self.workdir / "tokens.csv"
        token_file.write_text(
            f'{self.tokens["hpkv"]},hpkv,uid-hpkv,"system:masters"\n'
            f'{self.tokens["harness"]},harness,uid-harness,"system:masters"\n'
            f"{self.tokens['readonly']},readonly,uid-readonly\n"
        )
        audit_policy = self.workdir / "audit-policy.yaml"
        audit_policy.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "audit.k8s.io/v1",
                    "kind": "Policy",
                    "omitStages": ["RequestReceived", "ResponseStarted", "Panic"],
                    "rules": [{"level": "Metadata"}],
                }
            )
        )
        self.audit_log = self.workdir / "audit.log"
        args = [
            str(apiserver),
            "--etcd-servers",
            f"http://127.0.0.1:{self.etcd_port}",
            "--bind-address",
            "127.0.0.1",
            "--advertise-address",
            "127.0.0.1",
            "--secure-port",
            str(self.port),
            "--tls-cert-file",
            str(cert),
            "--tls-private-key-file",
            str(key),
            "--service-account-issuer",
            "https://kubernetes.default.svc",
            "--service-account-key-file",
            str(sa_key),
            "--service-account-signing-key-file",
            str(sa_key),
            "--token-auth-file",
            str(token_file),
            "--authorization-mode",
            "RBAC",
            "--service-cluster-ip-range",
            "10.96.0.0/16",
            "--disable-admission-plugins",
            "ServiceAccount,StorageObjectInUseProtection",
            "--audit-log-path",
            str(self.audit_log),
            "--audit-policy-file",
            str(audit_policy),
            "--audit-log-format",
            "json",
            "--audit-log-mode",
            "blocking",
            "--profiling=false",
            "--enable-priority-and-fairness=false",
            # As on EKS: CSI node plugins and Curvine workers run privileged.
            "--allow-privileged=true",
        ]
        if self.webhook_url:
            webhook_config = self.workdir / "authn-webhook.kubeconfig"
            webhook_config.write_text(
                yaml.safe_dump(
                    {
                        "apiVersion": "v1",
                        "kind": "Config",
                        "clusters": [{"name": "authn", "cluster": {"server": self.webhook_url}}],
                        "users": [{"name": "apiserver", "user": {}}],
                        "contexts": [
                            {"name": "authn", "context": {"cluster": "authn", "user": "apiserver"}}
                        ],
                        "current-context": "authn",
                    }
                )
            )
            args += [
                "--authentication-token-webhook-config-file",
                str(webhook_config),
                "--authentication-token-webhook-version",
                "v1",
                "--authentication-token-webhook-cache-ttl",
                "5s",
            ]
        self._procs.append(
            subprocess.Popen(
                args,
                stdout=(logs / "kube-apiserver.log").open("w"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        self._wait_ready()
        self._wait_apiserver_objects()
        self._bootstrap()
        self._baseline = self._inventory()

    def _wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for proc in self._procs:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{proc.args[0]} exited with {proc.returncode}; see {self.workdir / 'logs'}"
                    )
            try:
                status, body = self.raw("GET", "/readyz")
                if status == 200:
                    return
                last = body[-300:]
            except OSError as exc:
                last = str(exc)
            time.sleep(0.25)
        raise RuntimeError(f"kube-apiserver not ready after {timeout}s: {last}")

    def _wait_apiserver_objects(self, timeout: float = 60.0) -> None:
        """Wait for what kube-apiserver's own controllers create after /readyz answers 200: the
        default/kubernetes Service and its ClusterIP's IPAddress. Taken into the baseline before
        they exist, a reset would delete them and the apiserver re-create them seconds later, in
        the middle of some later test's inventory."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, body = self.raw("GET", "/api/v1/namespaces/default/services/kubernetes")
            cluster_ip = (
                json.loads(body).get("spec", {}).get("clusterIP") if status == 200 else None
            )
            if cluster_ip:
                status, _ = self.raw("GET", f"/apis/networking.k8s.io/v1/ipaddresses/{cluster_ip}")
                if status == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(
            f"kube-apiserver did not create the default/kubernetes Service in {timeout}s; "
            f"see {self.workdir / 'logs'}"
        )

    def _bootstrap(self) -> None:
        # The readonly user may view everything and nothing more.
        self.apply_object(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "hpkv-test-readonly"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "view",
                },
                "subjects": [
                    {"kind": "User", "name": "readonly", "apiGroup": "rbac.authorization.k8s.io"}
                ],
            }
        )

    def stop(self) -> None:
        # The data is throwaway: kill at once rather than wait for graceful shutdown.
        for proc in reversed(self._procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=15)
        shutil.rmtree(self.workdir, ignore_errors=True)

    # --- access ---------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def ca_data(self) -> str:
        import base64

        return base64.b64encode(self.ca_path.read_bytes()).decode()

    def write_kubeconfig(
        self,
        path: Path,
        *,
        user: str = "hpkv",
        context: str = "hpkv-test",
        extra_contexts: dict[str, str] | None = None,
    ) -> Path:
        """A kubeconfig for ``user``; ``extra_contexts`` maps context name -> user."""
        contexts = {context: user, **(extra_contexts or {})}
        data = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "hpkv-test",
                    "cluster": {"server": self.url, "certificate-authority-data": self.ca_data()},
                }
            ],
            "users": [
                {"name": u, "user": {"token": self.tokens[u]}}
                for u in sorted(set(contexts.values()))
            ],
            "contexts": [
                {"name": c, "context": {"cluster": "hpkv-test", "user": u}}
                for c, u in contexts.items()
            ],
            "current-context": context,
        }
        path.write_text(yaml.safe_dump(data))
        return path

    def client(self, user: str = "harness") -> Any:
        """A kubernetes ApiClient for the tests' own use."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        configuration.ssl_ca_cert = str(self.ca_path)
        configuration.api_key = {"authorization": self.tokens[user]}
        configuration.api_key_prefix = {"authorization": "Bearer"}
        return client.ApiClient(configuration)

    def raw(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        user: str = "harness",
        content_type: str = "application/json",
        accept: str | None = None,
    ) -> tuple[int, str]:
        context = ssl.create_default_context(cafile=str(self.ca_path))
        data = (
            None
            if body is None
            else (body if isinstance(body, bytes) else json.dumps(body).encode())
        )
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.tokens[user]}")
        if accept:
            request.add_header("Accept", accept)
        if data is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, context=context, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def apply_object(
        self, obj: dict[str, Any], *, user: str = "harness", subresource: str = ""
    ) -> dict[str, Any]:
        """Server-side apply as the harness (field manager ``hpkv-test-harness``)."""
        path = self.object_path(obj) + (f"/{subresource}" if subresource else "")
        status, body = self.raw(
            "PATCH",
            path + "?fieldManager=hpkv-test-harness&force=true",
            obj,
            user=user,
            content_type="application/apply-patch+yaml",
        )
        if status >= 300:
            raise RuntimeError(f"apply {path} failed: {status} {body[:500]}")
        return json.loads(body)

    def delete_object(self, obj: dict[str, Any]) -> None:
        status, body = self.raw("DELETE", self.object_path(obj))
        if status >= 300 and status != 404:
            raise RuntimeError(f"delete failed: {status} {body[:300]}")

    def get_object(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        obj = {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}}
        if namespace:
            obj["metadata"]["namespace"] = namespace
        status, body = self.raw("GET", self.object_path(obj))
        if status == 404:
            return None
        if status >= 300:
            raise RuntimeError(f"get failed: {status} {body[:300]}")
        return json.loads(body)

    def object_path(self, obj: dict[str, Any]) -> str:
        api_version, kind = obj["apiVersion"], obj["kind"]
        resource = self._resource_for(api_version, kind)
        prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        ns = obj["metadata"].get("namespace")
        if resource["namespaced"]:
            ns = ns or "default"
            return f"{prefix}/namespaces/{ns}/{resource['name']}/{obj['metadata']['name']}"
        return f"{prefix}/{resource['name']}/{obj['metadata']['name']}"

    def _resource_for(self, api_version: str, kind: str) -> dict[str, Any]:
        # A CRD that was just created takes a moment to appear in discovery.
        deadline = time.monotonic() + 15
        while True:
            for res in self.resources():
                if res["groupVersion"] == api_version and res["kind"] == kind:
                    return res
            self._resources = None
            if time.monotonic() > deadline:
                raise KeyError(f"{kind}.{api_version} is not served")
            time.sleep(0.1)

    def resources(self) -> list[dict[str, Any]]:
        """Every served resource, from aggregated discovery (two requests)."""
        if self._resources is None:
            found: list[dict[str, Any]] = []
            accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
            for root in ("/api", "/apis"):
                _status, body = self.raw("GET", root, accept=accept)
                for group in json.loads(body).get("items", []):
                    name = group.get("metadata", {}).get("name", "")
                    for version in group.get("versions", []):
                        gv = f"{name}/{version['version']}" if name else version["version"]
                        for res in version.get("resources", []):
                            found.append(
                                {
                                    "name": res["resource"],
                                    "kind": res["responseKind"]["kind"],
                                    "namespaced": res.get("scope") == "Namespaced",
                                    "verbs": res.get("verbs", []),
                                    "groupVersion": gv,
                                }
                            )
            self._resources = found
        return self._resources

    # --- audit: counting the tool's writes --------------------------------------------------
    def audit_mark(self) -> int:
        self._flush_audit()
        return self.audit_log.stat().st_size if self.audit_log.exists() else 0

    def _flush_audit(self) -> str:
        marker = f"audit-flush-{secrets.token_hex(4)}"
        self.raw("GET", f"/api/v1/namespaces/default/configmaps/{marker}")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if self.audit_log.exists() and marker in self.audit_log.read_text():
                return marker
            time.sleep(0.02)
        return marker

    def audit_since(self, mark: int, *, user: str | None = "hpkv") -> list[AuditEntry]:
        self._flush_audit()
        entries: list[AuditEntry] = []
        with self.audit_log.open("rb") as handle:
            handle.seek(mark)
            for line in handle:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("stage") != "ResponseComplete":
                    continue
                username = event.get("user", {}).get("username", "")
                if user is not None and username != user:
                    continue
                ref = event.get("objectRef") or {}
                entries.append(
                    AuditEntry(
                        verb=event.get("verb", ""),
                        user=username,
                        resource=ref.get("resource", event.get("requestURI", "")),
                        namespace=ref.get("namespace", ""),
                        name=ref.get("name", ""),
                        subresource=ref.get("subresource", ""),
                        code=(event.get("responseStatus") or {}).get("code", 0),
                        user_agent=event.get("userAgent", ""),
                    )
                )
        return entries

    def writes_since(self, mark: int, *, user: str | None = "hpkv") -> list[AuditEntry]:
        return [e for e in self.audit_since(mark, user=user) if e.verb in WRITE_VERBS]

    # --- reset between tests --------------------------------------------------------------------
    def inventory(self) -> set[tuple[str, str, str, str]]:
        """Objects beyond the session baseline: (groupVersion, resource, namespace, name)."""
        return self._inventory() - self._baseline

    def inventory_objects(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """(API resource, object) of every object beyond the session baseline."""
        return [
            (res, obj)
            for res, obj in self._all_objects()
            if (
                res["groupVersion"],
                res["name"],
                obj["metadata"].get("namespace", ""),
                obj["metadata"]["name"],
            )
            not in self._baseline
        ]

    def _inventory(self) -> set[tuple[str, str, str, str]]:
        items: set[tuple[str, str, str, str]] = set()
        for res, obj in self._all_objects():
            items.add(
                (
                    res["groupVersion"],
                    res["name"],
                    obj["metadata"].get("namespace", ""),
                    obj["metadata"]["name"],
                )
            )
        return items

    def _listable(self) -> list[dict[str, Any]]:
        preferred: dict[tuple[str, str], dict[str, Any]] = {}
        for res in self.resources():
            verbs = set(res.get("verbs", []))
            if not {"list", "delete"} <= verbs:
                continue
            group = res["groupVersion"].split("/")[0] if "/" in res["groupVersion"] else ""
            key = (group, res["name"])
            preferred.setdefault(key, res)
        skip = {("", "events"), ("events.k8s.io", "events")}
        return [r for k, r in preferred.items() if k not in skip]

    def _all_objects(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        from concurrent.futures import ThreadPoolExecutor

        def list_items(res: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
            gv = res["groupVersion"]
            prefix = "/api/v1" if gv == "v1" else f"/apis/{gv}"
            status, body = self.raw("GET", f"{prefix}/{res['name']}")
            if status != 200:
                return []
            return [(res, obj) for obj in json.loads(body).get("items", [])]

        with ThreadPoolExecutor(max_workers=8) as pool:
            return [pair for pairs in pool.map(list_items, self._listable()) for pair in pairs]

    def reset(self) -> None:
        """Delete everything tests created, playing the garbage and namespace controllers."""
        from concurrent.futures import ThreadPoolExecutor

        self._resources = None
        namespaces: list[str] = []
        crds: list[tuple[dict[str, Any], dict[str, Any]]] = []
        others: list[tuple[dict[str, Any], dict[str, Any]]] = []
        for res, obj in self._all_objects():
            meta = obj["metadata"]
            key = (res["groupVersion"], res["name"], meta.get("namespace", ""), meta["name"])
            if key in self._baseline:
                continue
            if res["name"] == "namespaces" and res["groupVersion"] == "v1":
                namespaces.append(meta["name"])
            elif res["name"] == "customresourcedefinitions":
                crds.append((res, meta))
            else:
                others.append((res, meta))
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda pair: self._force_delete(*pair), others))
            list(pool.map(lambda pair: self._force_delete(*pair), crds))
            # The apiserver finalizes deleted CRDs asynchronously; a terminating CRD still served
            # by discovery would leak into the next test.
            list(
                pool.map(
                    lambda pair: self._wait_gone(
                        f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{pair[1]['name']}"
                    ),
                    crds,
                )
            )
            for name in namespaces:
                self.raw("DELETE", f"/api/v1/namespaces/{name}")
            list(pool.map(self.finalize_namespace, namespaces))
        self._resources = None

    def _force_delete(self, res: dict[str, Any], meta: dict[str, Any]) -> None:
        gv = res["groupVersion"]
        prefix = "/api/v1" if gv == "v1" else f"/apis/{gv}"
        ns = meta.get("namespace")
        path = (
            f"{prefix}/namespaces/{ns}/{res['name']}/{meta['name']}"
            if ns
            else f"{prefix}/{res['name']}/{meta['name']}"
        )
        if meta.get("finalizers"):
            self.raw(
                "PATCH",
                path,
                {"metadata": {"finalizers": None}},
                content_type="application/merge-patch+json",
            )
        self.raw("DELETE", path + "?gracePeriodSeconds=0")

    def _wait_gone(self, path: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, _body = self.raw("GET", path)
            if status == 404:
                return
            time.sleep(0.05)

    def finalize_namespace(self, name: str) -> None:
        """Play the namespace controller: empty the finalizers of a Terminating namespace."""
        status, body = self.raw("GET", f"/api/v1/namespaces/{name}")
        if status != 200:
            return
        ns = json.loads(body)
        ns["spec"]["finalizers"] = []
        self.raw("PUT", f"/api/v1/namespaces/{name}/finalize", ns)

    def wait_until(
        self, predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition"
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")
