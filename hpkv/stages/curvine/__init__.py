"""Stage 3: the EBS CSI driver and Curvine, the shared NVMe cache (L2), installed safely.

What ``apply`` converges, in order:

1. the ``aws-ebs-csi-driver`` EKS add-on with an IRSA role (AWS managed EBS CSI policy plus the
   HyperPod volume-attach permissions, see :mod:`hpkv.aws.ebs_csi`);
2. a StorageClass for the Curvine master's metadata and journal (``ebs.csi.aws.com``, gp3,
   WaitForFirstConsumer): a suitable existing one is reused, else ``hpkv-ebs-gp3`` is created;
3. the ``curvine-csi`` and ``curvine`` Helm releases, values generated from hpkv.yaml and upgraded
   only when chart or values change (pyhelm3 ensure semantics);
4. StorageClass ``curvine-sc`` and a ReadWriteMany PVC in each namespace holding inference
   endpoints, waited for until Bound.

Data safety: Curvine's ``cluster.format*`` values delete metadata and cached blocks at start-up.
hpkv sends them only (a) for a first install with a chart that cannot bootstrap without them, when
no release and no master volume exist, turning them off again in the same run, or (b) for an
explicit ``--reformat``. Any other run, including one after a crash between install and reset,
sends them off.

Modules: :mod:`.values` (configuration, pure helpers and the generated Helm values and objects),
:mod:`.reads` (cluster facts and reads shared by status and plan), :mod:`.status` (the checks),
:mod:`.stage` (plan, apply, remove).
"""

from __future__ import annotations

from hpkv.aws import addon_plan, irsa
from hpkv.stages.base import IamNeed
from hpkv.stages.curvine.stage import CurvineStage
from hpkv.stages.curvine.values import (
    CONFIG_DEFAULTS,
    CONFIG_SCHEMA,
    ChartSource,
    GpuNode,
    chart_needs_format_flags,
    csi_values,
    eviction_overrides,
    fullname,
    is_kernel_6_or_later,
    l2_pvc,
    l2_storage_class,
    master_addrs,
    parse_quantity,
    pick_ebs_class,
    runtime_values,
    validate_config,
    with_format_flags,
    worker_capacity_gi,
)

# What stage 3 calls for 'hpkv diagnose --iam': the EBS CSI add-on and its IRSA role
# (hpkv.aws.addon_plan, irsa, ebs_csi), plus the DescribeCluster every command makes.
IAM_ACTIONS: list[IamNeed] = [
    *addon_plan.iam_needs("install and track the aws-ebs-csi-driver add-on"),
    *irsa.iam_needs("the EBS CSI driver's IRSA role with the HyperPod volume permissions"),
]

__all__ = [
    "CONFIG_DEFAULTS",
    "CONFIG_SCHEMA",
    "IAM_ACTIONS",
    "ChartSource",
    "CurvineStage",
    "GpuNode",
    "chart_needs_format_flags",
    "csi_values",
    "eviction_overrides",
    "fullname",
    "is_kernel_6_or_later",
    "l2_pvc",
    "l2_storage_class",
    "master_addrs",
    "parse_quantity",
    "pick_ebs_class",
    "runtime_values",
    "validate_config",
    "with_format_flags",
    "worker_capacity_gi",
]
