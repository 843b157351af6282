"""Configuration: hpkv.yaml, HPKV_* environment variables and flags, merged and validated.

Precedence (lowest to highest): built-in defaults, the config file, ``HPKV_*`` environment
variables, command-line flags. The file is found at ``--config``, else ``./hpkv.yaml``, else
``$XDG_CONFIG_HOME/hpkv/hpkv.yaml`` (``~/.config/hpkv/hpkv.yaml``).

Top-level scalar keys (``cluster``, ``region``, ...) have environment variables ``HPKV_CLUSTER``,
``HPKV_REGION``...; section keys use a double underscore: ``HPKV_CURVINE__CHART_VERSION`` sets
``curvine.chartVersion``. Values are parsed as YAML scalars.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpkv.config.schema import GLOBAL_KEYS, defaults, validate
from hpkv.errors import ConfigError

CONFIG_FILENAME = "hpkv.yaml"
ENV_PREFIX = "HPKV_"
# Variables that configure hpkv itself rather than hpkv.yaml keys.
_NON_CONFIG_ENV = {
    "HPKV_CONFIG",
    "HPKV_DEBUG",
    "HPKV_POLL_INTERVAL",
    "HPKV_AWS_RETRY_MODE",
    "HPKV_AWS_READ_TIMEOUT",
    "HPKV_INCLUSTER_ROUTES",
    "HPKV_POD_ROUTES",
    "HPKV_POD_LOGS_DIR",
    "HPKV_BENCH_RESOLVE",
    "HPKV_SHARED_DIR",
    "HPKV_HARNESS_DIR",
}


def user_config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "hpkv"


def find_config_file(explicit: str | None) -> Path | None:
    """The config file to read, or None. An explicit path must exist."""
    if explicit:
        path = Path(explicit).expanduser()
        if path.is_dir():
            raise ConfigError(
                f"config file {explicit} is a directory",
                fix=f"pass the YAML file itself, e.g. --config {Path(explicit) / CONFIG_FILENAME}",
            )
        if not path.is_file():
            raise ConfigError(
                f"config file {explicit} does not exist",
                fix="pass an existing file to --config, or run 'hpkv init' to write one",
            )
        return path
    for candidate in (Path.cwd() / CONFIG_FILENAME, user_config_dir() / CONFIG_FILENAME):
        if candidate.is_file():
            return candidate
    return None


def read_config_file(path: Path) -> dict[str, Any]:
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot read config file {path}: {exc.strerror or exc}",
            fix="check the path and its permissions",
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(
            f"config file {path} is not UTF-8 text", fix="save it as UTF-8 YAML"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(
            f"config file {path} is not valid YAML{where}: {problem}",
            fix="fix the YAML syntax (check indentation and quoting)",
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {path} must be a YAML mapping, found {type(data).__name__}",
            fix="start the file with keys such as 'cluster: my-hyperpod-cluster'",
        )
    return data


def _camel(snake: str) -> str:
    head, *rest = snake.lower().split("_")
    return head + "".join(part.capitalize() for part in rest)


def _parse_scalar(raw: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        return raw


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """Translate HPKV_* variables into a nested config mapping."""
    result: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or name in _NON_CONFIG_ENV:
            continue
        path = [_camel(part) for part in name[len(ENV_PREFIX) :].split("__") if part]
        if not path:
            continue
        if len(path) == 1 and path[0] not in GLOBAL_KEYS:
            # A single-level name that is not a known top-level key: leave it for the schema to
            # report, naming the variable.
            pass
        node = result
        for key in path[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ConfigError(
                    f"environment variable {name} conflicts with another HPKV_ variable",
                    fix=f"unset {name} or the conflicting variable",
                )
        value = _parse_scalar(raw)
        if path[-1] in GLOBAL_KEYS and len(path) == 1 and not isinstance(value, (dict, list)):
            value = raw if GLOBAL_KEYS[path[-1]] == "string" else value
        node[path[-1]] = value
    return result


def deep_merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


@dataclass
class Settings:
    """The resolved configuration of one hpkv invocation."""

    data: dict[str, Any]
    source: Path | None = None
    # Which top-level keys came from flags (for messages that say where a value came from).
    from_flags: set[str] = field(default_factory=set)

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    @property
    def cluster(self) -> str | None:
        return self.data.get("cluster")

    @property
    def region(self) -> str | None:
        return self.data.get("region")

    @property
    def profile(self) -> str | None:
        return self.data.get("profile")

    @property
    def kubeconfig(self) -> str | None:
        return self.data.get("kubeconfig")

    @property
    def context(self) -> str | None:
        return self.data.get("context")

    def section(self, name: str) -> dict[str, Any]:
        """A stage section with defaults filled in (a copy: callers may modify it)."""
        return copy.deepcopy(self.data.get(name) or {})


def load_settings(
    *,
    config_path: str | None = None,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    read_file: bool = True,
) -> Settings:
    """Load, merge and validate configuration. Raises ConfigError with a one-line cause+fix.

    ``read_file=False`` ignores every config file (``hpkv init``, which writes one).
    """
    environ = os.environ if environ is None else environ
    explicit = config_path or environ.get("HPKV_CONFIG")
    path = find_config_file(explicit) if read_file else None
    file_data = read_config_file(path) if path else {}
    where = str(path) if path else "configuration"
    validate(file_data, where=where, partial=True)
    env_data = env_overrides(environ)
    validate(env_data, where="HPKV_* environment variables", partial=True, env=True)
    flag_data = {k: v for k, v in (flags or {}).items() if v is not None}
    validate(flag_data, where="command line", partial=True, flags=True)
    merged = deep_merge(deep_merge(deep_merge(defaults(), file_data), env_data), flag_data)
    validate(merged, where=where, partial=False)
    return Settings(data=merged, source=path, from_flags=set(flag_data))


_SECRET_KEY = re.compile(r"(secret|token|password|passwd|credential|apikey|api_key)", re.I)


def redact(data: Any) -> Any:
    """A copy of a config mapping with values of secret-looking keys replaced."""
    if isinstance(data, Mapping):
        return {
            k: ("<redacted>" if _SECRET_KEY.search(str(k)) and v not in (None, "") else redact(v))
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [redact(v) for v in data]
    return data
