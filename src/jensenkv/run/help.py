"""``--help``'s field docs live in ``jensenkv.config_help``; imported here as before."""
from jensenkv.config_help import *  # noqa: F401,F403
from jensenkv.config_help import register_help_resolver, schema_fields  # noqa: F401
