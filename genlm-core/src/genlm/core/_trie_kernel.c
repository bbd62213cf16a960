/*
 * The token-byte trie's weight kernel in C: one pass over the tokens and one over
 * the nodes per row, with the GIL released.
 *
 * Why C: the numpy kernel in _trie.py needs one call per trie level, and each
 * node costs a gather and a ufunc.at step; these loops take about half its time
 * (0.5 ms against 0.9 ms a row on llama3.2) and hold no GIL. The numpy kernel
 * stays as the fallback where this module was not built, and as the second
 * implementation the tests compare against.
 *
 * Node ids are breadth-first, so every child has a larger id than its parent:
 * folding ``out[parent[v]] op= out[v]`` for v from the last node down to 1 sees
 * each node complete before it is folded into its parent. Like the numpy kernel,
 * each node's sum is its own tokens plus its children's sums (in another order,
 * so the last bits may differ), with no differences of large numbers anywhere.
 *
 * Indices are int32 and trusted: TokenByteTrie builds them and checks them once.
 * Only buffer sizes are checked here.
 *
 * Output blocks (``empty``): a batched call's output is large (67 MiB for 32 rows
 * of llama3.2), and glibc serves allocations above 32 MiB with a fresh mmap each
 * time, so every call would pay the kernel for zeroing and faulting in every page
 * (about 6 ms of a 15 ms call on two threads). ``empty`` hands out blocks that,
 * when the last array viewing them is freed, go back to a small pool (at most
 * POOL_SLOTS blocks and ``pool_limit`` bytes) instead of to the OS, so a caller
 * that drops each output before asking for the next gets already-mapped memory.
 * A block is reused only after its Python object is deallocated, i.e. when
 * nothing can see it any more. Blocks under POOL_MIN bytes are not pooled: malloc
 * already recycles those, and they would only push big blocks out of the slots.
 * A reused block may be up to twice the size asked for (pool_take).
 *
 * The pool is plain static state: every access (empty, a Block's dealloc,
 * set_pool_limit) holds the GIL. A build for free-threaded CPython (which has no
 * limited API, so none is made today) would need a lock here.
 */
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x030B0000 /* the stable ABI of CPython 3.11+: one build for all */
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef __linux__
#include <sys/mman.h>
#endif

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void)0)
#endif

#define ADD_INTO(dst, x) ((dst) += (x))
/* `x > d ? x : d` is one maxsd instruction; it drops a NaN x (see fold_rows). */
#define MAX_INTO(dst, x)                         \
    do {                                         \
        double x_ = (x), d_ = (dst);             \
        (dst) = x_ > d_ ? x_ : d_;               \
    } while (0)

/* Per row: every node starts from the identity, each token is folded into its
 * node (tokens sorted by node, so the writes are sequential; the row is
 * prefetched first, as the reads are not), then every node into its parent,
 * deepest first. */
#define FOLD_ROW(OP)                                                        \
    do {                                                                    \
        for (Py_ssize_t v = 0; v < N; v++) {                                \
            o[v] = identity;                                                \
        }                                                                   \
        for (Py_ssize_t i = 0; i < V; i += 8) {                             \
            PREFETCH(wr + i);                                               \
        }                                                                   \
        for (Py_ssize_t k = 0; k < T; k++) {                                \
            OP(o[tnode[k]], wr[tok[k]]);                                    \
        }                                                                   \
        for (Py_ssize_t v = N - 1; v > 0; v--) {                            \
            OP(o[parent[v]], o[v]);                                         \
        }                                                                   \
    } while (0)

static void fold_rows(const double *w, double *out, Py_ssize_t rows, Py_ssize_t V,
                      Py_ssize_t N, const int32_t *tok, const int32_t *tnode, Py_ssize_t T,
                      const int32_t *parent, int is_max, double identity)
{
    for (Py_ssize_t b = 0; b < rows; b++) {
        const double *wr = w + b * V;
        double *o = out + b * N;
        if (is_max) {
            FOLD_ROW(MAX_INTO);
            /* np.maximum propagates NaN; maxsd does not. NaN weights are rare (a
             * caller's bug), so mend them afterwards: a NaN token makes its node
             * and every ancestor NaN. */
            int has_nan = 0;
            for (Py_ssize_t i = 0; i < V; i++) {
                has_nan |= wr[i] != wr[i];
            }
            for (Py_ssize_t k = 0; has_nan && k < T; k++) {
                double x = wr[tok[k]];
                if (x != x) {
                    for (int32_t n = tnode[k]; n >= 0; n = parent[n]) {
                        o[n] = x;
                    }
                }
            }
        }
        else {
            FOLD_ROW(ADD_INTO);
        }
    }
}

static int check_len(const Py_buffer *buf, Py_ssize_t items, Py_ssize_t itemsize,
                     const char *name)
{
    if (buf->len != items * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd bytes, got %zd", name,
                     items * itemsize, buf->len);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(fold_doc,
             "fold(weights, out, rows, vocab_size, num_nodes, tok, tnode, parent, is_max, "
             "identity)\n\n"
             "For each of ``rows`` rows: out[v] = identity; out[tnode[k]] op= "
             "weights[tok[k]]; then out[parent[v]] op= out[v] for v = num_nodes-1 .. 1. "
             "``op`` is + or max (NaN-propagating, like np.maximum). weights: C-contiguous "
             "float64 (rows, vocab_size); out: writable C-contiguous float64 (rows, "
             "num_nodes); tok, tnode: int32 (T,); parent: int32 (num_nodes,).");

static PyObject *fold(PyObject *self, PyObject *args)
{
    Py_buffer w, out, tok, tnode, parent;
    Py_ssize_t rows, V, N;
    int is_max;
    double identity;
    if (!PyArg_ParseTuple(args, "y*w*nnny*y*y*pd", &w, &out, &rows, &V, &N, &tok, &tnode,
                          &parent, &is_max, &identity)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t T = tok.len / (Py_ssize_t)sizeof(int32_t);
    if (rows < 0 || V < 0 || N < 1) {
        PyErr_SetString(PyExc_ValueError, "fold: bad sizes");
    }
    else if (check_len(&w, rows * V, sizeof(double), "weights") == 0 &&
             check_len(&out, rows * N, sizeof(double), "out") == 0 &&
             check_len(&tok, T, sizeof(int32_t), "tok") == 0 &&
             check_len(&tnode, T, sizeof(int32_t), "tnode") == 0 &&
             check_len(&parent, N, sizeof(int32_t), "parent") == 0) {
        Py_BEGIN_ALLOW_THREADS
        fold_rows((const double *)w.buf, (double *)out.buf, rows, V, N,
                  (const int32_t *)tok.buf, (const int32_t *)tnode.buf, T,
                  (const int32_t *)parent.buf, is_max, identity);
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&w);
    PyBuffer_Release(&out);
    PyBuffer_Release(&tok);
    PyBuffer_Release(&tnode);
    PyBuffer_Release(&parent);
    return result;
}

/* ---------------------------------------------------------------- output blocks */

#define POOL_SLOTS 8
#define POOL_MIN ((Py_ssize_t)1 << 20)
#define HUGE_MIN ((Py_ssize_t)4 << 20)

/* Freed blocks, oldest first. Only touched with the GIL held. */
static struct {
    char *data;
    Py_ssize_t cap;
} pool[POOL_SLOTS + 1];
static int pool_count = 0;
static Py_ssize_t pool_bytes = 0;
static Py_ssize_t pool_limit = (Py_ssize_t)256 << 20;

static char *raw_alloc(Py_ssize_t cap)
{
    char *p = (char *)malloc((size_t)cap);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    /* As numpy does for its own arrays of 4 MiB or more: ask for transparent huge
     * pages from the first page boundary on (fewer page faults and TLB misses). */
    if (p != NULL && cap >= HUGE_MIN) {
        uintptr_t offset = 4096 - (uintptr_t)p % 4096;
        madvise(p + offset, (size_t)cap - offset, MADV_HUGEPAGE);
    }
#endif
    return p;
}

/* Take block `i` out of the pool (keeping the others oldest first); return its data. */
static char *pool_remove(int i)
{
    char *data = pool[i].data;
    pool_bytes -= pool[i].cap;
    pool_count--;
    for (; i < pool_count; i++) {
        pool[i] = pool[i + 1];
    }
    return data;
}

/* Free the oldest pooled blocks until the pool holds at most POOL_SLOTS blocks and
 * `limit` bytes. */
static void pool_trim(Py_ssize_t limit)
{
    while (pool_count > 0 && (pool_count > POOL_SLOTS || pool_bytes > limit)) {
        free(pool_remove(0));
    }
}

/* A pooled block of at least `len` bytes and at most twice that (so a small
 * request does not pin a big block), smallest first; NULL if there is none. */
static char *pool_take(Py_ssize_t len, Py_ssize_t *cap)
{
    int best = -1;
    for (int i = 0; i < pool_count; i++) {
        if (pool[i].cap >= len && pool[i].cap / 2 <= len &&
            (best < 0 || pool[i].cap < pool[best].cap)) {
            best = i;
        }
    }
    if (best < 0) {
        return NULL;
    }
    *cap = pool[best].cap;
    return pool_remove(best);
}

static void pool_put(char *data, Py_ssize_t cap)
{
    if (cap < POOL_MIN || cap > pool_limit) {
        free(data);
        return;
    }
    pool[pool_count].data = data;
    pool[pool_count].cap = cap;
    pool_count++;
    pool_bytes += cap;
    pool_trim(pool_limit);
}

typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t len; /* bytes exposed */
    Py_ssize_t cap; /* bytes allocated */
} Block;

static PyTypeObject *BlockType = NULL;

static int block_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    Block *b = (Block *)self;
    return PyBuffer_FillInfo(view, self, b->data, b->len, 0, flags);
}

static void block_dealloc(PyObject *self)
{
    Block *b = (Block *)self;
    PyTypeObject *tp = Py_TYPE(self);
    if (b->data != NULL) {
        pool_put(b->data, b->cap);
    }
    ((freefunc)PyType_GetSlot(tp, Py_tp_free))(self);
    Py_DECREF(tp);
}

/* `allocated`: what a cache that keeps a view of the block must count (a view's own
 * nbytes is the length asked for; a reused block may be up to twice that). */
static PyObject *block_allocated(PyObject *self, void *closure)
{
    return PyLong_FromSsize_t(((Block *)self)->cap);
}

static PyGetSetDef block_getset[] = {
    {"allocated", block_allocated, NULL,
     "Bytes of memory the block holds: its length, or up to twice that when it was "
     "reused from the pool.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot block_slots[] = {
    {Py_bf_getbuffer, block_getbuffer},
    {Py_tp_getset, block_getset},
    {Py_tp_dealloc, block_dealloc},
    {Py_tp_doc, "An uninitialised writable byte buffer from genlm.core._trie_kernel.empty; "
                "its memory goes back to the module's pool when it is freed."},
    {0, NULL},
};

static PyType_Spec block_spec = {
    "genlm.core._trie_kernel.Block",
    sizeof(Block),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    block_slots,
};

PyDoc_STRVAR(empty_doc,
             "empty(nbytes)\n\n"
             "An uninitialised writable buffer of ``nbytes`` bytes (at least 1 allocated): "
             "from 1 MiB up, a freed block of 1 to 2 times that size from the pool where "
             "there is one, else newly allocated.");

/* The one argument of `empty` and `set_pool_limit`: a byte count >= 0. */
static int parse_nbytes(PyObject *args, const char *func, Py_ssize_t *nbytes)
{
    if (!PyArg_ParseTuple(args, "n", nbytes)) {
        return -1;
    }
    if (*nbytes < 0) {
        PyErr_Format(PyExc_ValueError, "%s: nbytes must be >= 0", func);
        return -1;
    }
    return 0;
}

static PyObject *empty(PyObject *self, PyObject *args)
{
    Py_ssize_t len;
    if (parse_nbytes(args, "empty", &len) < 0) {
        return NULL;
    }
    Block *b = (Block *)PyType_GenericAlloc(BlockType, 0);
    if (b == NULL) {
        return NULL;
    }
    Py_ssize_t cap = len > 0 ? len : 1;
    b->data = cap >= POOL_MIN ? pool_take(cap, &b->cap) : NULL;
    if (b->data == NULL) {
        b->data = raw_alloc(cap);
        b->cap = cap;
    }
    if (b->data == NULL && pool_count > 0) {
        /* Out of memory while freed blocks sit idle: give them back and retry. */
        pool_trim(0);
        b->data = raw_alloc(cap);
    }
    b->len = len;
    if (b->data == NULL) {
        b->cap = 0;
        Py_DECREF(b);
        return PyErr_NoMemory();
    }
    return (PyObject *)b;
}

PyDoc_STRVAR(set_pool_limit_doc,
             "set_pool_limit(nbytes) -> previous limit\n\n"
             "How many bytes of freed blocks the pool may keep (0: none, every block goes "
             "back to the OS); lowering it frees pooled blocks at once.");

static PyObject *set_pool_limit(PyObject *self, PyObject *args)
{
    Py_ssize_t limit;
    if (parse_nbytes(args, "set_pool_limit", &limit) < 0) {
        return NULL;
    }
    Py_ssize_t previous = pool_limit;
    pool_limit = limit;
    pool_trim(pool_limit);
    return PyLong_FromSsize_t(previous);
}

PyDoc_STRVAR(pool_stats_doc,
             "pool_stats() -> (blocks, bytes)\n\nThe freed blocks the pool holds now.");

static PyObject *pool_stats(PyObject *self, PyObject *args)
{
    return Py_BuildValue("(in)", pool_count, pool_bytes);
}

static PyMethodDef methods[] = {
    {"fold", fold, METH_VARARGS, fold_doc},
    {"empty", empty, METH_VARARGS, empty_doc},
    {"set_pool_limit", set_pool_limit, METH_VARARGS, set_pool_limit_doc},
    {"pool_stats", pool_stats, METH_NOARGS, pool_stats_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "genlm.core._trie_kernel",
    "The token-byte trie's weight kernel and pooled output blocks in C (see _trie_kernel.c).",
    -1,
    methods,
};

PyMODINIT_FUNC PyInit__trie_kernel(void)
{
    if (BlockType == NULL) {
        BlockType = (PyTypeObject *)PyType_FromSpec(&block_spec);
        if (BlockType == NULL) {
            return NULL;
        }
    }
    PyObject *m = PyModule_Create(&module);
    /* `Block`: the type, so that a caller can tell a view of a block by its base. */
    if (m != NULL && PyModule_AddObjectRef(m, "Block", (PyObject *)BlockType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
