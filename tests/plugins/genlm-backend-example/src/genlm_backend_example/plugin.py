"""Entry point module: cheap to import, registers the ``example`` backend."""

from genlm.core.backend import BackendSpec
from genlm.core.hookspecs import hookimpl


@hookimpl
def genlm_register_backends(register):
    register(
        BackendSpec(
            name="example",
            loader="genlm_backend_example.model:BigramLM.from_name",
            distribution="genlm-backend-example",
            plugin_api=1,
            priority=1,
            description="a bigram model over the 256 bytes (example plugin)",
        )
    )
