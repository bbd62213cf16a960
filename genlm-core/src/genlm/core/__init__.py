"""GenLM core: fast, batched, cached next-token log-probabilities on any engine.

This is the user API: load a model (:func:`load_model_by_name`, which returns an
:class:`AsyncLM`), its byte :class:`Vocabulary`, the token-byte tries, and the error
types. What backends and packages built on core use besides (``BatchedLM``, the
scheduler, the caches, the plugin registry) is in :mod:`genlm.core.backend`.

Public names load lazily (module ``__getattr__``), so ``import genlm.core`` and the
``genlm`` CLI start fast; numpy and asyncio load with the first name that needs them.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from genlm.core._lazy import lazy_exports as _lazy_exports
from genlm.core._lazy import type_checking_exports as _type_checking_exports

# The public names, stated once (``X as X`` marks a re-export): read statically by type
# checkers and the API reference, and at import for the lazy ``__getattr__``.
if _TYPE_CHECKING:
    from genlm.core._async_trie import AsyncTokenByteTrie as AsyncTokenByteTrie
    from genlm.core._embedded import DEFAULT_MODEL as DEFAULT_MODEL
    from genlm.core._errors import BackendError as BackendError
    from genlm.core._errors import BackendNotFoundError as BackendNotFoundError
    from genlm.core._errors import BackendUnavailableError as BackendUnavailableError
    from genlm.core._errors import GenLMError as GenLMError
    from genlm.core._errors import InvalidContextError as InvalidContextError
    from genlm.core._errors import ModelClosedError as ModelClosedError
    from genlm.core._errors import PluginLoadError as PluginLoadError
    from genlm.core._errors import UnknownVariantError as UnknownVariantError
    from genlm.core._errors import VocabularyMismatchError as VocabularyMismatchError
    from genlm.core._protocol import AsyncLM as AsyncLM
    from genlm.core._registry import load_model_by_name as load_model_by_name
    from genlm.core._trie import EOS_EDGE as EOS_EDGE
    from genlm.core._trie import TokenByteTrie as TokenByteTrie
    from genlm.core._trie import set_trie_pool_limit as set_trie_pool_limit
    from genlm.core._vocab import Vocabulary as Vocabulary

_EXPORTS = _type_checking_exports(__file__)

__all__ = list(_EXPORTS)

__getattr__, __dir__ = _lazy_exports(__name__, "genlm-core", _EXPORTS)
