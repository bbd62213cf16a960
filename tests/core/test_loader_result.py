"""A loader that returns something other than a model is a clear error (issue #21)."""

import pytest
from support.plugins import plugin_module

from genlm.core import AsyncLM, BackendError, _registry
from genlm.core.backend import PLUGIN_API, BackendSpec, Registry
from genlm.core.cli import main
from genlm.core.mock import MockLM


class HalfModel:
    """Has two of the protocol's methods only."""

    async def next_token_logprobs(self, token_ids):
        return None

    def clear_cache(self):
        pass


@pytest.fixture
def weird_registry(monkeypatch):
    """A registry whose backend "weird" (plugin "weird-plugin", distribution
    "genlm-backend-weird") has a loader that returns whatever the test sets."""
    returned = {}
    monkeypatch.setattr(MockLM, "from_name", lambda model, **opts: returned["value"])
    spec = BackendSpec(
        name="weird",
        loader="genlm.core.mock:MockLM.from_name",
        distribution="genlm-backend-weird",
        plugin_api=PLUGIN_API,
        auto_select=True,
    )
    registry = Registry()
    registry.register_plugins([("weird-plugin", "genlm-backend-weird", plugin_module("w", spec))])
    monkeypatch.setattr(_registry, "_registry", registry)
    return registry, returned


@pytest.mark.parametrize("backend", ["weird", None])
@pytest.mark.parametrize(
    ("value", "shown"), [(None, "None (NoneType)"), ({"rows": 1}, "{'rows': 1} (dict)")]
)
def test_a_loader_returning_a_non_model_is_a_backend_error_naming_the_plugin(
    weird_registry, backend, value, shown
):
    """Named or auto-selected, the error names the backend, plugin, distribution, loader,
    the returned value and what it lacks (it used to be returned as the model)."""
    registry, returned = weird_registry
    returned["value"] = value
    with pytest.raises(BackendError) as error:
        registry.load_model("m", backend)
    message = str(error.value)
    assert message.startswith(
        "backend 'weird' (plugin 'weird-plugin', distribution genlm-backend-weird): its loader "
        f"genlm.core.mock:MockLM.from_name returned {shown}, which is not a model"
    )
    assert "lacks vocab, byte_vocab, tokenizer, next_token_logprobs" in message


def test_what_a_half_model_lacks_is_listed(weird_registry):
    """Every protocol member the returned object lacks is listed, and only those."""
    registry, returned = weird_registry
    returned["value"] = HalfModel()
    with pytest.raises(BackendError) as error:
        registry.load_model("m", "weird")
    lacks = str(error.value).split("it lacks ")[1].removesuffix(" of genlm.core.AsyncLM")
    expected = {
        name
        for name in dir(MockLM)
        if (not name.startswith("_") or name in ("__aenter__", "__aexit__"))
        and hasattr(AsyncLM, name)
        and not hasattr(HalfModel, name)
    }
    assert set(lacks.split(", ")) == expected


def test_a_real_model_passes(weird_registry):
    """A MockLM is returned as it is."""
    registry, returned = weird_registry
    returned["value"] = lm = MockLM([b"a", b"b"])
    assert registry.load_model("m", "weird") is lm
    lm.close()


def test_the_cli_reports_it_in_one_line(weird_registry, capsys):
    """`genlm smc --backend weird` ends with one stderr line naming the plugin."""
    _, returned = weird_registry
    returned["value"] = 42
    assert main(["smc", "hi", "--backend", "weird", "--model", "stories260K"]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "plugin 'weird-plugin'" in line and "returned 42 (int)" in line
