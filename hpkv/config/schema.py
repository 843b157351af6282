"""The hpkv.yaml schema: global keys here, one section per stage, owned by that stage's module.

A stage module that takes configuration exposes ``CONFIG_SCHEMA`` (a JSON-schema object for its
section) and ``CONFIG_DEFAULTS`` (the section's defaults); register it in ``SECTION_MODULES``.
Validation uses jsonschema and reports the first problem as one line naming the key and the fix.
"""

from __future__ import annotations

import difflib
import importlib
import re
from functools import cache
from typing import Any

from hpkv.errors import ConfigError

# Top-level scalar keys and their JSON types (also the HPKV_<KEY> environment variables).
GLOBAL_KEYS: dict[str, str] = {
    "cluster": "string",
    "region": "string",
    "profile": "string",
    "kubeconfig": "string",
    "context": "string",
    "output": "string",
    "timeout": "string",
    "helm": "string",
}

# Section name in hpkv.yaml -> module that owns it.
SECTION_MODULES: dict[str, str] = {
    "tieredStorage": "hpkv.stages.tiered_storage",
    "sizing": "hpkv.sizing",
    "curvine": "hpkv.stages.curvine",
    "operator": "hpkv.stages.operator",
    "l2": "hpkv.stages.l2",
    "bench": "hpkv.bench",
}

_REGION = r"^[a-z]{2}(-gov|-iso[a-z]*)?-[a-z]+-\d$"
_DURATION = r"^\d+(\.\d+)?(ms|s|m|h)?$"

_GLOBAL_SCHEMA: dict[str, dict[str, Any]] = {
    "cluster": {
        "type": "string",
        "pattern": r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$",
        "description": "HyperPod cluster name",
    },
    "region": {"type": "string", "pattern": _REGION, "description": "AWS region, e.g. us-west-2"},
    "profile": {"type": "string", "minLength": 1},
    "kubeconfig": {"type": "string", "minLength": 1},
    "context": {"type": "string", "minLength": 1},
    "output": {"type": "string", "enum": ["table", "json", "yaml"]},
    "timeout": {"type": ["string", "number"], "pattern": _DURATION},
    "helm": {"type": "string", "minLength": 1, "description": "path of the helm binary"},
}

_FIXES = {
    "cluster": "use the HyperPod cluster name shown by 'aws sagemaker list-clusters'",
    "region": "use an AWS region code such as us-west-2",
    "output": "use one of table, json, yaml",
    "timeout": "use a duration such as 900, 90s, 15m or 1h",
}


@cache
def _sections() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    sections = {}
    for name, module_name in SECTION_MODULES.items():
        module = importlib.import_module(module_name)
        sections[name] = (module.CONFIG_SCHEMA, module.CONFIG_DEFAULTS)
    return sections


def full_schema() -> dict[str, Any]:
    properties: dict[str, Any] = dict(_GLOBAL_SCHEMA)
    for name, (schema, _defaults) in _sections().items():
        properties[name] = schema
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
    }


def defaults() -> dict[str, Any]:
    return {name: defaults for name, (_schema, defaults) in _sections().items()}


def _region_hint(value: str) -> str | None:
    """'did you mean' for common region typos: case, a missing hyphen, underscores."""
    text = value.strip().lower().replace("_", "-")
    for candidate in (text, re.sub(r"([a-z])(\d)$", r"\1-\2", text)):
        if candidate != value and re.match(_REGION, candidate):
            return f"did you mean '{candidate}'?"
    return None


def _key_path(path: list[Any]) -> str:
    return ".".join(str(p) for p in path)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


def _env_name(path: list[Any]) -> str:
    return "HPKV_" + "__".join(_snake(str(p)) for p in path)


def _schema_at(schema: dict[str, Any], path: list[Any]) -> dict[str, Any]:
    node = schema
    for part in path:
        props = node.get("properties", {})
        if isinstance(part, str) and part in props:
            node = props[part]
        elif isinstance(part, int) and "items" in node:
            node = node["items"]
        else:
            return {}
    return node


def validate(
    data: dict[str, Any],
    *,
    where: str,
    partial: bool = True,
    env: bool = False,
    flags: bool = False,
) -> None:
    """Raise ConfigError naming the first invalid key (its variable with ``env``, its option
    with ``flags``), or return."""
    import jsonschema

    schema = full_schema()
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: (len(e.absolute_path), e.path))
    if not errors:
        return
    error = errors[0]
    path = list(error.absolute_path)
    if error.validator == "additionalProperties":
        parent = _schema_at(schema, path)
        known = sorted(parent.get("properties", {}))
        extra = [k for k in error.instance if k not in parent.get("properties", {})]
        bad = extra[0] if extra else "?"
        key = _key_path([*path, bad])
        suggestion = difflib.get_close_matches(str(bad), known, n=1)
        hint = f"did you mean '{_key_path([*path, suggestion[0]])}'?" if suggestion else ""
        label = _env_name([*path, bad]) if env else key
        fix = hint or (f"remove it; known keys here: {', '.join(known)}" if known else "remove it")
        raise ConfigError(f"{where}: unknown key '{label}'", fix=fix)
    label = _env_name(path) if env else (_key_path(path) or "top level")
    if flags and len(path) == 1:
        label = "--" + _snake(str(path[0])).lower().replace("_", "-")
    value = error.instance
    shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    if error.validator == "type":
        expected = error.validator_value
        expected = " or ".join(expected) if isinstance(expected, list) else expected
        message = f"{where}: {label} is {shown}, expected {expected}"
    elif error.validator == "enum":
        choices = ", ".join(str(c) for c in error.validator_value)
        message = f"{where}: {label} is {shown}, expected one of {choices}"
    elif error.validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        sub = _schema_at(schema, path)
        lo, hi = sub.get("minimum"), sub.get("maximum")
        if hi is None:
            message = f"{where}: {label} is {shown}, below the minimum {lo}"
        elif lo is None:
            message = f"{where}: {label} is {shown}, above the maximum {hi}"
        else:
            message = f"{where}: {label} is {shown}, outside the valid range {lo}..{hi}"
    elif error.validator == "pattern":
        noun = path[-1] if path else "value"
        if isinstance(noun, int) and len(path) > 1:
            noun = f"{path[-2]} entry"  # a list item: name the list
        message = f"{where}: {label} is {shown}, which is not a valid {noun}"
    else:
        message = f"{where}: {label} is {shown}: {error.message}"
    description = _schema_at(schema, path).get("description")
    fix = _FIXES.get(str(path[0]) if path else "") if len(path) == 1 else None
    if path == ["region"] and isinstance(value, str):
        fix = _region_hint(value) or fix
    fix = (
        fix
        or _schema_at(schema, path).get("x-fix")
        or (f"set {label} to {description}" if description else f"correct {label}")
    )
    raise ConfigError(message, fix=fix)
