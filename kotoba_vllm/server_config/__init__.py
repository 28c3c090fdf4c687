"""The effective serving configuration, as the servers report it (issue 32).

    [cfg] = server_configs(["http://127.0.0.1:8080"])
    cfg.get("context-per-slot")      # ConfigField: value, source (endpoint and key), meaning
    print(pretty(cfg.to_edn()))

Pure core: `_read` (answers -> `ServerConfig`, tables of which engine says what where). Shells:
`_fetch` (sync threads / async gather). `Client.server_config()` and `python -m kotoba_vllm inspect`
are built on them.
"""

from ._fetch import CONFIG_TIMEOUT, aserver_configs, server_configs
from ._model import NOT_REPORTED, REPORTED, UNMEASURED, UNREPORTED, ConfigField, Probe, ServerConfig, Source
from ._read import (CONFIG_PATHS, FIELD_NAMES, FIELDS, READS, config_paths, is_secret_key, read_config,
                    redact_secrets, redacted_body, unmeasured_config)

__all__ = [
    "CONFIG_PATHS", "CONFIG_TIMEOUT", "ConfigField", "FIELDS", "FIELD_NAMES", "NOT_REPORTED", "Probe", "READS",
    "REPORTED", "ServerConfig", "Source", "UNMEASURED", "UNREPORTED", "aserver_configs", "config_paths",
    "is_secret_key", "read_config", "redact_secrets", "redacted_body", "server_configs", "unmeasured_config",
]
