"""Declares a plugin API newer than genlm-core serves, like a plugin built for a later core."""

from genlm.core.backend import BackendSpec
from genlm.core.hookspecs import hookimpl

#: The API this plugin claims to be built for: one past any genlm-core released so far.
BUILT_FOR = 2


@hookimpl
def genlm_register_backends(register):
    register(
        BackendSpec(
            name="future",
            loader="genlm.core.mock:MockLM.from_name",
            distribution="genlm-backend-future",
            plugin_api=BUILT_FOR,
            description="a mock backend built for a future plugin API (never loaded)",
        )
    )
