/* Drop the Kineto events the analysis never reads, before they are decoded.
 *
 * select_events(raw, rules) -> bytes | None
 *
 * `raw` is a whole Kineto JSON document. The result is the same document with some elements
 * of its top-level "traceEvents" array left out; every other byte is copied unchanged. An
 * event is left out only when its "cat" is a plain string that the rules do not keep (see
 * _select.py, which owns the rules). None means "decode `raw` as it is": the document is not
 * one this scanner understands with certainty (invalid JSON anywhere it had to read, no
 * traceEvents array, nesting deeper than MAX_DEPTH), or nothing would be left out.
 *
 * Every dropped event is checked to be valid JSON (strings, escapes, numbers, literals,
 * nesting), so a corrupt event is never hidden by being dropped: the caller's decoder sees it.
 * The GIL is released while scanning and copying.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define MAX_DEPTH 512
#define MAX_RULES 64

typedef struct {
    const char *ptr;
    Py_ssize_t len;
} Text;

typedef struct {
    Text items[MAX_RULES];
    int count;
} TextSet;

typedef struct {
    TextSet keep;          /* categories always kept */
    TextSet device;        /* categories that make the trace a device (GPU) trace */
    TextSet operators;     /* categories kept by name prefix, or kept all on host-only traces */
    TextSet op_prefixes;
    TextSet python;        /* categories kept by name substring */
    TextSet py_substrings;
} Rules;

enum { KEEP = 0, DROP = 1, OPERATOR = 2 };

typedef struct {
    Py_ssize_t start, end;
    unsigned char verdict;
} Span;

typedef struct {
    const char *p, *end;
} Cursor;

static void skip_ws(Cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t'))
        c->p++;
}

static int is_hex(char ch) {
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
}

/* At an opening quote: move past the closing one. Sets *escaped if the string has escapes.
 * Returns 0 on invalid JSON (bad escape, raw control character, no closing quote). */
static int scan_string(Cursor *c, int *escaped) {
    c->p++; /* opening quote */
    *escaped = 0;
    while (c->p < c->end) {
#ifdef __SSE2__
        /* Skip 16 plain bytes at a time: no quote, backslash or control character. */
        const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\');
        const __m128i control_max = _mm_set1_epi8(0x1f);
        while (c->end - c->p >= 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)c->p);
            __m128i special = _mm_or_si128(
                _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                _mm_cmpeq_epi8(_mm_min_epu8(v, control_max), v));
            int mask = _mm_movemask_epi8(special);
            if (mask != 0) {
                c->p += __builtin_ctz((unsigned)mask);
                break;
            }
            c->p += 16;
        }
        if (c->p >= c->end)
            return 0;
#endif
        unsigned char ch = (unsigned char)*c->p;
        if (ch == '"') {
            c->p++;
            return 1;
        }
        if (ch < 0x20)
            return 0;
        if (ch == '\\') {
            *escaped = 1;
            if (c->p + 1 >= c->end)
                return 0;
            char e = c->p[1];
            if (e == 'u') {
                if (c->p + 5 >= c->end || !is_hex(c->p[2]) || !is_hex(c->p[3]) ||
                    !is_hex(c->p[4]) || !is_hex(c->p[5]))
                    return 0;
                c->p += 6;
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || e == '\0')
                return 0;
            c->p += 2;
            continue;
        }
        c->p++;
    }
    return 0;
}

static int scan_digits(Cursor *c) {
    const char *start = c->p;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9')
        c->p++;
    return c->p > start;
}

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static int scan_number(Cursor *c) {
    if (c->p < c->end && *c->p == '-')
        c->p++;
    if (c->p < c->end && *c->p == '0')
        c->p++;
    else if (!scan_digits(c))
        return 0;
    if (c->p < c->end && *c->p == '.') {
        c->p++;
        if (!scan_digits(c))
            return 0;
    }
    if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
        c->p++;
        if (c->p < c->end && (*c->p == '+' || *c->p == '-'))
            c->p++;
        if (!scan_digits(c))
            return 0;
    }
    return 1;
}

static int scan_literal(Cursor *c, const char *word, size_t n) {
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0)
        return 0;
    c->p += n;
    return 1;
}

/* After a member or element: 1 if a comma (another follows), 0 if `close` (it ended), -1 if
 * neither (invalid JSON). Either is consumed. */
static int next_member(Cursor *c, char close) {
    skip_ws(c);
    if (c->p >= c->end)
        return -1;
    if (*c->p == ',') {
        c->p++;
        skip_ws(c);
        return 1;
    }
    if (*c->p == close) {
        c->p++;
        return 0;
    }
    return -1;
}

static int scan_value(Cursor *c, int depth);

/* At '{' or '[': move past the matching close, checking every element. */
static int scan_container(Cursor *c, int depth) {
    char close = *c->p == '{' ? '}' : ']';
    int is_object = close == '}';
    int escaped;
    if (depth >= MAX_DEPTH)
        return 0;
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == close) {
        c->p++;
        return 1;
    }
    for (;;) {
        if (is_object) {
            if (c->p >= c->end || *c->p != '"' || !scan_string(c, &escaped))
                return 0;
            skip_ws(c);
            if (c->p >= c->end || *c->p != ':')
                return 0;
            c->p++;
            skip_ws(c);
        }
        if (!scan_value(c, depth + 1))
            return 0;
        int next = next_member(c, close);
        if (next <= 0)
            return next == 0;
    }
}

static int scan_value(Cursor *c, int depth) {
    int escaped;
    if (c->p >= c->end)
        return 0;
    switch (*c->p) {
    case '"':
        return scan_string(c, &escaped);
    case '{':
    case '[':
        return scan_container(c, depth);
    case 't':
        return scan_literal(c, "true", 4);
    case 'f':
        return scan_literal(c, "false", 5);
    case 'n':
        return scan_literal(c, "null", 4);
    default:
        return scan_number(c);
    }
}

static int in_set(const TextSet *set, const char *ptr, Py_ssize_t len) {
    for (int i = 0; i < set->count; i++)
        if (set->items[i].len == len && memcmp(set->items[i].ptr, ptr, (size_t)len) == 0)
            return 1;
    return 0;
}

static int has_prefix(const TextSet *set, const char *ptr, Py_ssize_t len) {
    for (int i = 0; i < set->count; i++)
        if (set->items[i].len <= len && memcmp(set->items[i].ptr, ptr, (size_t)set->items[i].len) == 0)
            return 1;
    return 0;
}

static int has_substring(const TextSet *set, const char *ptr, Py_ssize_t len) {
    for (int i = 0; i < set->count; i++) {
        Py_ssize_t n = set->items[i].len;
        for (Py_ssize_t at = 0; at + n <= len; at++)
            if (memcmp(ptr + at, set->items[i].ptr, (size_t)n) == 0)
                return 1;
    }
    return 0;
}

/* A string value of one of the keys we look at: content span, or absent / not plain. */
typedef struct {
    const char *ptr;
    Py_ssize_t len;
    int seen;  /* times the key appeared */
    int plain; /* a string without escapes */
} Field;

/* At the '{' of one event: move past it and decide its verdict. 0 on invalid JSON. */
static int scan_event(Cursor *c, const Rules *rules, unsigned char *verdict, int *is_device) {
    Field cat = {0}, name = {0};
    int escaped;
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        *verdict = KEEP;
        return 1;
    }
    for (;;) {
        const char *key;
        Py_ssize_t key_len;
        Field *field = NULL;
        if (c->p >= c->end || *c->p != '"')
            return 0;
        key = c->p + 1;
        if (!scan_string(c, &escaped))
            return 0;
        key_len = c->p - 1 - key;
        if (escaped) {
            /* a key spelled with escapes might be one we look at: keep the event */
            cat.seen = 2;
        } else if (key_len == 3 && memcmp(key, "cat", 3) == 0) {
            field = &cat;
        } else if (key_len == 4 && memcmp(key, "name", 4) == 0) {
            field = &name;
        }
        skip_ws(c);
        if (c->p >= c->end || *c->p != ':')
            return 0;
        c->p++;
        skip_ws(c);
        if (field != NULL) {
            field->seen++;
            field->plain = 0;
            if (c->p < c->end && *c->p == '"') {
                field->ptr = c->p + 1;
                if (!scan_string(c, &escaped))
                    return 0;
                field->len = c->p - 1 - field->ptr;
                field->plain = !escaped;
            } else if (!scan_value(c, 2)) {
                return 0;
            }
        } else if (!scan_value(c, 2)) {
            return 0;
        }
        int next = next_member(c, '}');
        if (next < 0)
            return 0;
        if (next == 0)
            break;
    }

    *verdict = KEEP;
    if (cat.seen != 1 || !cat.plain)
        return 1; /* no category, an unusual one, or a repeated key: the decoder decides */
    if (in_set(&rules->device, cat.ptr, cat.len))
        *is_device = 1;
    if (in_set(&rules->keep, cat.ptr, cat.len))
        return 1;
    int named = name.seen == 1 && name.plain;
    if (in_set(&rules->operators, cat.ptr, cat.len)) {
        if (named && !has_prefix(&rules->op_prefixes, name.ptr, name.len))
            *verdict = OPERATOR;
        return 1;
    }
    if (in_set(&rules->python, cat.ptr, cat.len)) {
        if (named && !has_substring(&rules->py_substrings, name.ptr, name.len))
            *verdict = DROP;
        return 1;
    }
    *verdict = DROP; /* a category the analysis does not read at all (flow events, ...) */
    return 1;
}

typedef struct {
    Span *spans;
    Py_ssize_t count, capacity;
    Py_ssize_t array_open, array_close; /* offsets of '[' and ']' */
    int is_device;
    int failed;
} Scan;

static int push(Scan *s, Py_ssize_t start, Py_ssize_t end, unsigned char verdict) {
    if (s->count == s->capacity) {
        Py_ssize_t grown = s->capacity ? s->capacity * 2 : 4096;
        Span *spans = realloc(s->spans, (size_t)grown * sizeof(Span));
        if (spans == NULL)
            return 0;
        s->spans = spans;
        s->capacity = grown;
    }
    s->spans[s->count].start = start;
    s->spans[s->count].end = end;
    s->spans[s->count].verdict = verdict;
    s->count++;
    return 1;
}

/* Find the top-level traceEvents array and classify its elements. No Python calls. */
static int scan_document(const char *raw, Py_ssize_t n, const Rules *rules, Scan *s) {
    Cursor c = {raw, raw + n};
    int escaped, found = 0;
    skip_ws(&c);
    if (c.p >= c.end || *c.p != '{')
        return 0;
    c.p++;
    skip_ws(&c);
    while (c.p < c.end && *c.p != '}') {
        const char *key = c.p + 1;
        Py_ssize_t key_len;
        if (*c.p != '"' || !scan_string(&c, &escaped))
            return 0;
        key_len = c.p - 1 - key;
        skip_ws(&c);
        if (c.p >= c.end || *c.p != ':')
            return 0;
        c.p++;
        skip_ws(&c);
        if (!escaped && key_len == 11 && memcmp(key, "traceEvents", 11) == 0) {
            if (found || c.p >= c.end || *c.p != '[')
                return 0; /* twice, or not an array: leave it to the decoder */
            found = 1;
            s->array_open = c.p - raw;
            c.p++;
            skip_ws(&c);
            if (c.p < c.end && *c.p == ']')
                return 0; /* no events: nothing to leave out */
            for (;;) {
                const char *start = c.p;
                unsigned char verdict = KEEP;
                if (c.p < c.end && *c.p == '{') {
                    if (!scan_event(&c, rules, &verdict, &s->is_device))
                        return 0;
                } else if (!scan_value(&c, 1)) {
                    return 0;
                }
                if (!push(s, start - raw, c.p - raw, verdict)) {
                    s->failed = 1;
                    return 0;
                }
                int next = next_member(&c, ']');
                if (next < 0 || (next == 1 && c.p < c.end && *c.p == ']'))
                    return 0; /* invalid, or a trailing comma */
                if (next == 0) {
                    s->array_close = c.p - 1 - raw;
                    break;
                }
            }
        } else if (!scan_value(&c, 1)) {
            return 0;
        }
        skip_ws(&c);
        if (c.p < c.end && *c.p == ',') {
            c.p++;
            skip_ws(&c);
        }
    }
    return found; /* the rest of the document is copied as is: its decoder checks it */
}

static int kept(const Span *span, int is_device) {
    return span->verdict == KEEP || (span->verdict == OPERATOR && !is_device);
}

static int read_set(PyObject *tuple, TextSet *set) {
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) > MAX_RULES) {
        PyErr_SetString(PyExc_TypeError, "each rule must be a tuple of at most 64 bytes");
        return 0;
    }
    set->count = (int)PyTuple_GET_SIZE(tuple);
    for (int i = 0; i < set->count; i++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, i);
        if (!PyBytes_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "rule entries must be bytes");
            return 0;
        }
        set->items[i].ptr = PyBytes_AS_STRING(item);
        set->items[i].len = PyBytes_GET_SIZE(item);
    }
    return 1;
}

static PyObject *select_events(PyObject *module, PyObject *args) {
    PyObject *raw_obj, *keep, *device, *operators, *op_prefixes, *python, *py_substrings;
    Rules rules;
    Scan s = {0};
    int ok;
    (void)module;
    if (!PyArg_ParseTuple(args, "SOOOOOO:select_events", &raw_obj, &keep, &device, &operators,
                          &op_prefixes, &python, &py_substrings))
        return NULL;
    if (!read_set(keep, &rules.keep) || !read_set(device, &rules.device) ||
        !read_set(operators, &rules.operators) || !read_set(op_prefixes, &rules.op_prefixes) ||
        !read_set(python, &rules.python) || !read_set(py_substrings, &rules.py_substrings))
        return NULL;
    const char *raw = PyBytes_AS_STRING(raw_obj);
    Py_ssize_t n = PyBytes_GET_SIZE(raw_obj);

    Py_BEGIN_ALLOW_THREADS
    ok = scan_document(raw, n, &rules, &s);
    Py_END_ALLOW_THREADS
    if (s.failed) {
        free(s.spans);
        return PyErr_NoMemory();
    }
    Py_ssize_t size = 0, kept_count = 0;
    if (ok) {
        for (Py_ssize_t i = 0; i < s.count; i++)
            if (kept(&s.spans[i], s.is_device)) {
                size += s.spans[i].end - s.spans[i].start + 1;
                kept_count++;
            }
    }
    if (!ok || kept_count == s.count) {
        free(s.spans);
        Py_RETURN_NONE;
    }
    Py_ssize_t head = s.array_open + 1, tail = n - s.array_close;
    PyObject *out = PyBytes_FromStringAndSize(NULL, head + size + tail);
    if (out == NULL) {
        free(s.spans);
        return NULL;
    }
    char *dst = PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    memcpy(dst, raw, (size_t)head);
    dst += head;
    int first = 1;
    for (Py_ssize_t i = 0; i < s.count; i++) {
        const Span *span = &s.spans[i];
        if (!kept(span, s.is_device))
            continue;
        if (!first)
            *dst++ = ',';
        first = 0;
        memcpy(dst, raw + span->start, (size_t)(span->end - span->start));
        dst += span->end - span->start;
    }
    memcpy(dst, raw + s.array_close, (size_t)tail);
    dst += tail;
    Py_END_ALLOW_THREADS
    free(s.spans);
    /* `size` counted a comma per kept event; the first has none. */
    if (_PyBytes_Resize(&out, dst - PyBytes_AS_STRING(out)) < 0)
        return NULL;
    return out;
}

static PyMethodDef methods[] = {
    {"select_events", select_events, METH_VARARGS,
     "select_events(raw, keep, device, operators, operator_prefixes, python, python_substrings)"
     " -> bytes | None: the document without the events the rules drop (see _select.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_select_c", "Kineto event pre-filter (see _select.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__select_c(void) { return PyModule_Create(&module); }
