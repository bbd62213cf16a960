/*
 * The two steps every request takes on the event loop's thread, in C: checking its
 * context and making its Request.
 *
 * first_doubt: the common case of context validation, a tuple of exact Python ints,
 * each in [0, vocab_size). In Python the type check (a pass of type() over the ids) and
 * the range check (a set lookup per id) cost about 1.5 us for a 65-token context, the
 * largest share of GenLM's own work per request; this one pass costs about a tenth of
 * that. It only answers "all fine" or where the first doubt is: validate_context's
 * Python path then converts numpy integers or raises the error naming the problem, so
 * both paths accept and reject the same inputs (tests/core/test_faults.py compares them).
 *
 * Request: the validated (variant, ids) of one request, with its hash computed once
 * (see _request.py, whose Python class it replaces and is tested against). In C it is
 * made in a tenth of the Python class's time and hashed without a Python call (a request
 * is hashed five times), and it is not tracked by the garbage collector: the output
 * cache holds one per row, and as Python objects they made every full collection walk
 * the whole cache (a fifth of a step's time at 64 particles, measured with py-spy). A
 * request refers only to its variant and its ids, so it cannot close a reference cycle.
 *
 * make_request: both in one pass for the common case (a list or tuple of valid ids),
 * hashing each id as it is checked. Checking, copying and hashing a context's ids were a
 * sixth of a batch call's instructions at 65 ids, and grow with the context; through
 * the limited API each id costs two calls to read, so reading it once halves that. The
 * hash is CPython's tuple hash (hash((variant, ids)), which a lookup by tuple needs),
 * computed from the ids' own hashes (an int below 2**61 - 1 hashes to itself); the
 * module checks at import that it equals Python's own on sample tuples, and hashes
 * through Python where it does not (another CPython's tuple hash).
 */
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x030B0000 /* the stable ABI of CPython 3.11+: one build for all */
#include <Python.h>

#if SIZEOF_VOID_P == 8
#define XXPRIME_1 ((Py_uhash_t)11400714785074694791ULL)
#define XXPRIME_2 ((Py_uhash_t)14029467366897019727ULL)
#define XXPRIME_5 ((Py_uhash_t)2870177450012600261ULL)
#define XXROTATE(x) ((x << 31) | (x >> 33))
#define HASH_MODULUS (((long long)1 << 61) - 1) /* an int in [0, HASH_MODULUS) hashes to itself */
#define FAST_HASH_POSSIBLE 1
#else
#define FAST_HASH_POSSIBLE 0
#endif

/* Whether tuple_hash_step below gives CPython's own tuple hash (checked at import). */
static int fast_hash_ok = 0;

#if FAST_HASH_POSSIBLE
static inline Py_uhash_t tuple_hash_step(Py_uhash_t acc, Py_uhash_t lane)
{
    acc += lane * XXPRIME_2;
    acc = XXROTATE(acc);
    return acc * XXPRIME_1;
}

static inline Py_hash_t tuple_hash_end(Py_uhash_t acc, Py_ssize_t len)
{
    acc += (Py_uhash_t)len ^ (XXPRIME_5 ^ 3527539UL);
    return acc == (Py_uhash_t)-1 ? 1546275796 : (Py_hash_t)acc;
}
#endif

/* The position of the first of the n items of `ids` (a tuple, or with is_tuple 0 a list)
 * that is not an exact int in [0, vocab_size), or -1 when there is none. With `acc`, it
 * also folds each id into a tuple hash as it is read (an id below HASH_MODULUS hashes to
 * itself; make_request uses it only then). */
static Py_ssize_t scan_ids(PyObject *ids, int is_tuple, Py_ssize_t n, long long vocab_size,
                           Py_uhash_t *acc)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        /* borrowed; i is in range */
        PyObject *item = is_tuple ? PyTuple_GetItem(ids, i) : PyList_GetItem(ids, i);
        if (!PyLong_CheckExact(item))
            return i;
        int overflow;
        long long id = PyLong_AsLongLongAndOverflow(item, &overflow);
        if (overflow || id < 0 || id >= vocab_size)
            return i;
#if FAST_HASH_POSSIBLE
        if (acc != NULL)
            *acc = tuple_hash_step(*acc, (Py_uhash_t)id);
#else
        (void)acc;
#endif
    }
    return -1;
}

/* Untrack a tuple of ints from the collector. It cannot close a reference cycle: the
 * collector would untrack it itself, but only after walking all its items in a collection
 * while it is young. (Not a subclass: its instances may hold other references.) */
static void untrack_ints(PyObject *ids)
{
    if (PyTuple_CheckExact(ids) && PyObject_GC_IsTracked(ids))
        PyObject_GC_UnTrack(ids);
}

PyDoc_STRVAR(first_doubt_doc,
             "first_doubt(ids: tuple, vocab_size: int) -> int\n\n"
             "The position of the first item of ``ids`` that is not an exact int in\n"
             "``[0, vocab_size)`` (a bool, a numpy integer, anything else, or out of\n"
             "range), or -1 when there is none (and then ``ids`` is untracked by the\n"
             "garbage collector, as a collection would do).");

static PyObject *first_doubt(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2 || !PyTuple_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "first_doubt(ids: tuple, vocab_size: int)");
        return NULL;
    }
    long long vocab_size = PyLong_AsLongLong(args[1]);
    if (vocab_size == -1 && PyErr_Occurred())
        return NULL;
    PyObject *ids = args[0];
    Py_ssize_t doubt = scan_ids(ids, 1, PyTuple_Size(ids), vocab_size, NULL);
    if (doubt >= 0)
        return PyLong_FromSsize_t(doubt);
    untrack_ints(ids);
    return PyLong_FromLong(-1);
}


/* ---- Request ---------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *variant;
    PyObject *ids;
    Py_hash_t hash;
} Request;

static PyTypeObject *request_type; /* set once by PyInit__ids; the module is never unloaded */

/* Python's hash of the tuple (variant, ids), which a lookup by tuple needs; -1 on error. */
static Py_hash_t pair_hash(PyObject *variant, PyObject *ids)
{
    PyObject *pair = PyTuple_Pack(2, variant, ids);
    if (pair == NULL)
        return -1;
    Py_hash_t hash = PyObject_Hash(pair);
    Py_DECREF(pair);
    return hash;
}

/* A new Request of `type` holding new references to `variant` and `ids`. */
static PyObject *request_alloc(PyTypeObject *type, PyObject *variant, PyObject *ids,
                               Py_hash_t hash)
{
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    Request *self = (Request *)alloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_INCREF(variant);
    Py_INCREF(ids);
    self->variant = variant;
    self->ids = ids;
    self->hash = hash;
    return (PyObject *)self;
}

static PyObject *request_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"variant", "ids", NULL};
    PyObject *variant, *ids;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:Request", names, &variant, &ids))
        return NULL;
    Py_hash_t hash = pair_hash(variant, ids);
    return hash == -1 ? NULL : request_alloc(type, variant, ids, hash);
}

static void request_dealloc(PyObject *obj)
{
    Request *self = (Request *)obj;
    PyTypeObject *type = Py_TYPE(obj);
    Py_DECREF(self->variant);
    Py_DECREF(self->ids);
    freefunc free_ = (freefunc)PyType_GetSlot(type, Py_tp_free);
    free_(obj);
    Py_DECREF(type); /* instances of a heap type hold a reference to it */
}

static PyObject *request_pair(Request *self)
{
    return PyTuple_Pack(2, self->variant, self->ids);
}

static Py_hash_t request_hash(PyObject *self)
{
    return ((Request *)self)->hash;
}

static PyObject *request_richcompare(PyObject *obj, PyObject *other, int op)
{
    Request *self = (Request *)obj;
    if (op != Py_EQ && op != Py_NE)
        Py_RETURN_NOTIMPLEMENTED;
    int same;
    if (Py_IS_TYPE(other, request_type)) {
        Request *that = (Request *)other;
        same = self->hash == that->hash;
        if (same)
            same = PyObject_RichCompareBool(self->ids, that->ids, Py_EQ);
        if (same == 1)
            same = PyObject_RichCompareBool(self->variant, that->variant, Py_EQ);
        if (same < 0)
            return NULL;
    }
    else if (PyTuple_CheckExact(other)) {
        PyObject *pair = request_pair(self);
        if (pair == NULL)
            return NULL;
        same = PyObject_RichCompareBool(pair, other, Py_EQ);
        Py_DECREF(pair);
        if (same < 0)
            return NULL;
    }
    else
        Py_RETURN_NOTIMPLEMENTED;
    return PyBool_FromLong(op == Py_EQ ? same : !same);
}

static PyObject *request_iter(PyObject *self)
{
    PyObject *pair = request_pair((Request *)self);
    if (pair == NULL)
        return NULL;
    PyObject *iter = PyObject_GetIter(pair);
    Py_DECREF(pair);
    return iter;
}

static PyObject *request_getitem(PyObject *self, PyObject *index)
{
    PyObject *pair = request_pair((Request *)self);
    if (pair == NULL)
        return NULL;
    PyObject *item = PyObject_GetItem(pair, index);
    Py_DECREF(pair);
    return item;
}

static Py_ssize_t request_len(PyObject *self)
{
    (void)self;
    return 2;
}

static PyObject *request_repr(PyObject *obj)
{
    Request *self = (Request *)obj;
    return PyUnicode_FromFormat("Request(variant=%R, ids=%R)", self->variant, self->ids);
}

static PyObject *request_reduce(PyObject *obj, PyObject *unused)
{
    (void)unused;
    Request *self = (Request *)obj;
    return Py_BuildValue("O(OO)", (PyObject *)Py_TYPE(obj), self->variant, self->ids);
}

static PyObject *request_get_variant(PyObject *self, void *closure)
{
    (void)closure;
    PyObject *variant = ((Request *)self)->variant;
    Py_INCREF(variant);
    return variant;
}

static PyObject *request_get_ids(PyObject *self, void *closure)
{
    (void)closure;
    PyObject *ids = ((Request *)self)->ids;
    Py_INCREF(ids);
    return ids;
}

static PyGetSetDef request_getset[] = {
    {"variant", request_get_variant, NULL,
     "What besides the context selects the distribution (None: the base model).", NULL},
    {"ids", request_get_ids, NULL, "The context's token ids, already validated.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef request_methods[] = {
    {"__reduce__", request_reduce, METH_NOARGS, "Pickles as Request(variant, ids)."},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(request_doc,
             "Request(variant, ids)\n\n"
             "A validated request: the variant it was made for and its context's token ids,\n"
             "with the hash of the tuple ``(variant, ids)`` computed once. It stands for that\n"
             "tuple (unpacking, indexing, len, equality, hash); see genlm.core._request.");

static PyType_Slot request_slots[] = {
    {Py_tp_new, request_new},
    {Py_tp_dealloc, request_dealloc},
    {Py_tp_hash, request_hash},
    {Py_tp_richcompare, request_richcompare},
    {Py_tp_iter, request_iter},
    {Py_mp_subscript, request_getitem},
    {Py_mp_length, request_len},
    {Py_sq_length, request_len},
    {Py_tp_repr, request_repr},
    {Py_tp_getset, request_getset},
    {Py_tp_methods, request_methods},
    {Py_tp_doc, (void *)request_doc},
    {0, NULL},
};

static PyType_Spec request_spec = {
    "genlm.core._ids.Request", /* pickled by this name: the module holds it */
    sizeof(Request),
    0,
    Py_TPFLAGS_DEFAULT, /* no Py_TPFLAGS_HAVE_GC: never tracked by the collector */
    request_slots,
};


/* ---- make_request: validation, tuple and hash in one pass -------------------------- */

#if FAST_HASH_POSSIBLE
/* The tuple hash of `items` computed from the items' hashes as above, or -1 on error. */
static Py_hash_t tuple_hash_of(PyObject *tuple)
{
    Py_uhash_t acc = XXPRIME_5;
    Py_ssize_t n = PyTuple_Size(tuple);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_hash_t lane = PyObject_Hash(PyTuple_GetItem(tuple, i));
        if (lane == -1)
            return -1;
        acc = tuple_hash_step(acc, (Py_uhash_t)lane);
    }
    return tuple_hash_end(acc, n);
}
#endif

/* Sets fast_hash_ok: whether tuple_hash_of equals Python's hash on sample tuples. */
static int check_fast_hash(void)
{
#if FAST_HASH_POSSIBLE
    PyObject *sample = Py_BuildValue("((iii)(s(ii)))", 0, 7, 1 << 20, "variant", 3, 5);
    if (sample == NULL)
        return -1;
    int ok = 1;
    Py_ssize_t n = PyTuple_Size(sample);
    for (Py_ssize_t i = 0; i <= n && ok; i++) { /* each part, then the whole */
        PyObject *tuple = i < n ? PyTuple_GetItem(sample, i) : sample;
        Py_hash_t expected = PyObject_Hash(tuple), ours = tuple_hash_of(tuple);
        if (expected == -1 || ours == -1) {
            Py_DECREF(sample);
            return -1;
        }
        ok = expected == ours;
    }
    Py_DECREF(sample);
    fast_hash_ok = ok;
#endif
    return 0;
}

PyDoc_STRVAR(make_request_doc,
             "make_request(variant, token_ids, vocab_size: int, max_length: int) -> Request | None\n\n"
             "``Request(variant, tuple(token_ids))`` when ``token_ids`` is a list or tuple of\n"
             "1 to ``max_length`` exact ints, each in ``[0, vocab_size)``; else None, and the\n"
             "caller validates in Python (which converts or names the problem).");

static PyObject *make_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "make_request(variant, token_ids, vocab_size: int, max_length: int)");
        return NULL;
    }
    PyObject *variant = args[0], *ids = args[1];
    int is_tuple = PyTuple_CheckExact(ids);
    if (!is_tuple && !PyList_CheckExact(ids))
        Py_RETURN_NONE;
    long long vocab_size = PyLong_AsLongLong(args[2]);
    if (vocab_size == -1 && PyErr_Occurred())
        return NULL;
    int overflow;
    long long max_length = PyLong_AsLongLongAndOverflow(args[3], &overflow);
    if (max_length == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = is_tuple ? PyTuple_Size(ids) : PyList_Size(ids);
    if (n < 1 || overflow < 0 || (!overflow && n > max_length)) /* overflow > 0: no limit */
        Py_RETURN_NONE;
    Py_uhash_t acc = 0;
#if FAST_HASH_POSSIBLE
    acc = XXPRIME_5;
    int fast = fast_hash_ok && vocab_size <= HASH_MODULUS;
#endif
    if (scan_ids(ids, is_tuple, n, vocab_size, &acc) >= 0)
        Py_RETURN_NONE;
    PyObject *tuple;
    if (is_tuple) {
        tuple = ids;
        Py_INCREF(tuple);
    }
    else if ((tuple = PyList_AsTuple(ids)) == NULL)
        return NULL;
    untrack_ints(tuple);
    Py_hash_t hash;
#if FAST_HASH_POSSIBLE
    if (fast) {
        Py_hash_t variant_hash = PyObject_Hash(variant);
        Py_uhash_t pair = tuple_hash_step(XXPRIME_5, (Py_uhash_t)variant_hash);
        pair = tuple_hash_step(pair, (Py_uhash_t)tuple_hash_end(acc, n));
        hash = variant_hash == -1 ? -1 : tuple_hash_end(pair, 2);
    }
    else
#endif
        hash = pair_hash(variant, tuple);
    PyObject *request = hash == -1 ? NULL : request_alloc(request_type, variant, tuple, hash);
    Py_DECREF(tuple);
    return request;
}

static PyMethodDef methods[] = {
    {"first_doubt", (PyCFunction)(void (*)(void))first_doubt, METH_FASTCALL, first_doubt_doc},
    {"make_request", (PyCFunction)(void (*)(void))make_request, METH_FASTCALL, make_request_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "genlm.core._ids",
    "Context validation's common case and Request, in C (see _ids.c).",
    0,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__ids(void)
{
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL)
        return NULL;
    request_type = (PyTypeObject *)PyType_FromSpec(&request_spec);
    if (request_type == NULL || PyModule_AddObject(mod, "Request", (PyObject *)request_type) < 0) {
        Py_XDECREF((PyObject *)request_type);
        Py_DECREF(mod);
        return NULL;
    }
    Py_INCREF((PyObject *)request_type); /* PyModule_AddObject took one reference; keep our own */
    if (check_fast_hash() < 0 || PyModule_AddIntConstant(mod, "FAST_HASH", fast_hash_ok) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
