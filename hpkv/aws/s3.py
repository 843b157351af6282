"""S3 access for buckets hpkv owns (the operator's TLS certificate bucket)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpkv.aws import error_code, translate_errors

if TYPE_CHECKING:
    from hpkv.aws import AwsClients


def bucket_state(aws: AwsClients, name: str) -> str:
    """``present`` (ours to use), ``absent``, or ``forbidden`` (exists, owned by someone else)."""
    import botocore.exceptions

    with translate_errors(f"s3:HeadBucket {name}"):
        try:
            aws.s3.head_bucket(Bucket=name)
        except botocore.exceptions.ClientError as exc:
            code = error_code(exc)
            if code in ("404", "NoSuchBucket", "NotFound"):
                return "absent"
            if code in ("403", "AccessDenied", "Forbidden"):
                return "forbidden"
            raise
    return "present"


def create_bucket(aws: AwsClients, name: str, *, tags: list[dict[str, str]]) -> None:
    """CreateBucket in the session's region (no LocationConstraint in us-east-1), then tag it."""
    import botocore.exceptions

    region = aws.region
    params: dict[str, Any] = {"Bucket": name}
    if region != "us-east-1":
        params["CreateBucketConfiguration"] = {"LocationConstraint": region}
    with translate_errors(f"s3:CreateBucket {name}"):
        try:
            aws.s3.create_bucket(**params)
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) != "BucketAlreadyOwnedByYou":
                raise
        aws.s3.put_bucket_tagging(Bucket=name, Tagging={"TagSet": tags})


def bucket_tags(aws: AwsClients, name: str) -> dict[str, str]:
    import botocore.exceptions

    with translate_errors(f"s3:GetBucketTagging {name}"):
        try:
            tag_set = aws.s3.get_bucket_tagging(Bucket=name).get("TagSet", [])
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) in ("NoSuchTagSet", "NoSuchBucket"):
                return {}
            raise
    return {t["Key"]: t["Value"] for t in tag_set}


def delete_bucket(aws: AwsClients, name: str) -> bool:
    """Delete every object (all versions) and the bucket. False when it was already gone."""
    import botocore.exceptions

    with translate_errors(f"empty and delete s3 bucket {name}"):
        try:
            paginator = aws.s3.get_paginator("list_object_versions")
            for page in paginator.paginate(Bucket=name):
                objects = [
                    {"Key": o["Key"], "VersionId": o["VersionId"]}
                    for o in page.get("Versions", []) + page.get("DeleteMarkers", [])
                ]
                if objects:
                    aws.s3.delete_objects(Bucket=name, Delete={"Objects": objects, "Quiet": True})
            aws.s3.delete_bucket(Bucket=name)
        except botocore.exceptions.ClientError as exc:
            if error_code(exc) == "NoSuchBucket":
                return False
            raise
    return True
