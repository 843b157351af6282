"""``hpkv diagnose --bundle FILE.tar.gz``: everything support needs, redacted, within a size cap.

Layout (under ``hpkv-bundle-<cluster>-<UTC time>/``), written in this order so the most useful
parts survive the size cap:

* ``summary.json``: the diagnose document (findings, detectors, IAM preflight if run);
* ``hpkv.yaml``: the resolved configuration, redacted;
* ``aws/``: DescribeCluster (SageMaker, EKS), the EKS add-ons, trust policies of the IAM roles in
  play (instance-group execution roles, the roles stages create or use (``Stage.iam_roles()``),
  IRSA roles named by ServiceAccounts, add-ons and the operator add-on's configuration);
* ``kubernetes/cluster/``: nodes, StorageClasses, CSIDrivers, PersistentVolumes, CRD names;
* ``kubernetes/<namespace>/``: the workloads, services, config, claims and events of every
  namespace hpkv inspects; Secrets by name and type only;
* ``curvine/api-overview.json``, ``curvine/api-workers.json``: the Active Curvine master's
  ``/api/overview`` and ``/api/workers`` (read as stage 3's status reads them);
* ``logs/<namespace>/<pod>/<container>[.previous].log``: log tails;
* ``manifest.json``: what is in the archive, what the cap left out and what could not be read.

Everything passes the redactor (``hpkv.health.redact``), seeded with the value of every Secret in
those namespaces, every env value and ConfigMap entry there under a secret-looking name, and
hpkv's own AWS and Kubernetes credentials. The archive is written to a
temporary file and renamed, so an interrupted run leaves no partial bundle.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import os
import re
import tarfile
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpkv import __version__, reads
from hpkv.errors import HpkvError, UsageError
from hpkv.health.redact import SECRET_NAME, Redactor

if TYPE_CHECKING:
    from hpkv.context import RunContext

DEFAULT_MAX_BYTES = 25 * 1024 * 1024
MAX_FILE_BYTES = 5 * 1024 * 1024
DEFAULT_LOG_LINES = 1000
RESERVE_BYTES = 64 * 1024  # for manifest.json and the end of the archive
NAMESPACED_KINDS: list[tuple[str, str]] = [
    ("pods", "list_namespaced_pod"),
    ("services", "list_namespaced_service"),
    ("endpoints", "list_namespaced_endpoints"),
    ("configmaps", "list_namespaced_config_map"),
    ("persistentvolumeclaims", "list_namespaced_persistent_volume_claim"),
    ("serviceaccounts", "list_namespaced_service_account"),
    ("events", "list_namespaced_event"),
]
APPS_KINDS: list[tuple[str, str]] = [
    ("deployments", "list_namespaced_deployment"),
    ("daemonsets", "list_namespaced_daemon_set"),
    ("statefulsets", "list_namespaced_stateful_set"),
    ("replicasets", "list_namespaced_replica_set"),
]
ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$")


@dataclass
class BundleResult:
    path: str
    bytes: int = 0
    files: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "bytes": self.bytes,
            "files": len(self.files),
            "skipped": self.skipped,
            "errors": self.errors,
        }


def parse_size(text: str) -> int:
    """'25MiB', '10MB', '500k', '1048576' -> bytes."""
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    value = text.strip().lower().removesuffix("ib").removesuffix("b")
    scale = units.get(value[-1:], 1)
    number = value[:-1] if value[-1:] in units else value
    try:
        size = int(float(number) * scale)
    except ValueError:
        raise UsageError(
            f"invalid size '{text}'", fix="use a size such as 25MiB, 500KiB or 10485760"
        ) from None
    if size < RESERVE_BYTES * 2:
        raise UsageError(
            f"size cap '{text}' is too small", fix=f"use at least {RESERVE_BYTES * 2 // 1024}KiB"
        )
    return size


class _Archive:
    """A tar.gz whose compressed size is known after every member, so a cap can be kept."""

    def __init__(self, path: Path, root: str, redactor: Redactor, max_bytes: int) -> None:
        self.root = root
        self.redactor = redactor
        self.max_bytes = max_bytes
        self.result = BundleResult(str(path))
        fd, self.tmp_path = tempfile.mkstemp(prefix=".hpkv-bundle-", dir=str(path.parent))
        self.raw = os.fdopen(fd, "wb")
        self.tar = tarfile.open(fileobj=self.raw, mode="w:gz")  # noqa: SIM115 - closed in finish/abort
        self.now = time.time()

    def add(self, name: str, text: str, *, redacted: bool = False) -> bool:
        if not redacted:
            text = self.redactor.text(text)
        data = text.encode("utf-8", errors="replace")
        if len(data) > MAX_FILE_BYTES:
            omitted = len(data) - MAX_FILE_BYTES
            data = data[-MAX_FILE_BYTES:] + f"\n[hpkv: first {omitted} bytes cut]\n".encode()
        estimate = len(zlib.compress(data, 6)) + 1024
        if self.raw.tell() + estimate > self.max_bytes - RESERVE_BYTES:
            self.result.skipped.append({"name": name, "reason": "size cap"})
            return False
        self._write(name, data)
        self.result.files.append(name)
        return True

    def add_json(self, name: str, data: Any) -> bool:
        return self.add(name, json.dumps(self.redactor.data(_plain(data)), indent=2, default=str))

    def add_yaml(self, name: str, data: Any) -> bool:
        import yaml

        return self.add(name, yaml.safe_dump(self.redactor.data(_plain(data)), sort_keys=False))

    def _write(self, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(f"{self.root}/{name}")
        info.size = len(data)
        info.mtime = int(self.now)
        info.mode = 0o644
        self.tar.addfile(info, io.BytesIO(data))
        gz = self.tar.fileobj
        gz.flush(zlib.Z_SYNC_FLUSH)  # type: ignore[union-attr,call-arg]

    def error(self, what: str, exc: BaseException) -> None:
        message = exc.one_line() if isinstance(exc, HpkvError) else f"{type(exc).__name__}: {exc}"
        self.result.errors.append({"what": what, "error": self.redactor.text(message)})

    def finish(self, path: Path, manifest: dict[str, Any]) -> BundleResult:
        self._write("manifest.json", json.dumps(manifest, indent=2).encode())
        self.result.files.append("manifest.json")
        self.tar.close()
        self.raw.close()
        os.chmod(self.tmp_path, 0o600)
        os.replace(self.tmp_path, path)
        self.result.bytes = path.stat().st_size
        return self.result

    def abort(self) -> None:
        try:
            self.tar.close()
            self.raw.close()
        finally:
            if os.path.exists(self.tmp_path):
                os.unlink(self.tmp_path)


def _plain(data: Any) -> Any:
    """JSON-ready data from kubernetes models, datetimes and the like."""
    return json.loads(json.dumps(data, default=str))


def write_bundle(
    ctx: RunContext,
    path: str,
    summary: dict[str, Any],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    log_lines: int = DEFAULT_LOG_LINES,
) -> BundleResult:
    target = Path(path).expanduser()
    if not target.parent.is_dir():
        raise UsageError(
            f"cannot write the bundle to {path}: {target.parent} is not a directory",
            fix="pass a path in an existing directory, e.g. --bundle ./hpkv-bundle.tar.gz",
        )
    with ctx.shared_reads():
        return _write(ctx, target, summary, max_bytes, log_lines)


def _write(
    ctx: RunContext, target: Path, summary: dict[str, Any], max_bytes: int, log_lines: int
) -> BundleResult:
    path = str(target)
    cluster = ctx.require_cluster()
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    collector = _Collector(ctx, log_lines)
    redactor = collector.redactor()
    try:
        archive = _Archive(target, f"hpkv-bundle-{cluster}-{stamp}", redactor, max_bytes)
    except OSError as exc:
        raise UsageError(
            f"cannot write the bundle to {path}: {exc.strerror or exc}",
            fix="pass a writable path",
        ) from None
    try:
        steps = collector.steps(archive, summary)
        with ctx.reporter.progress("collecting the support bundle", total=len(steps)) as bar:
            for description, step in steps:
                bar.update(description=f"bundle: {description}")
                try:
                    step()
                except HpkvError as exc:
                    archive.error(description, exc)
                bar.advance()
        manifest = {
            "kind": "hpkv.bundle",
            "hpkvVersion": __version__,
            "cluster": cluster,
            "generatedAt": stamp,
            "maxBytes": max_bytes,
            "logLines": log_lines,
            "files": list(archive.result.files),
            "skipped": archive.result.skipped,
            "errors": archive.result.errors,
            "redaction": "values of Secrets, hpkv's credentials, access keys, session and bearer "
            "tokens, Hugging Face tokens, private keys and secret-named settings read <redacted>",
        }
        return archive.finish(target, manifest)
    except BaseException:
        archive.abort()
        raise


class _Collector:
    """The collection steps, each reading something and adding files to the archive."""

    def __init__(self, ctx: RunContext, log_lines: int) -> None:
        self.ctx = ctx
        self.log_lines = log_lines
        self.namespaces = _bundle_namespaces(ctx)
        self.role_arns: dict[str, str] = {}  # role ARN or name -> where it was found
        self.errors: list[tuple[str, BaseException]] = []

    # --- redaction ---------------------------------------------------------------------------
    def redactor(self) -> Redactor:
        redactor = Redactor()
        for value in _own_credentials(self.ctx):
            redactor.add(value)
        for namespace in self.namespaces:
            for secret in self._secrets(namespace):
                redactor.add_secret_data(secret.data)
                redactor.add_secret_data(
                    {k: _b64(v) for k, v in (secret.string_data or {}).items()}
                )
        # Values set under secret-looking names (HF_TOKEN=..., a ConfigMap key "password") are
        # hidden wherever else they turn up, e.g. echoed in a log line without their name.
        wanted = set(self.namespaces)
        for pod in reads.pods(self.ctx):
            if pod.metadata.namespace in wanted:
                for container in [*(pod.spec.init_containers or []), *pod.spec.containers]:
                    for entry in container.env or []:
                        if entry.value and SECRET_NAME.search(entry.name):
                            redactor.add(entry.value)
        for config_map in reads.config_maps(self.ctx):
            if config_map.metadata.namespace in wanted:
                for key, value in (config_map.data or {}).items():
                    if value and SECRET_NAME.search(key):
                        redactor.add(value)
        return redactor

    def _secrets(self, namespace: str) -> list[Any]:
        from hpkv.kube import kube_errors

        def load() -> list[Any]:
            try:
                with kube_errors(f"list Secrets in {namespace}"):
                    return list(self.ctx.kube.core.list_namespaced_secret(namespace).items)
            except HpkvError:
                return []

        return self.ctx.memo(("kube:secrets", namespace), load)

    # --- steps ---------------------------------------------------------------------------------
    def steps(
        self, archive: _Archive, summary: dict[str, Any]
    ) -> list[tuple[str, Callable[[], Any]]]:
        a = archive
        steps: list[tuple[str, Callable[[], Any]]] = [
            ("summary.json", lambda: a.add_json("summary.json", summary)),
            ("hpkv.yaml", lambda: self._config(a)),
            ("SageMaker DescribeCluster", lambda: self._hyperpod(a)),
            ("EKS DescribeCluster", lambda: self._eks(a)),
            ("EKS add-ons", lambda: self._addons(a)),
            ("cluster-scoped objects", lambda: self._cluster_objects(a)),
        ]
        for namespace in self.namespaces:
            steps.append((f"objects in {namespace}", lambda ns=namespace: self._namespace(a, ns)))
        steps.append(("roles of the stages", self._stage_roles))
        steps.append(("IAM role trust policies", lambda: self._roles(a)))
        steps.append(("Curvine /api/overview", lambda: self._curvine(a)))
        for namespace in self.namespaces:
            steps.append((f"logs in {namespace}", lambda ns=namespace: self._logs(a, ns)))
        return steps

    def _config(self, a: _Archive) -> None:
        import yaml

        from hpkv.config import redact

        settings = self.ctx.settings
        data = {"source": str(settings.source) if settings.source else None, **settings.data}
        a.add("hpkv.yaml", yaml.safe_dump(a.redactor.data(redact(data)), sort_keys=False))

    def _hyperpod(self, a: _Archive) -> None:
        cluster = reads.hyperpod_cluster(self.ctx)
        a.add_json("aws/sagemaker-describe-cluster.json", cluster)
        for group in cluster.get("InstanceGroups") or []:
            if group.get("ExecutionRole"):
                where = f"instance group {group.get('InstanceGroupName')} execution role"
                self.role_arns.setdefault(group["ExecutionRole"], where)

    def _eks(self, a: _Archive) -> None:
        cluster = reads.eks_cluster(self.ctx)
        if cluster is not None:
            a.add_json("aws/eks-describe-cluster.json", cluster)

    def _addons(self, a: _Archive) -> None:
        from hpkv.aws import translate_errors

        cluster = reads.eks_cluster(self.ctx)
        if cluster is None:
            return
        eks, name = self.ctx.aws.eks, cluster["name"]
        with translate_errors(f"eks:ListAddons on {name}"):
            names = [n for page in eks.get_paginator("list_addons").paginate(clusterName=name)
                     for n in page.get("addons", [])]  # fmt: skip
        addons = []
        for addon in names:
            with translate_errors(f"eks:DescribeAddon {addon}"):
                described = eks.describe_addon(clusterName=name, addonName=addon)["addon"]
            addons.append(described)
            for arn in _role_arns(described):
                self.role_arns.setdefault(arn, f"add-on {addon}")
        a.add_json("aws/eks-addons.json", {"addons": addons})

    def _cluster_objects(self, a: _Archive) -> None:
        from hpkv.kube import kube_errors

        kube = self.ctx.kube
        a.add_yaml("kubernetes/cluster/nodes.yaml", _items(reads.nodes(self.ctx), kube))
        a.add_yaml(
            "kubernetes/cluster/storageclasses.yaml",
            _items(reads.storage_classes(self.ctx), kube),
        )
        with kube_errors("list CSIDrivers and PersistentVolumes"):
            drivers = kube.storage.list_csi_driver().items
            volumes = kube.core.list_persistent_volume().items
        a.add_yaml("kubernetes/cluster/csidrivers.yaml", _items(drivers, kube))
        a.add_yaml("kubernetes/cluster/persistentvolumes.yaml", _items(volumes, kube))
        with kube_errors("list CustomResourceDefinitions"):
            crds = kube.apiextensions.list_custom_resource_definition().items
        a.add_yaml(
            "kubernetes/cluster/crds.yaml",
            [
                {"name": c.metadata.name, "versions": [v.name for v in c.spec.versions or []]}
                for c in crds
            ],
        )

    def _namespace(self, a: _Archive, namespace: str) -> None:
        from hpkv.kube import kube_errors

        kube = self.ctx.kube
        for kind, method in [*((k, (kube.core, m)) for k, m in NAMESPACED_KINDS),
                             *((k, (kube.apps, m)) for k, m in APPS_KINDS)]:  # fmt: skip
            api, name = method
            with kube_errors(f"list {kind} in {namespace}"):
                items = getattr(api, name)(namespace).items
            items = [i for i in items if _in_scope(namespace, i)]
            if items:
                a.add_yaml(f"kubernetes/{namespace}/{kind}.yaml", _items(items, kube))
            if kind == "serviceaccounts":
                for account in items:
                    role = (account.metadata.annotations or {}).get("eks.amazonaws.com/role-arn")
                    if role:
                        where = f"ServiceAccount {namespace}/{account.metadata.name}"
                        self.role_arns.setdefault(role, where)
        secrets = [
            {"name": s.metadata.name, "type": s.type}
            for s in self._secrets(namespace)
            if _in_scope(namespace, s)
        ]
        if secrets:
            a.add_yaml(f"kubernetes/{namespace}/secrets.yaml", secrets)
        for name, objects in _endpoint_objects(self.ctx, namespace).items():
            a.add_yaml(f"kubernetes/{namespace}/{name}.yaml", objects)

    def _stage_roles(self) -> None:
        from hpkv.health.sections import sections

        for stage in sections(self.ctx):
            try:
                roles = stage.iam_roles()
            except HpkvError as exc:
                self.errors.append((f"IAM roles of {stage.name}", exc))
                continue
            for role in roles:
                self.role_arns.setdefault(role, f"stage {stage.name}")

    def _roles(self, a: _Archive) -> None:
        from hpkv.aws import translate_errors

        for error in self.errors:
            a.error(*error)
        by_name: dict[str, str] = {}
        for arn, where in sorted(self.role_arns.items()):
            by_name.setdefault(arn.rsplit("/", 1)[-1], where)
        for name, where in sorted(by_name.items()):
            try:
                with translate_errors(f"iam:GetRole {name}"):
                    role = self.ctx.aws.iam.get_role(RoleName=name)["Role"]
            except HpkvError as exc:
                a.error(f"IAM role {name} ({where})", exc)
                continue
            a.add_json(
                f"aws/iam-roles/{name}.json",
                {
                    "Arn": role.get("Arn"),
                    "RoleName": role.get("RoleName"),
                    "FoundIn": where,
                    "AssumeRolePolicyDocument": role.get("AssumeRolePolicyDocument"),
                },
            )

    def _curvine(self, a: _Archive) -> None:
        from hpkv.stages.curvine import CurvineStage

        stage = CurvineStage(self.ctx)
        if not stage.installed():
            return
        values = stage.live_values()
        for path in ("api/overview", "api/workers"):
            where, data = (
                stage.overview(values) if path == "api/overview" else stage.master_api(path, values)
            )
            a.add_json(f"curvine/{path.replace('/', '-')}.json", {"from": where, **data})

    def _logs(self, a: _Archive, namespace: str) -> None:
        from hpkv.concurrency import fan_out
        from hpkv.kube import podlogs

        targets = [
            (pod.metadata.name, container.name, previous)
            for pod in reads.pods(self.ctx)
            if pod.metadata.namespace == namespace and _in_scope(namespace, pod)
            for container in [*(pod.spec.init_containers or []), *pod.spec.containers]
            for previous in (False, True)
        ]

        def read(pod: str, container: str, previous: bool) -> tuple[str, str | None, Any]:
            name = f"logs/{namespace}/{pod}/{container}{'.previous' if previous else ''}.log"
            try:
                text = podlogs.read_log(
                    self.ctx.kube,
                    namespace,
                    pod,
                    container,
                    previous=previous,
                    tail_lines=self.log_lines,
                )
            except HpkvError as exc:
                return name, None, exc
            return name, text, None

        for name, text, error in fan_out([lambda t=t: read(*t) for t in targets]):
            if error is not None:
                a.error(name, error)
            elif text:
                a.add(name, text)


def _role_arns(addon: dict[str, Any]) -> list[str]:
    """Role ARNs an add-on uses: its IRSA role and any in its configuration (the operator add-on
    names its execution, ALB and KEDA roles there)."""
    found = [addon["serviceAccountRoleArn"]] if addon.get("serviceAccountRoleArn") else []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, str) and ROLE_ARN.match(value):
            found.append(value)

    text = addon.get("configurationValues")
    if text:
        with contextlib.suppress(ValueError):
            walk(json.loads(text))
    return found


def _in_scope(namespace: str, obj: Any) -> bool:
    """kube-system is in scope for its CSI drivers only; the other namespaces are hpkv's."""
    if namespace != "kube-system":
        return True
    involved = getattr(obj, "involved_object", None)
    name = involved.name if involved is not None else obj.metadata.name
    return "csi" in (name or "")


def _bundle_namespaces(ctx: RunContext) -> list[str]:
    from hpkv.health.detectors import scope_namespaces

    existing = {pod.metadata.namespace for pod in reads.pods(ctx)}
    existing.update(_namespace_names(ctx))
    return [ns for ns in scope_namespaces(ctx) if ns in existing]


def _namespace_names(ctx: RunContext) -> list[str]:
    from hpkv.kube import kube_errors

    def load() -> list[str]:
        with kube_errors("list namespaces"):
            return [n.metadata.name for n in ctx.kube.core.list_namespace().items]

    return ctx.memo("kube:namespaces", load)


def _endpoint_objects(ctx: RunContext, namespace: str) -> dict[str, list[Any]]:
    """InferenceEndpointConfigs and SageMakerEndpointRegistrations, where the CRDs are served."""
    from hpkv import topology
    from hpkv.errors import NotFound
    from hpkv.kube import kube_errors

    found: dict[str, list[Any]] = {}
    for kind, plural in (
        (topology.ENDPOINT_KIND, topology.ENDPOINT_PLURAL),
        (topology.REGISTRATION_KIND, topology.REGISTRATION_PLURAL),
    ):
        try:
            resource = ctx.kube.resource(topology.INFERENCE_API_VERSION, kind)
        except NotFound:
            continue
        with kube_errors(f"list {kind} in {namespace}"):
            items = [_strip(i.to_dict()) for i in resource.get(namespace=namespace).items]
        if items:
            found[plural] = items
    return found


def _items(items: list[Any], kube: Any) -> list[Any]:
    api = kube.api_client
    return [_strip(api.sanitize_for_serialization(item)) for item in items]


def _strip(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


def _b64(value: str) -> str:
    import base64

    return base64.b64encode(value.encode()).decode()


def _own_credentials(ctx: RunContext) -> Iterator[str]:
    """hpkv's own AWS keys and Kubernetes token (never to appear in a bundle)."""
    try:
        credentials = ctx.aws.session.get_credentials()
    except Exception:  # no credentials: nothing to hide
        credentials = None
    if credentials is not None:
        frozen = credentials.get_frozen_credentials()
        yield from (v for v in (frozen.access_key, frozen.secret_key, frozen.token) if v)
    try:
        configuration = ctx.kube.api_client.configuration
    except HpkvError:
        return
    for value in (configuration.api_key or {}).values():
        if value:
            yield str(value).removeprefix("Bearer ").strip()
