"""What a wired pod gets, as data: the names, the :class:`Wiring`, the admission policies (CEL
MutatingAdmissionPolicy, Kyverno ClusterPolicy) and the ``--mode patch`` JSON patch."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hpkv.topology import EndpointRef

# --- names -------------------------------------------------------------------------------------
MODES = ("policy", "patch")
MECHANISMS = ("auto", "admission-policy", "kyverno")
RESTARTS = ("auto", "rollout", "pod-by-pod", "none")

ADMISSION_API = "admissionregistration.k8s.io/v1"
POLICY_KIND = "MutatingAdmissionPolicy"
BINDING_KIND = "MutatingAdmissionPolicyBinding"
KYVERNO_API = "kyverno.io/v1"
KYVERNO_KIND = "ClusterPolicy"

WIRING_ANNOTATION = "hpkv.io/l2-wiring"
ENDPOINT_ANNOTATION = "hpkv.io/endpoint"
PATCH_ORIGINAL_ANNOTATION = "hpkv.io/l2-patch-original"
RESTARTED_AT_ANNOTATION = "kubectl.kubernetes.io/restartedAt"
MANAGED_LABELS = {"app.kubernetes.io/managed-by": "hpkv", "hpkv.io/stage": "l2"}
PATCH_STATE_CONFIGMAP = "hpkv-l2-patch-state"

REMOTE_URL_ENV = "LMCACHE_REMOTE_URL"
SERDE_ENV = "LMCACHE_REMOTE_SERDE"
EXTRA_CONFIG_ENV = "LMCACHE_EXTRA_CONFIG"
CHUNK_SIZE_ENV = "LMCACHE_CHUNK_SIZE"
CONFIG_FILE_ENV = "LMCACHE_CONFIG_FILE"
HASH_SEED_ENV = "PYTHONHASHSEED"
POD_NAME_ENV = "HPKV_POD_NAME"
SERDE = "naive"
TMP_DIR_KEY = "fs_connector_relative_tmp_dir"
TMP_DIR_VALUE = f".tmp-$({POD_NAME_ENV})"
WIRED_ENV_NAMES = (REMOTE_URL_ENV, SERDE_ENV, HASH_SEED_ENV, POD_NAME_ENV, EXTRA_CONFIG_ENV)
GPU_RESOURCE = "nvidia.com/gpu"
DEGRADED_PATTERN = re.compile(r"degraded mode", re.IGNORECASE)
SEED_WARNING_PATTERN = re.compile(r"PYTHONHASHSEED not set", re.IGNORECASE)
DEFAULT_CHUNK_SIZE = "256"

KYVERNO_REPO = "https://kyverno.github.io/kyverno/"
KYVERNO_CHART = "kyverno"
KYVERNO_CHART_VERSION = "3.7.2"
KYVERNO_NAMESPACE = "kyverno"
KYVERNO_RELEASE = "kyverno"


# --- the wiring ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Wiring:
    """What every wired pod gets; one source for the policy, the patch and the checks."""

    mount_path: str
    volume_name: str
    pvc_name: str
    storage_class: str
    hash_seed: str

    @property
    def remote_url(self) -> str:
        # LMCache's parse_remote_url asserts a host and a port; the fs connector uses the path.
        return f"fs://localhost:0{self.mount_path.rstrip('/')}/"

    def fingerprint(self, ref: EndpointRef) -> str:
        data = {
            "v": 1,
            "endpoint": str(ref),
            "mount": self.mount_path,
            "volume": self.volume_name,
            "pvc": self.pvc_name,
            "seed": self.hash_seed,
            "serde": SERDE,
            "tmp": TMP_DIR_VALUE,
        }
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    def plain_env(self) -> list[dict[str, Any]]:
        """The wired env entries, LMCACHE_EXTRA_CONFIG excluded (it is merged per pod)."""
        return [
            {"name": REMOTE_URL_ENV, "value": self.remote_url},
            {"name": SERDE_ENV, "value": SERDE},
            {"name": HASH_SEED_ENV, "value": self.hash_seed},
            {
                "name": POD_NAME_ENV,
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
            },
        ]

    def volume(self) -> dict[str, Any]:
        return {"name": self.volume_name, "persistentVolumeClaim": {"claimName": self.pvc_name}}

    def mount(self) -> dict[str, Any]:
        return {"name": self.volume_name, "mountPath": self.mount_path}


def merge_extra_config(current: str | None) -> str:
    """LMCACHE_EXTRA_CONFIG with the per-pod temp dir added; other keys are kept."""
    data: dict[str, Any] = {}
    if current:
        try:
            parsed = json.loads(current)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            data = parsed
    data.setdefault(TMP_DIR_KEY, TMP_DIR_VALUE)
    return json.dumps(data)


def wired_env(env: Sequence[dict[str, Any]], wiring: Wiring) -> list[dict[str, Any]]:
    """A container's env with the wiring applied: hpkv's names replaced, exactly once each."""
    extra = [e.get("value") for e in env if e.get("name") == EXTRA_CONFIG_ENV and "value" in e]
    kept = [dict(e) for e in env if e.get("name") not in WIRED_ENV_NAMES]
    return [
        *kept,
        *wiring.plain_env(),
        {"name": EXTRA_CONFIG_ENV, "value": merge_extra_config(extra[-1] if extra else None)},
    ]


def object_name(ref: EndpointRef) -> str:
    """The cluster-scoped name of an endpoint's policy objects (a DNS subdomain, <= 253)."""
    name = f"hpkv-l2-{ref.namespace}-{ref.name}".lower()
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(str(ref).encode()).hexdigest()[:10]
    return f"{name[:242]}-{digest}"


def vllm_container_index(containers: Sequence[dict[str, Any]], endpoint: str) -> int:
    """The vLLM container: the one named after the endpoint (the operator's rule), else the first."""
    for i, container in enumerate(containers):
        if container.get("name") == endpoint:
            return i
    return 0


# --- manifests ----------------------------------------------------------------------------------
def _cel(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _selectors(ref: EndpointRef) -> dict[str, Any]:
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ref.namespace}},
        "objectSelector": {"matchLabels": {"app": ref.name}},
    }


def _metadata(ref: EndpointRef, wiring: Wiring) -> dict[str, Any]:
    return {
        "name": object_name(ref),
        "labels": dict(MANAGED_LABELS),
        "annotations": {ENDPOINT_ANNOTATION: str(ref), WIRING_ANNOTATION: wiring.fingerprint(ref)},
    }


def policy_manifest(ref: EndpointRef, wiring: Wiring, failure_policy: str) -> dict[str, Any]:
    """The MutatingAdmissionPolicy (JSONPatch mutations) for one endpoint's pods.

    Existing list entries and new typed entries are written by separate patch operations: a list
    that mixes the two crashes kube-apiserver 1.36's JSONPatch value conversion.
    """
    container = _cel(ref.name)
    names = "[" + ", ".join(_cel(n) for n in WIRED_ENV_NAMES) + "]"
    tmp = f'"{TMP_DIR_KEY}": "{TMP_DIR_VALUE}"'
    env = "Object.spec.containers.env"
    entries = [
        f"{env}{{name: {_cel(REMOTE_URL_ENV)}, value: {_cel(wiring.remote_url)}}}",
        f"{env}{{name: {_cel(SERDE_ENV)}, value: {_cel(SERDE)}}}",
        f"{env}{{name: {_cel(HASH_SEED_ENV)}, value: {_cel(wiring.hash_seed)}}}",
        f"{env}{{name: {_cel(POD_NAME_ENV)}, valueFrom: {env}.valueFrom{{fieldRef: "
        f"{env}.valueFrom.fieldRef{{fieldPath: 'metadata.name'}}}}}}",
        f"{env}{{name: {_cel(EXTRA_CONFIG_ENV)}, value: variables.extraValue}}",
    ]
    vol, mount = _cel(wiring.volume_name), _cel(wiring.mount_path)
    ops = [
        f'JSONPatch{{op: "add", path: variables.base + "/env", '
        f"value: variables.oldEnv.filter(e, !(e.name in {names}))}}",
        *(f'JSONPatch{{op: "add", path: variables.base + "/env/-", value: {e}}}' for e in entries),
        f'JSONPatch{{op: "add", path: variables.base + "/volumeMounts", value: '
        f"variables.oldMounts.filter(m, m.name != {vol} && m.mountPath != {mount})}}",
        f'JSONPatch{{op: "add", path: variables.base + "/volumeMounts/-", value: '
        f"Object.spec.containers.volumeMounts{{name: {vol}, mountPath: {mount}}}}}",
        'JSONPatch{op: "add", path: "/spec/volumes", value: has(object.spec.volumes) ? '
        f"object.spec.volumes.filter(v, v.name != {vol}) : []}}",
        f'JSONPatch{{op: "add", path: "/spec/volumes/-", value: Object.spec.volumes{{name: {vol}, '
        f"persistentVolumeClaim: Object.spec.volumes.persistentVolumeClaim{{claimName: "
        f"{_cel(wiring.pvc_name)}}}}}}}",
        'JSONPatch{op: "add", path: "/metadata/annotations", value: '
        "has(object.metadata.annotations) ? object.metadata.annotations : {}}",
        f'JSONPatch{{op: "add", path: "/metadata/annotations/" + '
        f"jsonpatch.escapeKey({_cel(WIRING_ANNOTATION)}), value: {_cel(wiring.fingerprint(ref))}}}",
    ]
    extra = "variables.extraOld"
    variables = [
        ("names", "object.spec.containers.map(c, c.name)"),
        (
            "idx",
            f"variables.names.exists(n, n == {container}) ? "
            f"variables.names.indexOf({container}) : 0",
        ),
        ("base", "'/spec/containers/' + string(variables.idx)"),
        (
            "oldEnv",
            "has(object.spec.containers[variables.idx].env) ? "
            "object.spec.containers[variables.idx].env : []",
        ),
        (
            "oldMounts",
            "has(object.spec.containers[variables.idx].volumeMounts) ? "
            "object.spec.containers[variables.idx].volumeMounts : []",
        ),
        (
            "extras",
            f"variables.oldEnv.filter(e, e.name == {_cel(EXTRA_CONFIG_ENV)} && has(e.value))"
            ".map(e, e.value.trim())",
        ),
        (
            "extraOld",
            "variables.extras.size() > 0 ? variables.extras[variables.extras.size() - 1] : ''",
        ),
        (
            "extraValue",
            f"{extra}.startsWith('{{') && {extra}.endsWith('}}') ? "
            f"({extra}.contains({_cel(chr(34) + TMP_DIR_KEY + chr(34))}) ? {extra} : "
            f"({extra}.substring(1, {extra}.size() - 1).trim() == '' ? '{{' : "
            f"{extra}.substring(0, {extra}.lastIndexOf('}}')).trim() + ', ') + {_cel(tmp + '}')}) "
            f": {_cel('{' + tmp + '}')}",
        ),
    ]
    return {
        "apiVersion": ADMISSION_API,
        "kind": POLICY_KIND,
        "metadata": _metadata(ref, wiring),
        "spec": {
            "failurePolicy": failure_policy,
            "reinvocationPolicy": "Never",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ],
                **_selectors(ref),
            },
            "variables": [{"name": n, "expression": e} for n, e in variables],
            "mutations": [
                {
                    "patchType": "JSONPatch",
                    "jsonPatch": {"expression": "[\n  " + ",\n  ".join(ops) + "\n]"},
                }
            ],
        },
    }


def binding_manifest(ref: EndpointRef, wiring: Wiring) -> dict[str, Any]:
    return {
        "apiVersion": ADMISSION_API,
        "kind": BINDING_KIND,
        "metadata": _metadata(ref, wiring),
        "spec": {"policyName": object_name(ref), "matchResources": _selectors(ref)},
    }


def kyverno_manifest(ref: EndpointRef, wiring: Wiring, failure_policy: str) -> dict[str, Any]:
    """The Kyverno ClusterPolicy equivalent of :func:`policy_manifest`.

    ``$(`` starts a Kyverno reference, so the kubelet's ``$(HPKV_POD_NAME)`` is assembled by a
    JMESPath join; the existing extra config wins over the default temp dir, as in the CEL policy.
    """
    current = (
        f"(request.object.spec.containers[?name=='{ref.name}'].env[] | "
        f"[?name=='{EXTRA_CONFIG_ENV}'].value | [-1]) || '{{}}'"
    )
    tmp = f"join('', ['.tmp-', '$', '({POD_NAME_ENV})'])"
    extra = (
        f"{{{{ to_string(merge(object_from_lists(['{TMP_DIR_KEY}'], [{tmp}]), "
        f"parse_json({current}))) }}}}"
    )
    env = [*wiring.plain_env(), {"name": EXTRA_CONFIG_ENV, "value": extra}]
    return {
        "apiVersion": KYVERNO_API,
        "kind": KYVERNO_KIND,
        "metadata": _metadata(ref, wiring),
        "spec": {
            "background": False,
            "failurePolicy": failure_policy,
            "rules": [
                {
                    "name": "curvine-l2",
                    "match": {
                        "any": [
                            {
                                "resources": {
                                    "kinds": ["Pod"],
                                    "operations": ["CREATE"],
                                    "namespaces": [ref.namespace],
                                    "selector": {"matchLabels": {"app": ref.name}},
                                }
                            }
                        ]
                    },
                    "mutate": {
                        "patchStrategicMerge": {
                            "metadata": {
                                "annotations": {WIRING_ANNOTATION: wiring.fingerprint(ref)}
                            },
                            "spec": {
                                "volumes": [wiring.volume()],
                                "containers": [
                                    {"name": ref.name, "env": env, "volumeMounts": [wiring.mount()]}
                                ],
                            },
                        }
                    },
                }
            ],
        },
    }


def patch_operations(
    deployment: dict[str, Any], wiring: Wiring, ref: EndpointRef, *, revert: bool = False
) -> list[dict[str, Any]]:
    """The one JSON patch of ``--mode patch`` (or its reverse).

    The env, mount and volume lists are replaced whole, so each wired env entry ends up exactly
    once whatever the template held; ``test`` operations on the lists as read make the patch fail
    if the operator re-rendered meanwhile (status updates do not interfere). The replaced entries
    are kept in an annotation so ``remove`` restores them.
    """
    meta = deployment.get("metadata") or {}
    template = (deployment.get("spec") or {}).get("template") or {}
    pod_spec = template.get("spec") or {}
    containers = pod_spec.get("containers") or []
    i = vllm_container_index(containers, ref.name)
    container = containers[i]
    base = f"/spec/template/spec/containers/{i}"
    env = container.get("env") or []
    mounts = [
        m
        for m in container.get("volumeMounts") or []
        if m.get("name") != wiring.volume_name and m.get("mountPath") != wiring.mount_path
    ]
    volumes = [v for v in pod_spec.get("volumes") or [] if v.get("name") != wiring.volume_name]
    ops: list[dict[str, Any]] = [{"op": "test", "path": f"{base}/name", "value": container["name"]}]
    for path, value in (
        (f"{base}/env", container.get("env")),
        (f"{base}/volumeMounts", container.get("volumeMounts")),
        ("/spec/template/spec/volumes", pod_spec.get("volumes")),
    ):
        if value is not None:
            ops.append({"op": "test", "path": path, "value": value})
    annotations = meta.get("annotations") or {}
    template_annotations = (template.get("metadata") or {}).get("annotations") or {}
    if revert:
        try:
            original = json.loads(annotations.get(PATCH_ORIGINAL_ANNOTATION) or "[]")
        except ValueError:
            original = []
        new_env = [e for e in env if e.get("name") not in WIRED_ENV_NAMES] + list(original)
    else:
        new_env = wired_env(env, wiring)
        mounts.append(wiring.mount())
        volumes.append(wiring.volume())
    ops += [
        {"op": "add", "path": f"{base}/env", "value": new_env},
        {"op": "add", "path": f"{base}/volumeMounts", "value": mounts},
        {"op": "add", "path": "/spec/template/spec/volumes", "value": volumes},
    ]
    original_env = [e for e in env if e.get("name") in WIRED_ENV_NAMES]
    ops += _annotation_ops(
        "/metadata/annotations",
        annotations,
        PATCH_ORIGINAL_ANNOTATION,
        None if revert else annotations.get(PATCH_ORIGINAL_ANNOTATION, json.dumps(original_env)),
    )
    ops += _annotation_ops(
        "/spec/template/metadata/annotations",
        template_annotations,
        WIRING_ANNOTATION,
        None if revert else wiring.fingerprint(ref),
    )
    return ops


def _annotation_ops(
    path: str, current: dict[str, str], key: str, value: str | None
) -> list[dict[str, Any]]:
    """Set (or, for None, remove) one annotation without rewriting the others."""
    escaped = key.replace("~", "~0").replace("/", "~1")
    if value is None:
        return [{"op": "remove", "path": f"{path}/{escaped}"}] if key in current else []
    if not current:
        return [{"op": "add", "path": path, "value": {key: value}}]
    return [{"op": "add", "path": f"{path}/{escaped}", "value": value}]
