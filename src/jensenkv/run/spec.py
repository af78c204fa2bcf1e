"""The run's specification lives in ``jensenkv.spec`` (a layer the reports may read); imported here as before."""
from jensenkv.spec import (CONFIG_DIR, CONFIG_GROUPS, RunSpec, build_spec, compose_config,  # noqa: F401
                           field_error_line, resolve, unknown_schema_key)
