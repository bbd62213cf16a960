"""GenLM core: fast, batched, cached next-token log-probabilities on any engine."""

import importlib.metadata as _metadata

from genlm.core._errors import (
    BackendNotFoundError,
    BackendUnavailableError,
    GenLMError,
    InvalidContextError,
    ModelClosedError,
    PluginLoadError,
    VocabularyMismatchError,
)
from genlm.core._model import BatchedLM
from genlm.core._models import DEFAULT_MODEL, resolve_model_path
from genlm.core._output_cache import OutputCache
from genlm.core._prefix_cache import PrefixCache, PrefixHit
from genlm.core._protocol import AsyncLM
from genlm.core._registry import BackendSpec, Registry, get_registry, load_model_by_name
from genlm.core._scheduler import AutoBatcher
from genlm.core._vocab import Vocabulary, decode_vocab
from genlm.core._worker import ModelWorker

try:
    __version__ = _metadata.version("genlm-core")
except _metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "DEFAULT_MODEL",
    "AsyncLM",
    "AutoBatcher",
    "BackendNotFoundError",
    "BackendSpec",
    "BackendUnavailableError",
    "BatchedLM",
    "GenLMError",
    "InvalidContextError",
    "ModelClosedError",
    "ModelWorker",
    "OutputCache",
    "PluginLoadError",
    "PrefixCache",
    "PrefixHit",
    "Registry",
    "VocabularyMismatchError",
    "Vocabulary",
    "decode_vocab",
    "get_registry",
    "load_model_by_name",
    "resolve_model_path",
]
