"""GenLM core: fast, batched, cached next-token log-probabilities on any engine.

Public names load lazily (module ``__getattr__``), so ``import genlm.core`` and the
``genlm`` CLI start fast; numpy and asyncio load with the first name that needs them.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from genlm.core._lazy import lazy_exports as _lazy_exports

#: Public name -> the private module defining it.
_EXPORTS = {
    "AsyncLM": "_protocol",
    "AsyncTokenByteTrie": "_async_trie",
    "EOS_EDGE": "_trie",
    "TokenByteTrie": "_trie",
    "AutoBatcher": "_scheduler",
    "BackendError": "_errors",
    "BackendNotFoundError": "_errors",
    "BackendSpec": "_backend_spec",
    "BackendUnavailableError": "_errors",
    "BatchedLM": "_model",
    "DEFAULT_MODEL": "_embedded",
    "GenLMError": "_errors",
    "InvalidContextError": "_errors",
    "ModelClosedError": "_errors",
    "ModelWorker": "_worker",
    "OutputCache": "_output_cache",
    "PLUGIN_API": "_plugin_api",
    "PluginLoadError": "_errors",
    "PrefixCache": "_prefix_cache",
    "PrefixHit": "_prefix_cache",
    "Registry": "_registry",
    "ResidentRows": "_row_plan",
    "RowPlan": "_row_plan",
    "Vocabulary": "_vocab",
    "VocabularyMismatchError": "_errors",
    "decode_vocab": "_vocab",
    "get_registry": "_registry",
    "group_equal": "_row_plan",
    "group_padded": "_row_plan",
    "lazy_exports": "_lazy",
    "load_model_by_name": "_registry",
    "plan_rows": "_row_plan",
    "resolve_model_path": "_embedded",
    "set_trie_pool_limit": "_trie",
    "check_sampling_args": "_sampling",
    "check_temperature": "_sampling",
    "validate_context": "_model",
}

__all__ = [
    "EOS_EDGE",
    "AsyncLM",
    "AsyncTokenByteTrie",
    "AutoBatcher",
    "BackendError",
    "BackendNotFoundError",
    "BackendSpec",
    "BackendUnavailableError",
    "BatchedLM",
    "DEFAULT_MODEL",
    "GenLMError",
    "InvalidContextError",
    "ModelClosedError",
    "ModelWorker",
    "OutputCache",
    "PLUGIN_API",
    "PluginLoadError",
    "PrefixCache",
    "PrefixHit",
    "Registry",
    "ResidentRows",
    "RowPlan",
    "TokenByteTrie",
    "Vocabulary",
    "VocabularyMismatchError",
    "decode_vocab",
    "get_registry",
    "group_equal",
    "group_padded",
    "lazy_exports",
    "load_model_by_name",
    "plan_rows",
    "resolve_model_path",
    "set_trie_pool_limit",
    "check_sampling_args",
    "check_temperature",
    "validate_context",
]


__getattr__, __dir__ = _lazy_exports(__name__, "genlm-core", _EXPORTS)


if _TYPE_CHECKING:
    from genlm.core._async_trie import AsyncTokenByteTrie
    from genlm.core._backend_spec import BackendSpec
    from genlm.core._embedded import DEFAULT_MODEL, resolve_model_path
    from genlm.core._errors import (
        BackendError,
        BackendNotFoundError,
        BackendUnavailableError,
        GenLMError,
        InvalidContextError,
        ModelClosedError,
        PluginLoadError,
        VocabularyMismatchError,
    )
    from genlm.core._lazy import lazy_exports
    from genlm.core._model import BatchedLM, validate_context
    from genlm.core._output_cache import OutputCache
    from genlm.core._plugin_api import PLUGIN_API
    from genlm.core._prefix_cache import PrefixCache, PrefixHit
    from genlm.core._protocol import AsyncLM
    from genlm.core._registry import Registry, get_registry, load_model_by_name
    from genlm.core._row_plan import (
        ResidentRows,
        RowPlan,
        group_equal,
        group_padded,
        plan_rows,
    )
    from genlm.core._sampling import check_sampling_args, check_temperature
    from genlm.core._scheduler import AutoBatcher
    from genlm.core._trie import EOS_EDGE, TokenByteTrie, set_trie_pool_limit
    from genlm.core._vocab import Vocabulary, decode_vocab
    from genlm.core._worker import ModelWorker
