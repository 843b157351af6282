"""Stage 3's plan, apply and remove (see the package docstring for what converges and the
data-safety rules)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from hpkv.errors import PreconditionFailed, UsageError
from hpkv.stages.base import Action, ApplyResult, Check, CheckState, Plan, PlanDeferred, Verb
from hpkv.stages.curvine.reads import ReleaseState
from hpkv.stages.curvine.status import CurvineStatus
from hpkv.stages.curvine.values import (
    CSI_CHART,
    CURVINE_FS_PATH,
    EBS_PROVISIONER,
    EBS_STORAGE_CLASS,
    FORMAT_KEYS,
    GPU_RESOURCE,
    HYPERPOD_LABEL,
    HYPERPOD_VALUE,
    L2_SELECTOR,
    RUNTIME_CHART,
    GpuNode,
    chart_needs_format_flags,
    csi_values,
    dig,
    ebs_storage_class,
    format_flags,
    is_suitable_ebs_class,
    l2_pvc,
    l2_storage_class,
    pick_ebs_class,
    pod_ready,
    runtime_values,
    shorten,
    with_format_flags,
    worker_capacity_gi,
)

# How a Curvine pod wait's fix ends: after a format, and after an install or upgrade.
AFTER_FORMAT = "the format flags have been turned off, rerun with --reformat to retry"
AFTER_CHANGE = "rerun 'hpkv curvine apply' once they run (it changes nothing more)"

if TYPE_CHECKING:
    from hpkv.aws.irsa import IrsaRole
    from hpkv.runbook.profile import ClusterProfile


class CurvineStage(CurvineStatus):
    name = "curvine"
    title = "EBS CSI driver and Curvine (L2 shared NVMe cache)"
    number = 3
    remove_flags = frozenset({"delete_data", "delete_volumes"})
    # Set by plan when the add-on is still CREATING/UPDATING: apply waits for it first.
    _addon_wait: str | None = None
    # Set by plan: the Curvine release as planned; apply waits for its pods after a change.
    _planned_runtime: ReleaseState | None = None

    # ============================================================================================
    # plan / apply
    # ============================================================================================
    def plan(self, *, reformat: bool = False, **_: Any) -> Plan:
        self.cfg  # noqa: B018 - an invalid section fails before any API call
        self.require_endpoint_api()
        plan = Plan(stage=self.name)
        nodes = self.gpu_nodes()
        if not nodes:
            raise PreconditionFailed(
                f"no HyperPod GPU nodes (label {HYPERPOD_LABEL}={HYPERPOD_VALUE} with "
                f"{GPU_RESOURCE}) to run Curvine workers on",
                fix="check 'kubectl get nodes -L node.kubernetes.io/instance-type' and the "
                "cluster's instance groups",
            )
        self._plan_ebs_csi(plan)
        _revision, runtime_live = self.live_release(self.release)
        master_class = self._plan_master_storage_class(plan, runtime_live)
        csi_chart = self.fetch_chart(self.chart_source(CSI_CHART))
        runtime_chart = self.fetch_chart(self.chart_source(RUNTIME_CHART))
        capacity = worker_capacity_gi(
            nodes, reserve=self.cfg["capacityReserve"], explicit=self.cfg["workerCapacity"]
        )
        desired = runtime_values(
            self.cfg, workers=len(nodes), worker_capacity_gi=capacity, master_class=master_class
        )
        if runtime_live is not None:
            self._check_fixed_values(runtime_live, desired)
        self._plan_release(
            plan, self.release_state(self.csi_release, csi_chart, csi_values(self.cfg))
        )
        runtime = self.release_state(self.release, runtime_chart, desired)
        self._planned_runtime = runtime
        self._plan_runtime(plan, runtime)
        if reformat:
            self._plan_reformat(plan, runtime, nodes)
        self._plan_l2_objects(plan)
        plan.notes.append(
            f"{len(nodes)} worker(s), one per GPU node, each caching {capacity} GiB in "
            f"{self.cfg['dataDir']}"
        )
        return plan

    # --- EBS CSI -----------------------------------------------------------------------------
    def _plan_ebs_csi(self, plan: Plan) -> None:
        from hpkv.aws import ebs_csi, eks, iam, irsa

        aws = self.ctx.aws
        cluster = self.eks_cluster["name"]
        addon = eks.describe_addon(aws, cluster, ebs_csi.ADDON_NAME)
        if addon is None and self._self_managed_ebs_driver():
            plan.notes.append(
                f"a self-managed {EBS_PROVISIONER} driver is installed: hpkv leaves it alone "
                "(no EKS add-on); its role must allow " + ", ".join(ebs_csi.HYPERPOD_ACTIONS)
            )
            return
        current_arn = (addon or {}).get("serviceAccountRoleArn")
        if current_arn and iam.role_name(current_arn) != self.role_name:
            # The add-on runs with the user's own role: keep it, add the HyperPod permissions.
            role = ebs_csi.users_role(iam.role_name(current_arn))
            live = iam.get_role(aws, role.name)
            if live is None:
                raise PreconditionFailed(
                    f"the EBS CSI add-on uses role {current_arn}, which does not exist",
                    fix="point the add-on at an existing role, or clear its role so hpkv sets "
                    "its own",
                )
            actions = irsa.plan_permissions(aws, role, live, [])
            self._add_role_actions(plan, role, actions, "HyperPod permissions in place")
            self._plan_addon(plan, cluster, addon, current_arn)
            return
        issuer = eks.oidc_issuer(self.eks_cluster)
        if not issuer:
            raise PreconditionFailed(
                f"EKS cluster '{cluster}' has no OIDC issuer, which IRSA needs",
                fix="enable it (it is on by default for EKS clusters); check 'aws eks "
                "describe-cluster'",
            )
        plan.add(irsa.plan_oidc_provider(aws, self.account, issuer, iam.MANAGED_TAGS))
        role = ebs_csi.hpkv_role(self.role_name, self.account, issuer)
        live = iam.get_role(aws, role.name)
        attached = iam.attached_policies(aws, role.name) if live else []
        # The role and each of its policies are separate steps of the plan.
        actions = irsa.plan_role(
            aws, role, live, fix_trust=self.ctx.options.yes, notes=plan.notes
        ) + irsa.plan_permissions(aws, role, live, attached)
        self._add_role_actions(plan, role, actions, "trust and policies in place")
        role_arn = live["Arn"] if live else f"arn:aws:iam::{self.account}:role/{role.name}"
        self._plan_addon(plan, cluster, addon, role_arn)

    @staticmethod
    def _add_role_actions(plan: Plan, role: IrsaRole, actions: list[Action], in_place: str) -> None:
        for action in actions or [Action(role.target, Verb.NONE, in_place)]:
            plan.add(action)

    def _plan_addon(
        self, plan: Plan, cluster: str, addon: dict[str, Any] | None, role_arn: str
    ) -> None:
        from hpkv.aws import addon_plan, ebs_csi, eks

        wanted = addon_plan.AddonWanted(
            cluster=cluster,
            name=ebs_csi.ADDON_NAME,
            kubernetes_version=str(self.eks_cluster.get("version", "")),
            version_policy=self.cfg["ebsCsi"].get("addonVersion") or "default",
            config_key="curvine.ebsCsi.addonVersion",
            settings={"serviceAccountRoleArn": role_arn},
            # NONE: fail rather than overwrite a self-managed driver's objects; PRESERVE: keep
            # configuration the user changed on the add-on's objects.
            resolve_create="NONE",
            resolve_update="PRESERVE",
            wait=self.ctx.options.wait is not False,
        )
        action = addon_plan.plan_addon(self.ctx, wanted, addon)
        status = (addon or {}).get("status")
        if status in eks.BUSY:
            if action.changes:
                raise PreconditionFailed(
                    f"EKS add-on {ebs_csi.ADDON_NAME} is {status}",
                    fix="wait for it to finish, then rerun",
                )
            if status != "DELETING":
                # Nothing to change, but the rest of the plan needs it ACTIVE.
                self._addon_wait = cluster
        plan.add(action)

    def _wait_addon(self, cluster: str) -> None:
        from hpkv.aws import addon_plan, ebs_csi

        if self.ctx.options.wait is False:
            return
        addon_plan.wait_for(self.ctx, cluster, ebs_csi.ADDON_NAME)

    # --- StorageClass for the master ----------------------------------------------------------
    def _plan_master_storage_class(self, plan: Plan, runtime_live: dict[str, Any] | None) -> str:
        from hpkv.kube import objects

        classes = {sc["metadata"]["name"]: sc for sc in self.storage_classes()}
        configured = self.cfg["ebsStorageClassName"]
        deployed = dig(runtime_live or {}, "master", "storage", "meta", "storageClass", default="")
        if deployed:
            if configured and configured != deployed:
                raise PreconditionFailed(
                    f"curvine.ebsStorageClassName is {configured}, but the installed master's "
                    f"volumes use {deployed}, which cannot change after install",
                    fix=f"set curvine.ebsStorageClassName to {deployed} (or leave it empty)",
                )
            name = deployed
        elif configured:
            name = configured
        else:
            name = pick_ebs_class(classes.values()) or EBS_STORAGE_CLASS
        target = f"StorageClass/{name}"
        live = classes.get(name)
        if live is not None:
            why = "in use" if deployed else "reused"
            if not is_suitable_ebs_class(live):
                plan.notes.append(
                    f"StorageClass {name} is not {EBS_PROVISIONER}/gp3/WaitForFirstConsumer; "
                    "the master's volumes may land in the wrong zone or type"
                )
            plan.add(
                Action(
                    target,
                    Verb.NONE,
                    f"{why} for the master's metadata and journal ({live.get('provisioner')}, "
                    f"{(live.get('parameters') or {}).get('type', 'gp3')}, "
                    f"{live.get('volumeBindingMode')})",
                )
            )
            return name
        if deployed:
            plan.notes.append(
                f"StorageClass {deployed} used by the master's volumes is missing; hpkv recreates "
                "it as an EBS gp3 class"
            )
        plan.add(
            objects.plan_apply(
                self.ctx.kube,
                ebs_storage_class(name),
                summary="EBS gp3 class (WaitForFirstConsumer) for the master's metadata/journal",
            )
        )
        return name

    def _check_fixed_values(self, live: dict[str, Any], desired: dict[str, Any]) -> None:
        """Refuse changes the chart or the StatefulSet cannot make after install."""
        fixed = {
            ("master", "replicas"): "curvine.masterReplicas",
            ("master", "storage", "meta", "size"): "curvine.masterMetaSize",
            ("master", "storage", "journal", "size"): "curvine.masterJournalSize",
            ("master", "storage", "journal", "storageClass"): "curvine.ebsStorageClassName",
        }
        for path, key in fixed.items():
            before, after = dig(live, *path), dig(desired, *path)
            if before is not None and before != after:
                raise PreconditionFailed(
                    f"{key} is {after}, but the installed Curvine master has {before}, which "
                    "cannot change after install",
                    fix=f"set {key} back to {before}; changing it needs 'hpkv curvine remove "
                    "--delete-data' and a fresh install",
                )

    # --- Helm releases -----------------------------------------------------------------------
    def _plan_release(self, plan: Plan, state: ReleaseState) -> None:
        chart = f"{state.chart.metadata.name} {state.chart.metadata.version}"
        if state.revision is None:
            plan.add(
                Action(
                    state.target,
                    Verb.CREATE,
                    f"install chart {chart}",
                    None,
                    state.desired,
                    run=lambda: self._ensure(state.name, state.chart, state.desired),
                )
            )
        elif state.needs_upgrade:
            plan.add(
                Action(
                    state.target,
                    Verb.UPDATE,
                    f"upgrade to chart {chart} (revision {state.revision.revision} is "
                    f"{state.status}; chart or values differ)",
                    state.live_values,
                    state.desired,
                    run=lambda: self._ensure(state.name, state.chart, state.desired),
                )
            )
        else:
            plan.add(
                Action(
                    state.target,
                    Verb.NONE,
                    f"chart {chart} revision {state.revision.revision} up to date",
                    state.desired,
                    state.desired,
                )
            )

    def _cluster_has_data(self) -> bool:
        """A release (in any state) or master volumes exist: never send format flags."""
        revision = self.ctx.helm.current_revision(self.release, self.namespace)
        return revision is not None or bool(self.master_pvcs())

    def _plan_runtime(self, plan: Plan, state: ReleaseState) -> None:
        version = str(state.chart.metadata.version)
        first_install = state.revision is None and not self.master_pvcs()
        if not (first_install and chart_needs_format_flags(version)):
            left_on = [k for k, v in format_flags(state.live_values or {}).items() if v]
            self._plan_release(plan, state)
            if left_on:
                plan.notes.append(
                    f"the installed release has {', '.join(left_on)} ON (an interrupted first "
                    "install or reformat): this apply turns them off"
                )
            return
        plan.add(
            Action(
                state.target,
                Verb.CREATE,
                f"install chart {state.chart.metadata.name} {version}; this chart needs the "
                "format flags to bootstrap, so they are on for the first start on the new, empty "
                "master volumes and turned off again in this run",
                None,
                state.desired,
                run=lambda: self._first_install_with_format(state),
            )
        )

    def _first_install_with_format(self, state: ReleaseState) -> None:
        if self._cluster_has_data():
            # Something was installed since planning: never format an existing cluster.
            self._ensure(state.name, state.chart, state.desired)
            return
        with self._format_flags_on(state):
            self._wait_pods_ready(
                "master", int(state.desired["master"]["replicas"]), set(), then=AFTER_FORMAT
            )

    @contextlib.contextmanager
    def _format_flags_on(self, state: ReleaseState) -> Iterator[None]:
        """Deploy with the format flags on; turn them off again however the block ends (an
        error, a timeout, Ctrl-C), so no later restart formats."""
        try:
            self._ensure(state.name, state.chart, with_format_flags(state.desired, True))
            yield
        finally:
            if self.ctx.helm.current_revision(state.name, self.namespace) is not None:
                self.ctx.reporter.step(f"turn the format flags off on {state.target}")
                self._ensure(state.name, state.chart, state.desired)

    def _plan_reformat(self, plan: Plan, state: ReleaseState, nodes: list[GpuNode]) -> None:
        if state.revision is None:
            raise UsageError(
                f"there is no Curvine release {self.namespace}/{self.release} to reformat",
                fix="run 'hpkv curvine apply' without --reformat to install it",
            )
        volumes = self.master_pvcs()
        node_names = [n.name for n in nodes]
        plan.add(
            Action(
                f"curvine cluster {self.namespace}/{self.release}",
                Verb.UPDATE,
                "REFORMAT: deletes all Curvine metadata and journal on the master volumes "
                f"({', '.join(volumes) or 'none found'}) and every cached block under "
                f"{self.cfg['dataDir']} on {shorten(node_names)}; restarts the master and "
                "workers with the format flags on, then turns them off",
                format_flags(state.desired),
                dict.fromkeys(FORMAT_KEYS, True),
                run=lambda: self._reformat(state),
                destructive=True,
            )
        )

    def _reformat(self, state: ReleaseState) -> None:
        with self._format_flags_on(state):
            deleted = self._delete_cluster_pods()
            self._wait_cluster_ready(state, deleted, then=AFTER_FORMAT)

    def _component_selector(self, component: str) -> str:
        return f"app.kubernetes.io/instance={self.release},app.kubernetes.io/component={component}"

    def _delete_cluster_pods(self) -> set[str]:
        from hpkv.kube import kube_errors

        deleted: set[str] = set()
        core = self.ctx.kube.core
        for component in ("master", "worker"):
            with kube_errors(f"restart the Curvine {component} pods"):
                pods = core.list_namespaced_pod(
                    self.namespace, label_selector=self._component_selector(component)
                ).items
                for pod in pods:
                    core.delete_namespaced_pod(pod.metadata.name, self.namespace)
                    deleted.add(pod.metadata.uid)
        return deleted

    def _wait_pods_ready(
        self, component: str, replicas: int, replaced: set[str], *, then: str
    ) -> None:
        """Wait for Ready pods that are not among ``replaced`` (UIDs); ``then`` ends the fix."""
        core = self.ctx.kube.core

        def done(items: list[Any]) -> tuple[bool, str]:
            fresh = [p for p in items if p.metadata.uid not in replaced and pod_ready(p)]
            return len(fresh) >= replicas, f"{len(fresh)}/{replicas} {component} pod(s) ready"

        self._wait_until(
            f"Curvine {component} pods to start",
            core.list_namespaced_pod,
            {"namespace": self.namespace, "label_selector": self._component_selector(component)},
            done,
            fix=f"check 'kubectl -n {self.namespace} get pods -l app.kubernetes.io/component="
            f"{component}'; {then}",
        )

    # --- L2 StorageClass and PVCs ------------------------------------------------------------
    def _plan_l2_objects(self, plan: Plan) -> None:
        from hpkv.kube import objects

        sc = l2_storage_class(self.cfg)
        live = objects.read(
            self.ctx.kube, "storage.k8s.io/v1", "StorageClass", sc["metadata"]["name"]
        )
        immutable = ("provisioner", "parameters", "reclaimPolicy", "volumeBindingMode")
        if live is not None and not all(
            objects.is_subset(sc[k], live.get(k)) and objects.is_subset(live.get(k), sc[k])
            for k in immutable
        ):
            plan.add(
                Action(
                    objects.describe(sc),
                    Verb.UPDATE,
                    "recreate (StorageClass parameters are immutable; bound PVs keep theirs)",
                    {k: live.get(k) for k in immutable},
                    {k: sc[k] for k in immutable},
                    run=lambda: self._recreate_storage_class(sc),
                )
            )
        else:
            plan.add(
                objects.plan_apply(
                    self.ctx.kube, sc, summary="Curvine CSI class for the L2 (fs-path /l2cache)"
                )
            )
        namespaces = self.pvc_namespaces()
        if not namespaces:
            plan.notes.append(
                "no namespace holds inference endpoints yet: no L2 PVC created (rerun after "
                "deploying one, or list namespaces in curvine.pvcNamespaces)"
            )
        for ns in namespaces:
            if objects.read(self.ctx.kube, "v1", "Namespace", ns) is None:
                raise PreconditionFailed(
                    f"namespace {ns} (curvine.pvcNamespaces) does not exist",
                    fix=f"create it ('kubectl create namespace {ns}') or remove it from "
                    "curvine.pvcNamespaces",
                )
            pvc = l2_pvc(self.cfg, ns)
            live_pvc = objects.read(
                self.ctx.kube, "v1", "PersistentVolumeClaim", pvc["metadata"]["name"], ns
            )
            if live_pvc is not None:
                live_class = (live_pvc.get("spec") or {}).get("storageClassName")
                if live_class != self.cfg["storageClassName"]:
                    raise PreconditionFailed(
                        f"PVC {ns}/{self.cfg['pvcName']} exists with StorageClass {live_class}",
                        fix="rename curvine.pvcName, or delete that PVC if it is not in use",
                    )
            plan.add(objects.plan_apply(self.ctx.kube, pvc, summary="RWX L2 volume"))

    def _recreate_storage_class(self, sc: dict[str, Any]) -> None:
        from hpkv.kube import objects

        objects.delete(self.ctx.kube, "storage.k8s.io/v1", "StorageClass", sc["metadata"]["name"])
        objects.apply(self.ctx.kube, sc)

    # --- apply -------------------------------------------------------------------------------
    def apply(self, plan: Plan) -> ApplyResult:
        if self._addon_wait:
            self._wait_addon(self._addon_wait)
        result = self.run_plan(plan)
        if self.ctx.options.wait is False:
            result.notes.append(
                "not waiting for Curvine's pods or the PVCs (--no-wait); check 'hpkv curvine status'"
            )
            return result
        runtime = self._planned_runtime
        if runtime is not None and any(a.target == runtime.target for a in result.performed):
            result.checks.append(self._wait_cluster_ready(runtime, set(), then=AFTER_CHANGE))
        result.checks.append(self._wait_pvcs_bound())
        if result.performed:
            result.notes.append("check Curvine's health with 'hpkv curvine status'")
        return result

    def _wait_cluster_ready(self, state: ReleaseState, replaced: set[str], *, then: str) -> Check:
        """The master and one worker per GPU node Ready (none of the ``replaced`` pods): after
        an install or upgrade the L2 wiring that follows mounts the cache through them."""
        masters = int(state.desired["master"]["replicas"])
        workers = int(state.desired["worker"]["replicas"])
        self._wait_pods_ready("master", masters, replaced, then=then)
        self._wait_pods_ready("worker", workers, replaced, then=then)
        return self.check(
            "pods", CheckState.OK, f"{masters} master and {workers} worker pod(s) Ready"
        )

    def _wait_pvcs_bound(self) -> Check:
        namespaces = set(self.pvc_namespaces())
        name = self.cfg["pvcName"]
        if not namespaces:
            return self.check("pvcs", CheckState.OK, "no L2 PVC to wait for")

        def done(items: list[Any]) -> tuple[bool, str]:
            phases = {
                p.metadata.namespace: (p.status.phase if p.status else None)
                for p in items
                if p.metadata.name == name
            }
            pending = sorted(ns for ns in namespaces if phases.get(ns) != "Bound")
            return not pending, f"not Bound in: {', '.join(pending)}"

        self._wait_until(
            f"PVC {name} to be Bound",
            self.ctx.kube.core.list_persistent_volume_claim_for_all_namespaces,
            {"label_selector": L2_SELECTOR},
            done,
            fix=f"check 'kubectl describe pvc {name}' and the CSI controller's logs "
            f"('kubectl -n {self.namespace} logs deploy/curvine-csi-controller')",
        )
        return self.check(
            "pvcs", CheckState.OK, f"PVC {name} Bound in {', '.join(sorted(namespaces))}"
        )

    # ============================================================================================
    # remove
    # ============================================================================================
    def plan_remove(
        self, *, delete_data: bool = False, delete_volumes: bool = False, **_: Any
    ) -> Plan:
        """Uninstall Curvine and its CSI driver. The L2 PVCs (cached KV blocks) go only with
        ``delete_data``, the master's metadata/journal volumes (EBS) only with
        ``delete_volumes``; what stays is listed in ``Plan.kept``."""
        from hpkv.kube import objects

        self.cfg  # noqa: B018 - an invalid section fails before any API call
        plan = Plan(stage=self.name)
        for pvc in sorted(self.l2_pvcs(), key=lambda p: p.metadata.namespace):
            ns = pvc.metadata.namespace
            users = self._pods_using(ns, pvc.metadata.name)
            if users:
                # Without its CSI driver a mounted L2 breaks those pods, deleted or not.
                raise PlanDeferred(
                    "l2",
                    f"PVC {ns}/{pvc.metadata.name} is mounted by pod(s) {shorten(users, 3)}",
                    fix="unwire the L2 first ('hpkv l2 remove'; 'hpkv down' does it) or scale "
                    "those endpoints down",
                )
            if not delete_data:
                plan.kept.append(
                    f"L2 PVC {ns}/{pvc.metadata.name} and its cached KV blocks (--delete-data "
                    "deletes them; once the CSI driver is gone, deleting them needs it back: "
                    "'hpkv curvine apply', then remove with --delete-data)"
                )
                continue
            plan.add(
                Action(
                    f"PersistentVolumeClaim/{ns}/{pvc.metadata.name}",
                    Verb.DELETE,
                    f"delete the L2 volume (its {CURVINE_FS_PATH} directory of cached KV blocks "
                    "is removed by the Curvine CSI driver)",
                    before={"phase": pvc.status.phase if pvc.status else None},
                    run=lambda ns=ns, name=pvc.metadata.name, volume=pvc.spec.volume_name: (
                        self._delete_l2_pvc(ns, name, volume)
                    ),
                    destructive=True,
                )
            )
        plan.add(
            objects.plan_delete(
                self.ctx.kube,
                "storage.k8s.io/v1",
                "StorageClass",
                self.cfg["storageClassName"],
                summary="delete the Curvine L2 StorageClass",
            )
        )
        for name, summary in (
            (self.csi_release, "uninstall the Curvine CSI driver"),
            (
                self.release,
                "uninstall Curvine (master and workers stop; the master's EBS volumes and the "
                "NVMe data dirs are kept)",
            ),
        ):
            revision = self.ctx.helm.current_revision(name, self.namespace)
            target = f"helm release {self.namespace}/{name}"
            if revision is None:
                plan.add(Action(target, Verb.NONE, "not installed"))
                continue
            plan.add(
                Action(
                    target,
                    Verb.DELETE,
                    summary,
                    before={"revision": revision.revision},
                    run=lambda name=name: self.ctx.helm.uninstall(name, self.namespace),
                )
            )
        volumes = self.master_pvcs()
        if delete_volumes:
            for volume in volumes:
                plan.add(
                    objects.plan_delete(
                        self.ctx.kube,
                        "v1",
                        "PersistentVolumeClaim",
                        volume,
                        self.namespace,
                        summary="delete Curvine's metadata/journal volume (the EBS volume is "
                        "deleted with it)",
                        destructive=True,
                    )
                )
        elif volumes:
            plan.kept.append(
                f"the master's metadata/journal volumes ({', '.join(volumes)}, EBS); a later "
                "apply reuses them (--delete-volumes deletes them)"
            )
        if delete_data or delete_volumes:
            plan.notes.append(
                f"cached blocks in {self.cfg['dataDir']} on the GPU nodes are not deleted by "
                "hpkv; remove that directory on the nodes to reclaim the space"
            )
        plan.kept.append(
            f"the EKS add-on aws-ebs-csi-driver, its IAM role and the EBS StorageClass "
            f"(shared infrastructure), and the namespace {self.namespace}"
        )
        return plan

    def _pods_using(self, namespace: str, claim: str) -> list[str]:
        from hpkv.kube import kube_errors

        with kube_errors(f"list pods in {namespace}"):
            pods = self.ctx.kube.core.list_namespaced_pod(namespace).items
        users = []
        for pod in pods:
            for volume in pod.spec.volumes or []:
                source = volume.persistent_volume_claim
                if source is not None and source.claim_name == claim:
                    users.append(pod.metadata.name)
        return sorted(users)

    def _delete_l2_pvc(self, namespace: str, name: str, volume: str | None) -> None:
        """Delete a PVC and wait for its PV to go, while the CSI driver that deletes it runs."""
        from hpkv.kube import objects

        objects.delete(self.ctx.kube, "v1", "PersistentVolumeClaim", name, namespace)
        if not volume or self.ctx.options.wait is False:
            return

        def done(items: list[Any]) -> tuple[bool, str]:
            gone = all(p.metadata.name != volume for p in items)
            return gone, f"PV {volume} still exists"

        self._wait_until(
            f"PV {volume} of {namespace}/{name} to be deleted",
            self.ctx.kube.core.list_persistent_volume,
            {"field_selector": f"metadata.name={volume}"},
            done,
            fix="check the CSI controller's logs; rerun 'hpkv curvine remove' when it is gone",
        )

    # ============================================================================================
    # runbook: deferral and the offline plan
    # ============================================================================================
    def require_endpoint_api(self) -> None:
        """The L2 PVCs go in the namespaces of the inference endpoints: without the operator's
        InferenceEndpointConfig API (and without curvine.pvcNamespaces) they cannot be planned."""
        from hpkv.topology import endpoint_api_served

        if self.cfg["pvcNamespaces"] or endpoint_api_served(self.ctx.kube):
            return
        raise PlanDeferred(
            "operator",
            "its L2 PVCs go in the namespaces of the inference endpoints, and the "
            "InferenceEndpointConfig API the operator installs is not served yet",
            fix="run stage 'operator' first ('hpkv up' does it), or list the namespaces in "
            "curvine.pvcNamespaces",
        )

    def plan_offline(self, profile: ClusterProfile) -> Plan:
        """The plan for the profile's cluster after stage 2 (the OIDC provider exists), from the
        same values, objects and IRSA role the live plan builds (no API call)."""
        from hpkv.aws import ebs_csi, eks, irsa
        from hpkv.kube.objects import comparable, describe

        cfg = self.cfg
        cluster = profile.describe_eks()
        issuer = eks.oidc_issuer(cluster) or ""
        plan = Plan(stage=self.name)
        addons = {str(a.get("name")): a for a in profile.addons}
        plan.add(Action(irsa.oidc_provider_target(issuer), Verb.NONE, "exists (stage 2)"))
        if ebs_csi.ADDON_NAME not in addons:
            role_name = cfg["ebsCsi"].get("roleName") or ebs_csi.default_role_name(cluster["name"])
            plan.add(
                irsa.role_creation(None, ebs_csi.hpkv_role(role_name, profile.account, issuer))
            )
        plan.add(self._offline_ebs_addon(addons.get(ebs_csi.ADDON_NAME), str(cluster["version"])))
        master_class = cfg["ebsStorageClassName"] or EBS_STORAGE_CLASS
        sc = ebs_storage_class(master_class)
        if master_class in profile.storage_classes:
            plan.add(Action(describe(sc), Verb.NONE, "reused for the master's metadata/journal"))
        else:
            summary = "EBS gp3 class (WaitForFirstConsumer) for the master's metadata/journal"
            plan.add(Action(describe(sc), Verb.CREATE, summary, None, comparable(sc)))
        nodes = self._offline_nodes(profile)
        capacity = worker_capacity_gi(
            nodes, reserve=cfg["capacityReserve"], explicit=cfg["workerCapacity"]
        )
        desired = runtime_values(
            cfg, workers=len(nodes), worker_capacity_gi=capacity, master_class=master_class
        )
        releases = {(r.get("namespace"), r.get("name")): r for r in profile.helm_releases}
        for release, chart, values in (
            (self.csi_release, CSI_CHART, csi_values(cfg)),
            (self.release, RUNTIME_CHART, desired),
        ):
            plan.add(self._offline_release(release, chart, values, releases))
        l2_class = l2_storage_class(cfg)
        plan.add(
            Action(
                describe(l2_class),
                Verb.CREATE,
                "Curvine CSI class for the L2 (fs-path /l2cache)",
                None,
                comparable(l2_class),
            )
        )
        namespaces = sorted(
            {ns for ns, _name, _n in profile.endpoint_refs()} | set(cfg["pvcNamespaces"])
        )
        for ns in namespaces:
            pvc = l2_pvc(cfg, ns)
            plan.add(Action(describe(pvc), Verb.CREATE, "RWX L2 volume", None, comparable(pvc)))
        if not namespaces:
            plan.notes.append("no inference endpoint in the profile: no L2 PVC planned")
        plan.notes.append(
            f"{len(nodes)} worker(s), one per GPU node, each caching {capacity} GiB in "
            f"{cfg['dataDir']} (sized from the instance type's NVMe; the live plan reads the "
            "nodes' ephemeral-storage)"
        )
        return plan

    def _offline_ebs_addon(self, installed: dict[str, Any] | None, kubernetes: str) -> Action:
        from hpkv.aws import ebs_csi

        target = f"eks addon/{ebs_csi.ADDON_NAME}"
        if installed is not None:
            return Action(target, Verb.NONE, f"{installed.get('version') or '?'} installed")
        policy = self.cfg["ebsCsi"].get("addonVersion") or "default"
        version = {
            "default": f"EKS's default for Kubernetes {kubernetes}",
            "latest": "the latest version",
        }.get(policy, policy)
        return Action(target, Verb.CREATE, f"create {version}", None, {"addonVersion": version})

    def _offline_nodes(self, profile: ClusterProfile) -> list[GpuNode]:
        from hpkv.runbook.init import is_gpu_type
        from hpkv.sizing.catalog import BUILTIN_INSTANCE_TYPES

        nodes = []
        for node in profile.cluster_nodes():
            kind = node["InstanceType"]
            if not is_gpu_type(kind):
                continue
            known = BUILTIN_INSTANCE_TYPES.get(kind)
            disk = int(known.nvme_gb * 1e9) if known and known.nvme_gb else None
            nodes.append(GpuNode(name=node["InstanceId"], kernel="", disk_bytes=disk))
        if not nodes:
            raise PreconditionFailed(
                f"the cluster profile has no GPU instance group to run Curvine workers on "
                f"({profile.source})",
                fix="add an instance group with a GPU instance type (ml.g*, ml.p*)",
            )
        return nodes

    def _offline_release(
        self,
        release: str,
        chart: str,
        values: dict[str, Any],
        installed: dict[tuple[Any, Any], dict[str, Any]],
    ) -> Action:
        source = self.chart_source(chart)
        target = f"helm release {self.namespace}/{release}"
        if (self.namespace, release) in installed:
            return Action(target, Verb.NONE, "installed (chart and values compared live)")
        summary = f"install chart {source} from {source.repo}"
        if chart == RUNTIME_CHART and chart_needs_format_flags(source.version):
            summary += (
                "; this chart needs the format flags to bootstrap, so they are on for the first "
                "start on the new, empty master volumes and turned off again in this run"
            )
        return Action(target, Verb.CREATE, summary, None, values)
