"""The public interface for backend authors: what a GenLM backend plugin builds on.

:mod:`genlm.core` is the user API (load a model, its vocabulary, the token-byte tries, the
error types). This module holds what a backend and the packages built on core use besides:
the base class :class:`BatchedLM` and its hooks (``_logprobs_batch``, ``_variant``,
``_served_variants``, ``_check_variant``, ``_clear_backend_cache``, ``_close_backend``),
the mixin of a backend with named LoRA adapters (:class:`LoraAdapters`, its
:class:`AdapterTable`), the request check :meth:`BatchedLM.validate_request` and the
``Request`` it returns, the worker thread (and ``Requeue``, a long call's way to let
others through), the scheduler, the caches and the byte-bounded LRU under them, the row
planner for KV reuse, the plugin registry, ``BackendSpec``, the plugin API version it
declares (``PLUGIN_API``) and ``backend_hook`` (a plugin's registration hook made from its
specs), and small helpers (``is_torch``, ``check_real``, ``float64_weights``, ``compact_row``,
``resolve_model_path``, the sampler and its argument checks, ``gather_all``,
``lazy_exports`` and ``type_checking_exports``). Command plugins use :mod:`genlm.core.cli`
(``Command``, ``command_hook``) and :mod:`genlm.core.hookspecs`. A distribution other than
genlm-core uses only these public modules, never a ``genlm.core._private`` one
(``tests/test_private_access.py`` checks).

Names load lazily, as in :mod:`genlm.core`: a backend's plugin module imports
``BackendSpec`` from here without loading numpy, and nothing here imports torch.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from genlm.core._lazy import lazy_exports as _lazy_exports
from genlm.core._lazy import type_checking_exports as _type_checking_exports

# The public names, stated once (``X as X`` marks a re-export): read statically by type
# checkers and the API reference, and at import for the lazy ``__getattr__``.
if _TYPE_CHECKING:
    from genlm.core._adapters import AdapterTable as AdapterTable
    from genlm.core._adapters import LoraAdapters as LoraAdapters
    from genlm.core._backend_spec import BackendSpec as BackendSpec
    from genlm.core._embedded import resolve_model_path as resolve_model_path
    from genlm.core._gather import gather_all as gather_all
    from genlm.core._lazy import lazy_exports as lazy_exports
    from genlm.core._lazy import type_checking_exports as type_checking_exports
    from genlm.core._lru import Block as Block
    from genlm.core._lru import ByteLRU as ByteLRU
    from genlm.core._lru import key_nbytes as key_nbytes
    from genlm.core._model import CURRENT_VARIANT as CURRENT_VARIANT
    from genlm.core._model import BatchedLM as BatchedLM
    from genlm.core._output_cache import OutputCache as OutputCache
    from genlm.core._plugin_api import PLUGIN_API as PLUGIN_API
    from genlm.core._plugin_hooks import backend_hook as backend_hook
    from genlm.core._prefix_cache import PrefixCache as PrefixCache
    from genlm.core._prefix_cache import PrefixHit as PrefixHit
    from genlm.core._registry import Registry as Registry
    from genlm.core._registry import get_registry as get_registry
    from genlm.core._request import Request as Request
    from genlm.core._row_plan import ResidentRows as ResidentRows
    from genlm.core._row_plan import RowPlan as RowPlan
    from genlm.core._row_plan import group_equal as group_equal
    from genlm.core._row_plan import group_padded as group_padded
    from genlm.core._row_plan import plan_rows as plan_rows
    from genlm.core._rows import BatchRows as BatchRows
    from genlm.core._rows import check_real as check_real
    from genlm.core._rows import compact_row as compact_row
    from genlm.core._rows import is_torch as is_torch
    from genlm.core._sampling import check_sampling_args as check_sampling_args
    from genlm.core._sampling import check_temperature as check_temperature
    from genlm.core._sampling import eos_id_set as eos_id_set
    from genlm.core._sampling import sample_token as sample_token
    from genlm.core._sampling import seeded_rng as seeded_rng
    from genlm.core._scheduler import AutoBatcher as AutoBatcher
    from genlm.core._trie import float64_weights as float64_weights
    from genlm.core._validation import check_token_bytes as check_token_bytes
    from genlm.core._validation import checked_count as checked_count
    from genlm.core._validation import checked_seconds as checked_seconds
    from genlm.core._validation import validate_context as validate_context
    from genlm.core._worker import ModelWorker as ModelWorker
    from genlm.core._worker import Requeue as Requeue

_EXPORTS = _type_checking_exports(__file__)

__all__ = list(_EXPORTS)

__getattr__, __dir__ = _lazy_exports(__name__, "genlm-core", _EXPORTS)
