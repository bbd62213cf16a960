"""``Request`` stands for the tuple ``(variant, ids)`` and hashes its ids once.

The behaviour tests run on both implementations: the C type (used where the extension
was built) and the Python class it replaces.
"""

import gc
import pickle
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.extension_copy import run_without_extension

from genlm.core import _request, _validation
from genlm.core.backend import OutputCache, Request, key_nbytes
from genlm.core.mock import MockLM

IMPLEMENTATIONS = [_request._PyRequest] + [Request] * (Request is not _request._PyRequest)
implementations = pytest.mark.parametrize(
    "impl", IMPLEMENTATIONS, ids=lambda impl: "python" if impl is _request._PyRequest else "c"
)

variants = st.sampled_from([None, "adapter", ("tuple", "variant")])
# Ids from 1000 up are distinct int objects: summed getsizeof is the memory a key holds.
ids = st.lists(st.integers(1000, 10**6), min_size=1, max_size=40).map(tuple)


@implementations
@given(variant=variants, ids=ids)
def test_a_request_behaves_as_its_tuple(impl, variant, ids):
    """Unpacking, indexing, slicing, len, equality both ways, hash, dict lookups both ways,
    pickling: what the tuple ``(variant, ids)`` gives."""
    Request = impl  # noqa: N806 - the implementation under test
    request, pair = Request(variant, ids), (variant, ids)
    assert tuple(request) == pair and len(request) == 2
    assert (request[0], request[1], request[-1], request[:1]) == (variant, ids, ids, (variant,))
    assert request == pair and pair == request and not request != pair
    assert request == Request(variant, ids) and hash(request) == hash(pair)
    assert {pair: 1}[request] == 1 and {request: 2}[pair] == 2
    assert request != (variant, ids + (1,)) and request != Request("other", ids)
    assert pickle.loads(pickle.dumps(request)) == request
    assert repr(request) == f"Request(variant={variant!r}, ids={ids!r})"


def test_request_is_the_c_type_where_the_extension_was_built():
    """``_ids`` holds both the C validation pass and the C ``Request``: with one, the other."""
    assert (Request is not _request._PyRequest) == (_validation._first_doubt is not None)


@pytest.mark.parametrize("ids_file", ["absent", "damaged"])
def test_an_ids_extension_that_fails_to_load_is_reported_and_python_does_the_work(
    ids_file, tmp_path
):
    """A copy of genlm.core without ``_ids`` checks contexts in Python, silently (no
    compiler is an expected install); one whose ``_ids`` file is there but cannot load (in
    the field, a wheel built for a newer glibc) also works in Python, and warns once at
    import with the loader's own error, so a user learns why every call is slower."""
    script = """
from genlm.core import InvalidContextError, _model, _request, _validation
from genlm.core.mock import MockLM
lm = MockLM([bytes([b]) for b in range(8)])
request = lm.validate_request([1, 2])
assert type(request) is _request._PyRequest and request == (request[0], (1, 2))
assert _model._make_request is None and _validation._first_doubt is None
try:
    lm.validate_request([1, 8])
except InvalidContextError as exc:
    print("REFUSED", exc)
lm.close()
"""
    lines, log = run_without_extension(tmp_path, "_ids", ids_file, script)
    assert "8" in lines["REFUSED"]  # the out-of-range id, named by the Python checks
    if ids_file == "absent":
        assert "No module named 'genlm.core._ids'" in lines["CAUSE"]
        assert "WARNING" not in log
    else:
        cause = lines["CAUSE"]
        assert cause and "No module named" not in cause
        [warning] = [line for line in log.splitlines() if line.startswith("WARNING")]
        assert "(genlm.core._ids) is installed but failed to load" in warning
        assert cause in warning and "not built" not in warning


@implementations
def test_bad_arguments_fail_as_in_python(impl):
    """Both implementations refuse a missing part and an unhashable variant alike."""
    with pytest.raises(TypeError):
        impl(None)
    with pytest.raises(TypeError, match="unhashable"):
        impl(["a", "list"], (1, 2))
    assert impl(ids=(1,), variant="v") == ("v", (1,))


def test_the_c_request_is_not_tracked_by_the_garbage_collector():
    """The output cache holds one request per row; the collector must not walk them."""
    if Request is _request._PyRequest:
        pytest.skip("genlm.core._ids not compiled")
    request = Request(None, (1, 2))
    assert not gc.is_tracked(request)
    with pytest.raises(AttributeError):
        request.ids = (3,)  # a key's parts never change under its hash


@given(variant=st.sampled_from([None, "adapter"]), ids=ids)
def test_key_bytes_count_what_a_request_holds(variant, ids):
    """key_nbytes of a request is the memory of its objects, summed independently, and
    the tuple's count with the tuple's own size swapped for the request's."""
    request = Request(variant, ids)
    assert key_nbytes(request) == sum(map(sys.getsizeof, [request, variant, ids, *ids]))
    pair = (variant, ids)
    assert key_nbytes(request) == key_nbytes(pair) - sys.getsizeof(pair) + sys.getsizeof(request)


class CountedIds(tuple):
    """Token ids that count how often they are hashed."""

    hashes = 0

    def __hash__(self):
        CountedIds.hashes += 1
        return tuple.__hash__(self)


@implementations
def test_the_ids_are_hashed_once_through_cache_and_scheduler(impl):
    """A request's ids are hashed when it is made, never again: not by the cache's lookup
    and store, nor by the scheduler's dedup map."""
    CountedIds.hashes = 0
    request = impl(None, CountedIds((1, 2, 3)))
    assert CountedIds.hashes == 1
    cache = OutputCache()
    assert cache.get(request) is None
    cache.put_many([request], [np.zeros(4, dtype=np.float32)])
    assert cache.get_many([request])[0] is not None
    lm = MockLM([bytes([b]) for b in range(8)])
    try:
        assert lm.batcher.run_sync([request, request])[0].shape == (8,)
    finally:
        lm.close()
    assert CountedIds.hashes == 1
