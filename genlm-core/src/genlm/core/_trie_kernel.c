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
 */
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x030B0000 /* the stable ABI of CPython 3.11+: one build for all */
#include <Python.h>
#include <stdint.h>

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

static PyMethodDef methods[] = {
    {"fold", fold, METH_VARARGS, fold_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "genlm.core._trie_kernel",
    "The token-byte trie's weight kernel in C (see _trie_kernel.c).",
    -1,
    methods,
};

PyMODINIT_FUNC PyInit__trie_kernel(void)
{
    return PyModule_Create(&module);
}
