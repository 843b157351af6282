"""Server-side request parsing and response writing for the emulator's own handlers.

Requests arrive as real boto3/botocore serialized HTTP. The service comes from the SigV4 credential
scope; the operation and its parameters are decoded with botocore's own service model (the same
model the client serialized with), and parameters are validated against that model, so the
emulator rejects what AWS would reject by shape (required members, enums, ranges).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import re
import urllib.parse
import uuid
from dataclasses import dataclass, field
from functools import cache
from typing import Any


class AwsError(Exception):
    """An AWS error response: code, message, HTTP status."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status


@cache
def service_model(service: str) -> Any:
    import botocore.session

    return botocore.session.get_session().get_service_model(service)


_SIGNING_TO_SERVICE = {
    "sagemaker": "sagemaker",
    "eks": "eks",
    "iam": "iam",
    "sts": "sts",
    "s3": "s3",
}


def credential_scope(headers: dict[str, str], query: dict[str, list[str]]) -> tuple[str, str, str]:
    """(access key, region, signing service) from the Authorization header or a presigned query."""
    auth = headers.get("authorization", "")
    match = re.search(r"Credential=([^/]+)/\d+/([^/]+)/([^/]+)/aws4_request", auth)
    if match:
        return match.group(1), match.group(2), match.group(3)
    cred = (query.get("X-Amz-Credential") or [""])[0]
    parts = cred.split("/")
    if len(parts) >= 4:
        return parts[0], parts[2], parts[3]
    return "", "", ""


@dataclass
class ParsedRequest:
    service: str
    action: str
    params: dict[str, Any]
    access_key: str
    region: str
    protocol: str
    path_params: dict[str, str] = field(default_factory=dict)


def _rest_routes(service: str) -> list[tuple[str, re.Pattern[str], str, list[str]]]:
    return _rest_routes_cached(service)


@cache
def _rest_routes_cached(service: str) -> list[tuple[str, re.Pattern[str], str, list[str]]]:
    model = service_model(service)
    routes = []
    for name in model.operation_names:
        op = model.operation_model(name)
        uri = op.http.get("requestUri", "/").split("?")[0]
        labels = re.findall(r"{([^}+]+)\+?}", uri)
        pattern = re.sub(r"{([^}+]+)\+}", r"(?P<\1>.+)", uri)
        pattern = re.sub(r"{([^}]+)}", r"(?P<\1>[^/]+)", pattern)
        routes.append(
            (op.http.get("method", "POST"), re.compile("^" + pattern + "$"), name, labels)
        )
    # Longer (more specific) templates first.
    routes.sort(key=lambda r: -len(r[1].pattern))
    return routes


def _convert(shape: Any, raw: str) -> Any:
    kind = shape.type_name
    if kind in ("integer", "long"):
        try:
            return int(raw)
        except ValueError:
            return raw
    if kind == "boolean":
        return raw.lower() == "true"
    return raw


def parse_request(
    method: str, path: str, query_string: str, headers: dict[str, str], body: bytes
) -> ParsedRequest | None:
    """Decode a request for a service handled by the emulator's extensions (json/rest-json)."""
    query = urllib.parse.parse_qs(query_string, keep_blank_values=True)
    access_key, region, signing = credential_scope(headers, query)
    service = _SIGNING_TO_SERVICE.get(signing, signing)
    if not service:
        return None
    try:
        model = service_model(service)
    except Exception:
        return None
    protocol = model.metadata.get("protocol")
    if protocol == "json":
        target = headers.get("x-amz-target", "")
        action = target.split(".")[-1]
        params = json.loads(body or b"{}")
        return ParsedRequest(service, action, params, access_key, region, protocol)
    if protocol == "rest-json":
        for http_method, pattern, name, _labels in _rest_routes(service):
            if http_method != method:
                continue
            match = pattern.match(urllib.parse.unquote(path))
            if not match:
                continue
            op = model.operation_model(name)
            params: dict[str, Any] = {}
            shape = op.input_shape
            members = shape.members if shape is not None else {}
            for member_name, member in members.items():
                location = member.serialization.get("location")
                loc_name = member.serialization.get("name", member_name)
                if location == "uri" and loc_name in match.groupdict():
                    params[member_name] = match.group(loc_name)
                elif location == "querystring" and loc_name in query:
                    values = query[loc_name]
                    if member.type_name == "list":
                        params[member_name] = [_convert(member.member, v) for v in values]
                    else:
                        params[member_name] = _convert(member, values[0])
                elif location == "header" and loc_name.lower() in headers:
                    params[member_name] = headers[loc_name.lower()]
            if body:
                with contextlib.suppress(ValueError):
                    params.update(json.loads(body))
            return ParsedRequest(
                service, name, params, access_key, region, protocol, match.groupdict()
            )
        return None
    if protocol == "query":
        form = urllib.parse.parse_qs(body.decode(errors="replace")) if body else {}
        merged = {**query, **form}
        action = (merged.get("Action") or [""])[0]
        params = {k: v[0] for k, v in merged.items() if k not in ("Action", "Version")}
        return ParsedRequest(service, action, params, access_key, region, protocol)
    # rest-xml (S3): method decides read/write; the emulator passes it to moto.
    return ParsedRequest(service, f"{method} {path}", {}, access_key, region, protocol or "")


def validate_params(service: str, action: str, params: dict[str, Any]) -> None:
    """Validate parameters against the botocore model, as the real API does by shape."""
    from botocore.validate import ParamValidator

    op = service_model(service).operation_model(action)
    if op.input_shape is None:
        return
    report = ParamValidator().validate(_revive_timestamps(params, op.input_shape), op.input_shape)
    if report.has_errors():
        text = " ".join(report.generate_report().split())
        raise AwsError("ValidationException", text)
    _check_ranges(params, op.input_shape, "")


def _revive_timestamps(value: Any, shape: Any) -> Any:
    if shape is None:
        return value
    if shape.type_name == "structure" and isinstance(value, dict):
        return {
            k: _revive_timestamps(v, shape.members.get(k)) if k in shape.members else v
            for k, v in value.items()
        }
    if shape.type_name == "list" and isinstance(value, list):
        return [_revive_timestamps(v, shape.member) for v in value]
    if shape.type_name == "timestamp" and isinstance(value, (int, float)):
        return datetime.datetime.fromtimestamp(value, datetime.UTC)
    return value


def _check_ranges(value: Any, shape: Any, path: str) -> None:
    """botocore's client validator skips numeric min/max; the service enforces them."""
    if shape is None:
        return
    if shape.type_name == "structure" and isinstance(value, dict):
        for key, item in value.items():
            if key in shape.members:
                _check_ranges(item, shape.members[key], f"{path}.{key}" if path else key)
    elif shape.type_name == "list" and isinstance(value, list):
        for i, item in enumerate(value):
            _check_ranges(item, shape.member, f"{path}[{i}]")
    elif shape.type_name in ("integer", "long", "float", "double") and isinstance(
        value, (int, float)
    ):
        low, high = shape.metadata.get("min"), shape.metadata.get("max")
        if (low is not None and value < low) or (high is not None and value > high):
            raise AwsError(
                "ValidationException",
                f"1 validation error detected: Value '{value}' at '{path}' failed to satisfy "
                f"constraint: Member must have value between {low} and {high}",
            )
    elif shape.type_name == "string" and isinstance(value, str):
        enum = shape.metadata.get("enum")
        if enum and value not in enum:
            raise AwsError(
                "ValidationException",
                f"1 validation error detected: Value '{value}' at '{path}' failed to satisfy "
                f"constraint: Member must satisfy enum value set: [{', '.join(enum)}]",
            )


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return value.timestamp()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def success(
    protocol: str, data: dict[str, Any], status: int = 200
) -> tuple[int, dict[str, str], bytes]:
    content_type = "application/x-amz-json-1.1" if protocol == "json" else "application/json"
    headers = {"Content-Type": content_type, "x-amzn-RequestId": str(uuid.uuid4())}
    return status, headers, json.dumps(_jsonable(data)).encode()


def error(protocol: str, err: AwsError) -> tuple[int, dict[str, str], bytes]:
    request_id = str(uuid.uuid4())
    if protocol == "query":
        body = (
            "<ErrorResponse><Error><Type>Sender</Type>"
            f"<Code>{err.code}</Code><Message>{err.message}</Message></Error>"
            f"<RequestId>{request_id}</RequestId></ErrorResponse>"
        ).encode()
        return err.status, {"Content-Type": "text/xml", "x-amzn-RequestId": request_id}, body
    if protocol == "rest-xml":
        body = (
            f"<Error><Code>{err.code}</Code><Message>{err.message}</Message>"
            f"<RequestId>{request_id}</RequestId></Error>"
        ).encode()
        return err.status, {"Content-Type": "application/xml", "x-amz-request-id": request_id}, body
    headers = {
        "Content-Type": "application/x-amz-json-1.1" if protocol == "json" else "application/json",
        "x-amzn-RequestId": request_id,
        "x-amzn-ErrorType": err.code,
    }
    body = json.dumps({"__type": err.code, "message": err.message}).encode()
    return err.status, headers, body


def structured_query_params(service: str, action: str, flat: dict[str, Any]) -> dict[str, Any]:
    """Query-protocol parameters (``ActionNames.member.1=...``) as botocore-shaped data."""
    from moto.core.parse import QueryParser
    from moto.core.utils import get_service_model

    op = get_service_model(service).operation_model(action)
    return QueryParser(op).parse({"values": flat})  # type: ignore[typeddict-item]


def query_success(
    service: str, action: str, data: dict[str, Any]
) -> tuple[int, dict[str, str], bytes]:
    """An XML query-protocol response, serialized from ``data`` with the operation's model."""
    from moto.core.serialize import QuerySerializer
    from moto.core.utils import get_service_model

    op = get_service_model(service).operation_model(action)
    response = QuerySerializer(op).serialize(data)
    body = response["body"]
    payload = body.encode() if isinstance(body, str) else body
    headers = {"Content-Type": "text/xml", "x-amzn-RequestId": str(uuid.uuid4())}
    return response["status_code"], headers, payload
