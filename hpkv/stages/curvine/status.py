"""Stage 3's status checks: EBS CSI add-on and role, releases, the Curvine master (through the
Kubernetes API service proxy), workers, capacity, CSI node plugins, PVCs and node kernels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpkv import reads
from hpkv.errors import HpkvError
from hpkv.stages.base import Check, CheckSpec, CheckState, Detector
from hpkv.stages.curvine.reads import CurvineReads
from hpkv.stages.curvine.values import (
    CSI_NODE_LABEL,
    EBS_PROVISIONER,
    MASTER_WEB_PORT,
    GpuNode,
    dig,
    format_flags,
    human_bytes,
    is_kernel_6_or_later,
    pod_ready,
    shorten,
    worker_count,
)


class CurvineStatus(CurvineReads):
    _active_master: tuple[str, str] | None = None

    def status(self) -> list[Check]:
        self.cfg  # noqa: B018 - an invalid section fails before any API call
        return self.run_check_functions()

    def check_functions(self) -> list[CheckSpec]:
        """The checks as independent parts (``hpkv status`` runs them side by side; Helm
        releases, nodes and the master's overview are read once per run)."""
        return [
            CheckSpec(
                "ebs-csi-addon",
                lambda: self._guard(
                    "ebs-csi-addon", lambda: self._addon_checks(self._runtime() is not None)
                ),
            ),
            CheckSpec("releases", lambda: [self._releases_row()]),
            CheckSpec("gpu-nodes", self._gpu_nodes_row),
            CheckSpec("master-storage-class", self._master_class_row),
            CheckSpec("master", self._master_rows),
            CheckSpec("csi-node", self._csi_node_row),
            CheckSpec("kernel", self._kernel_row),
            CheckSpec("pvcs", lambda: self._guard("pvcs", lambda: [self._pvc_check()])),
        ]

    def installed(self) -> bool | None:
        """The Curvine Helm release exists (its release Secrets or ConfigMaps, no helm run)."""
        return bool(reads.helm_release_objects(self.ctx, self.namespace, self.release))

    def namespaces(self) -> list[str]:
        return [self.namespace]

    def iam_roles(self) -> list[str]:
        return [self.role_name]  # the EBS CSI driver's (the add-on's own role comes with it)

    def detectors(self) -> list[Detector]:
        from hpkv.stages.curvine import detectors

        return detectors.detectors(self)  # type: ignore[arg-type]

    # --- shared reads --------------------------------------------------------------------------
    def live_release(self, name: str) -> tuple[Any | None, dict[str, Any] | None]:
        """(revision, values) of a release, from Helm's storage objects (one list call, shared
        in a health run; no helm process)."""
        from hpkv.helm import stored_release

        stored = stored_release(reads.helm_release_objects(self.ctx, self.namespace, name))
        return (stored, stored.values) if stored is not None else (None, None)

    def _runtime(self) -> Any | None:
        """The runtime release's revision (None when absent or unreadable)."""
        try:
            return self.live_release(self.release)[0]
        except HpkvError:
            return None

    def live_values(self) -> dict[str, Any]:
        """The runtime release's values ({} when it is not installed)."""
        return self.live_release(self.release)[1] or {}

    def _nodes_or_none(self) -> list[GpuNode] | None:
        try:
            return self.gpu_nodes()
        except HpkvError:
            return None

    def overview(self, values: dict[str, Any]) -> tuple[str, Any]:
        """The Active master's /api/overview (where, JSON), read once per health run."""
        return self.ctx.memo(
            ("curvine:api/overview", self.namespace),
            lambda: self.master_api("api/overview", values),
        )

    # --- rows ----------------------------------------------------------------------------------
    def _releases_row(self) -> Check:
        try:
            runtime, live = self.live_release(self.release)
            csi, _ = self.live_release(self.csi_release)
        except HpkvError as exc:
            return self.check("releases", CheckState.UNKNOWN, exc.one_line())
        return self._release_check(runtime, live or {}, csi)

    def _gpu_nodes_row(self) -> list[Check]:
        try:
            self.gpu_nodes()
        except HpkvError as exc:
            return [self.check("gpu-nodes", CheckState.UNKNOWN, exc.one_line())]
        return []

    def _master_class_row(self) -> list[Check]:
        if self._runtime() is None:
            return []
        return self._guard(
            "master-storage-class", lambda: [self._master_class_check(self.live_values())]
        )

    def _master_rows(self) -> list[Check]:
        if self._runtime() is None:
            return []
        return self._cluster_checks(self._nodes_or_none(), self.live_values())

    def _csi_node_row(self) -> list[Check]:
        nodes = self._nodes_or_none()
        try:
            csi, _ = self.live_release(self.csi_release)
        except HpkvError:
            csi = None
        if nodes is None or csi is None:
            return []
        return self._guard("csi-node", lambda: [self._csi_node_check(nodes)])

    def _kernel_row(self) -> list[Check]:
        nodes = self._nodes_or_none()
        return [] if nodes is None else [self._kernel_check(nodes)]

    def _guard(self, name: str, produce: Callable[[], list[Check]]) -> list[Check]:
        try:
            return produce()
        except HpkvError as exc:
            return [self.check(name, CheckState.UNKNOWN, exc.one_line(), "check access and rerun")]

    # --- EBS CSI ---------------------------------------------------------------------------
    def _addon_checks(self, curvine_installed: bool) -> list[Check]:
        from hpkv.aws import ebs_csi, eks

        cluster = self.eks_cluster["name"]
        addon = reads.addon(self.ctx, ebs_csi.ADDON_NAME)
        if addon is None:
            if self._self_managed_ebs_driver():
                return [
                    self.check(
                        "ebs-csi-addon",
                        CheckState.WARN,
                        f"no EKS add-on; a self-managed {EBS_PROVISIONER} driver is installed",
                        "make sure its role allows "
                        + ", ".join(ebs_csi.HYPERPOD_ACTIONS)
                        + " (HyperPod attaches fail with ValidationException otherwise)",
                    )
                ]
            # Without it the master's EBS volumes cannot attach: critical once Curvine runs.
            return [
                self.check(
                    "ebs-csi-addon",
                    CheckState.FAIL if curvine_installed else CheckState.WARN,
                    f"EKS add-on {ebs_csi.ADDON_NAME} is not installed on {cluster}",
                    "run 'hpkv curvine apply'",
                )
            ]
        status = addon.get("status", "unknown")
        evidence = f"{status}, version {addon.get('addonVersion')}"
        if status == "ACTIVE":
            addon_check = self.check("ebs-csi-addon", CheckState.OK, evidence)
        elif status in ("CREATING", "UPDATING"):
            addon_check = self.check(
                "ebs-csi-addon", CheckState.WARN, evidence, "wait a few minutes and rerun"
            )
        else:
            addon_check = self.check(
                "ebs-csi-addon",
                CheckState.FAIL,
                f"{evidence}: {eks.health_summary(addon)}",
                "see the add-on's health in the EKS console; 'hpkv curvine apply' converges it",
            )
        return [addon_check, self._permissions_check(addon)]

    def _permissions_check(self, addon: dict[str, Any]) -> Check:
        from hpkv.aws import ebs_csi, iam

        role_arn = addon.get("serviceAccountRoleArn")
        name = "ebs-csi-permissions"
        if not role_arn:
            return self.check(
                name,
                CheckState.FAIL,
                "the add-on has no IRSA role (it uses the node role, which lacks "
                "sagemaker:AttachClusterNodeVolume)",
                "run 'hpkv curvine apply' to give it one",
            )
        role = iam.role_name(role_arn)
        policy = reads.inline_policy(self.ctx, role, ebs_csi.INLINE_POLICY_NAME)
        if policy is None or not iam.same_document(policy, ebs_csi.hyperpod_volume_policy()):
            return self.check(
                name,
                CheckState.FAIL,
                f"role {role} lacks the HyperPod volume permissions "
                f"({', '.join(ebs_csi.HYPERPOD_ACTIONS)}): EBS attach fails with "
                "ValidationException",
                "run 'hpkv curvine apply'",
            )
        return self.check(
            name, CheckState.OK, f"role {role} allows {', '.join(ebs_csi.HYPERPOD_ACTIONS)}"
        )

    def _self_managed_ebs_driver(self) -> bool:
        from hpkv.kube import is_status, kube_errors

        with kube_errors(f"read CSIDriver {EBS_PROVISIONER}"):
            try:
                self.ctx.kube.storage.read_csi_driver(EBS_PROVISIONER)
            except Exception as exc:
                if is_status(exc, 404):
                    return False
                raise
        return True

    # --- releases ----------------------------------------------------------------------------
    def _release_check(
        self, runtime: Any | None, runtime_values: dict[str, Any], csi: Any | None
    ) -> Check:
        parts: list[str] = []
        missing: list[str] = []
        failed = False
        for label, revision in ((self.release, runtime), (self.csi_release, csi)):
            if revision is None:
                missing.append(f"{label} not installed")
                continue
            status = revision.status
            parts.append(f"{label} {revision.chart_version} revision {revision.revision} {status}")
            failed = failed or status != "deployed"
        flags = [k for k, v in format_flags(runtime_values).items() if v]
        if runtime is not None and flags:
            return self.check(
                "releases",
                CheckState.FAIL,
                f"{'; '.join(parts)}; format flags left ON ({', '.join(flags)}): a master or "
                "worker restart would delete Curvine's data",
                "run 'hpkv curvine apply' now (it turns them off)",
            )
        if failed or missing:
            return self.check(
                "releases",
                CheckState.FAIL if failed else CheckState.WARN,
                "; ".join(parts + missing),
                "run 'hpkv curvine apply'",
            )
        return self.check("releases", CheckState.OK, "; ".join(parts))

    def _master_class_check(self, values: dict[str, Any]) -> Check:
        name = dig(values, "master", "storage", "meta", "storageClass", default="")
        if not name:
            return self.check(
                "master-storage-class",
                CheckState.WARN,
                "the master's metadata is not on a StorageClass (hostPath?)",
                "reinstall with 'hpkv curvine apply' defaults to put it on EBS",
            )
        found = {sc["metadata"]["name"]: sc for sc in self.storage_classes()}.get(name)
        if found is None:
            return self.check(
                "master-storage-class",
                CheckState.FAIL,
                f"StorageClass {name} (master metadata/journal) does not exist",
                "run 'hpkv curvine apply' (or recreate the class)",
            )
        return self.check(
            "master-storage-class",
            CheckState.OK,
            f"{name} ({found.get('provisioner')}, {found.get('volumeBindingMode')})",
        )

    # --- Curvine master ----------------------------------------------------------------------
    def master_api(self, path: str, values: dict[str, Any]) -> tuple[str, Any]:
        """GET a master API path, from the Active master when several answer: (where, JSON)."""
        from hpkv.errors import ConnectionFailed
        from hpkv.kube.incluster import InClusterHttp

        port = int(dig(values, "master", "webPort", default=MASTER_WEB_PORT))
        replicas = int(dig(values, "master", "replicas", default=self.cfg["masterReplicas"]))
        http = InClusterHttp(self.ctx.kube, timeout=10.0)
        targets = [("services", self.master_base)]
        if replicas > 1:
            targets += [("pods", f"{self.master_base}-{i}") for i in range(replicas)]
        if self._active_master in targets:
            # Ask the master that answered Active before (a Standby knows less).
            targets.remove(self._active_master)
            targets.insert(0, self._active_master)
        last: tuple[str, Any] | None = None
        errors: list[str] = []
        for kind, name in targets:
            where = f"{kind[:-1]} {self.namespace}/{name}:{port}"
            try:
                response = http.get(self.namespace, kind, name, port, path)
            except HpkvError as exc:
                errors.append(exc.message)
                continue
            if response.status != 200:
                errors.append(f"{where} answered HTTP {response.status}")
                continue
            try:
                data = response.json()
            except ValueError:
                data = None
            if not isinstance(data, dict):
                errors.append(f"{where} did not answer a JSON object")
                continue
            last = (where, data)
            if path != "api/overview":
                return last
            if data.get("master_state") == "Active":
                self._active_master = (kind, name)
                return last
        if last is not None:
            return last
        raise ConnectionFailed(
            f"the Curvine master API is unreachable: {'; '.join(errors[:2])}",
            fix=f"check 'kubectl -n {self.namespace} get pods -l app.kubernetes.io/component=master'",
        )

    def _cluster_checks(self, nodes: list[GpuNode] | None, values: dict[str, Any]) -> list[Check]:
        try:
            where, overview = self.overview(values)
        except HpkvError as exc:
            return [
                self.check(
                    "master",
                    CheckState.FAIL,
                    exc.message,
                    exc.fix or "check the master pods",
                )
            ]
        state = overview.get("master_state", "unknown")
        if state != "Active":
            return [
                self.check(
                    "master",
                    CheckState.FAIL,
                    f"no Active master: {where} reports master_state={state}",
                    f"check the master pods' logs: 'kubectl -n {self.namespace} logs "
                    f"{self.master_base}-0' (Raft leader election, journal replay)",
                )
            ]
        checks = [
            self.check(
                "master",
                CheckState.OK,
                f"Active ({overview.get('master_addr') or where}, cluster "
                f"{overview.get('cluster_id', '?')})",
            )
        ]
        checks.append(self._workers_check(overview, nodes, values))
        checks.append(self._capacity_check(overview))
        return checks

    def _workers_check(
        self, overview: dict[str, Any], nodes: list[GpuNode] | None, values: dict[str, Any]
    ) -> Check:
        live = worker_count(overview.get("live_workers"))
        lost = worker_count(overview.get("lost_workers"))
        expected = len(nodes) if nodes is not None else None
        evidence = f"live {live}, lost {lost}" + (
            f", GPU nodes {expected}" if expected is not None else ""
        )
        if lost:
            try:
                _, workers = self.master_api("api/workers", values)
                names = [
                    str((w.get("address") or {}).get("hostname") or "?")
                    for w in workers.get("lost_workers") or []
                ]
                if names:
                    evidence += f"; lost: {shorten(names)}"
            except HpkvError:
                pass
        if expected and live == 0:
            return self.check(
                "workers",
                CheckState.FAIL,
                evidence,
                f"check 'kubectl -n {self.namespace} get pods -l app.kubernetes.io/component=worker'",
            )
        if lost or (expected is not None and live < expected):
            return self.check(
                "workers",
                CheckState.WARN,
                evidence,
                "a lost worker's cached blocks are gone until it returns; check its pod and "
                "node (workers are marked lost after worker_lost_interval, 10 min)",
            )
        return self.check("workers", CheckState.OK, evidence)

    def _capacity_check(self, overview: dict[str, Any]) -> Check:
        capacity = int(overview.get("capacity") or 0)
        available = int(overview.get("available") or 0)
        used = int(overview.get("fs_used") or 0)
        high = float(self.cfg["eviction"]["highWatermark"])
        if capacity <= 0:
            return self.check(
                "capacity",
                CheckState.WARN,
                "the master reports no capacity (no live worker with storage)",
                "check the workers and their data dir",
            )
        ratio = 1 - available / capacity
        evidence = (
            f"capacity {human_bytes(capacity)}, available {human_bytes(available)}, used "
            f"{human_bytes(used)} ({ratio:.0%} full)"
        )
        if ratio > high:
            return self.check(
                "capacity",
                CheckState.WARN,
                f"{evidence}: above the eviction high watermark {high:.0%}",
                "eviction should bring it down to the low watermark; if it stays high, check "
                "curvine.eviction in hpkv.yaml (quotaEviction, ttl) and the master's eviction_* "
                "metrics",
            )
        return self.check("capacity", CheckState.OK, evidence)

    # --- CSI, PVCs, nodes --------------------------------------------------------------------
    def _csi_node_check(self, nodes: list[GpuNode]) -> Check:
        from hpkv.kube import kube_errors

        with kube_errors(f"list the CSI node plugin pods in {self.namespace}"):
            pods = self.ctx.kube.core.list_namespaced_pod(
                self.namespace, label_selector=CSI_NODE_LABEL
            ).items
        ready = {p.spec.node_name for p in pods if p.spec.node_name and pod_ready(p)}
        missing = [n.name for n in nodes if n.name not in ready]
        evidence = f"ready on {len(nodes) - len(missing)}/{len(nodes)} GPU nodes"
        if not nodes:
            return self.check("csi-node", CheckState.WARN, "no HyperPod GPU nodes found")
        if missing:
            return self.check(
                "csi-node",
                CheckState.FAIL if len(missing) == len(nodes) else CheckState.WARN,
                f"{evidence}; not ready on: {shorten(missing)}",
                f"check 'kubectl -n {self.namespace} get pods -l {CSI_NODE_LABEL} -o wide' "
                "(ImagePullBackOff: check curvine.csi images)",
            )
        return self.check("csi-node", CheckState.OK, evidence)

    def _pvc_check(self) -> Check:
        namespaces = self.pvc_namespaces()
        found = {p.metadata.namespace: p for p in self.l2_pvcs()}
        if not namespaces:
            return self.check(
                "pvcs",
                CheckState.OK,
                "no namespace holds inference endpoints yet (nothing to mount)",
            )
        problems = []
        for ns in namespaces:
            pvc = found.get(ns)
            if pvc is None:
                problems.append(f"{ns}: missing")
            elif (pvc.status.phase if pvc.status else None) != "Bound":
                problems.append(f"{ns}: {pvc.status.phase if pvc.status else 'unknown'}")
        name = self.cfg["pvcName"]
        if problems:
            return self.check(
                "pvcs",
                CheckState.WARN,
                f"PVC {name}: {'; '.join(problems)}",
                "run 'hpkv curvine apply'; a Pending PVC usually means a wrong master-addrs or a "
                "master that is down",
            )
        return self.check("pvcs", CheckState.OK, f"PVC {name} Bound in {', '.join(namespaces)}")

    def _kernel_check(self, nodes: list[GpuNode]) -> Check:
        kernels = sorted({n.kernel for n in nodes if n.kernel})
        newer = [n.name for n in nodes if is_kernel_6_or_later(n.kernel)]
        if newer:
            return self.check(
                "kernel",
                CheckState.WARN,
                f"Linux 6.x on {shorten(newer)} (kernels: {', '.join(kernels)}); Curvine's "
                "FUSE is documented as untested on 6.x (curvine#35, #252)",
                "watch for FUSE I/O errors in the inference pods; the AWS HyperPod walkthrough "
                "ran on such nodes",
            )
        return self.check("kernel", CheckState.OK, f"kernels: {', '.join(kernels) or 'unknown'}")
