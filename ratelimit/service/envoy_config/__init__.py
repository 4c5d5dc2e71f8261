"""envoyproxy/ratelimit's configuration, read as it is: a directory of YAML files of domains
and nested descriptors (:func:`~.files.load_directory`), matched as its ``GetLimit`` matches
(:meth:`~.descriptors.EnvoyConfig.limit_of`), with its load errors in its words."""

from ratelimit.service.envoy_config.descriptors import UNITS, EnvoyConfig, EnvoyLimit, Matched
from ratelimit.service.envoy_config.files import check_directory, load_directory
from ratelimit.service.envoy_config.yaml_go import ConfigFileError

__all__ = [
    "UNITS",
    "ConfigFileError",
    "EnvoyConfig",
    "EnvoyLimit",
    "Matched",
    "check_directory",
    "load_directory",
]
