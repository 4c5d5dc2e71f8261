"""envoyproxy/ratelimit's configuration, read as it is: the YAML files of domains and nested
descriptors its service reads (:func:`~.files.load_runtime`, its runtime directories) or its
check command reads (:func:`~.files.load_directory`), matched as its ``GetLimit`` matches
(:meth:`~.descriptors.EnvoyConfig.limit_of`), with its load errors in its words."""

from ratelimit.service.envoy_config.descriptors import UNITS, EnvoyConfig, EnvoyLimit, Matched
from ratelimit.service.envoy_config.files import (
    RuntimeFile,
    check_directory,
    load_directory,
    load_runtime,
    runtime_files,
)
from ratelimit.service.envoy_config.yaml_go import ConfigFileError

__all__ = [
    "UNITS",
    "ConfigFileError",
    "EnvoyConfig",
    "EnvoyLimit",
    "Matched",
    "RuntimeFile",
    "check_directory",
    "load_directory",
    "load_runtime",
    "runtime_files",
]
