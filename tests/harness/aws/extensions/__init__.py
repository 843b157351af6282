"""Stateful emulations of the AWS actions moto lacks, one module per service."""

from __future__ import annotations


def all_extensions() -> list[type]:
    from tests.harness.aws.extensions.eks import EksExtension
    from tests.harness.aws.extensions.iam import IamExtension
    from tests.harness.aws.extensions.sagemaker import SageMakerExtension

    return [SageMakerExtension, EksExtension, IamExtension]
