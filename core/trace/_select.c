/* Drop the Kineto events the analysis never reads, before they are decoded.
 *
 * select_events(raw, keep, kernels, memops, launches, operators, operator_prefixes, python,
 *               python_substrings, communication_substrings)
 *     -> (bytes | None, (bytes, list[str | None]) | None)
 *
 * `raw` is a whole Kineto JSON document. The first result is the same document with some
 * elements of its top-level "traceEvents" array left out; every other byte is copied
 * unchanged. An event is left out only when its "cat" is a plain string that the rules do not
 * keep (see _select.py, which owns the rules). None means "decode `raw` as it is": the
 * document is not one this scanner understands with certainty (invalid JSON anywhere it had
 * to read, no traceEvents array, nesting deeper than MAX_DEPTH), or nothing would be left out.
 * The second result is the columns of the device events and launches (see _columns.py) with
 * the distinct kernel names the records point into, or None when any of them cannot be read
 * with certainty; with columns, device events the
 * analysis reads only as numbers are left out of the document too ("lean", see resolve).
 *
 * Every dropped event is checked to be valid JSON as the caller's decoder (msgspec) reads it:
 * strings (UTF-8, escapes, surrogate pairs), numbers (within a double's range), literals,
 * nesting. So a corrupt event is never hidden by being dropped: the decoder sees it.
 * The GIL is released while scanning and copying; big arrays are scanned in two halves on
 * two threads (scan_document). No Python object is touched without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__GLIBC__) || defined(__APPLE__) || defined(__FreeBSD__)
#include <locale.h>
#ifdef __APPLE__
#include <xlocale.h>
#endif
#define HAVE_STRTOD_L 1
static locale_t c_locale; /* strtod_l in the "C" locale: the caller's locale cannot leak in */
#endif
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#if defined(__GNUC__) || defined(__clang__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define RARE __attribute__((noinline, cold)) /* out of the hot loop that calls it */
#else
#define ALWAYS_INLINE inline
#define RARE
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
    TextSet kernels;       /* device events: their presence makes a device (GPU) trace */
    TextSet memops;        /* device events too (copies and memsets) */
    TextSet launches;      /* host launches: kept when a device event names their correlation */
    TextSet operators;     /* categories kept by name prefix, or kept all on host-only traces */
    TextSet op_prefixes;
    TextSet python;        /* categories kept by name substring */
    TextSet py_substrings;
    TextSet comm_substrings; /* lower case: a kernel whose name holds one is communication */
} Rules;

/* KEEP: in the document (and the columns, if it has a bucket); COLUMNS: in the columns only. */
enum { KEEP = 0, DROP = 1, OPERATOR = 2, LAUNCH = 3, COLUMNS = 4 };

enum { NO_BUCKET = 0, KERNEL_BUCKET = 1, MEMOP_BUCKET = 2, LAUNCH_BUCKET = 3 };

typedef struct {
    Py_ssize_t start, end;
    long long correlation; /* args.correlation, if has_correlation */
    double ts, dur;        /* columns of device events and launches (bucket != NO_BUCKET) */
    long long pid, tid;
    unsigned char verdict, bucket, has_correlation;
    unsigned char decoded; /* a device event the analysis reads decoded (communication) */
    unsigned int name; /* a kernel's plain "name": its position in the scan's names, or NO_NAME */
} Span;

typedef struct {
    const char *p, *end;
} Cursor;

static inline int is_ws(char ch) { return ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t'; }

static ALWAYS_INLINE void skip_ws(Cursor *c) {
    if (c->p >= c->end || !is_ws(*c->p))
        return; /* the common case: nothing to skip */
#ifdef __SSE2__
    /* Pretty-printed traces indent every line: skip 16 whitespace bytes at a time. */
    const __m128i space = _mm_set1_epi8(' '), newline = _mm_set1_epi8('\n');
    const __m128i tab = _mm_set1_epi8('\t'), carriage = _mm_set1_epi8('\r');
    while (c->end - c->p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)c->p);
        __m128i ws =
            _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, space), _mm_cmpeq_epi8(v, newline)),
                         _mm_or_si128(_mm_cmpeq_epi8(v, tab), _mm_cmpeq_epi8(v, carriage)));
        unsigned mask = (unsigned)_mm_movemask_epi8(ws);
        if (mask != 0xFFFFu) {
            c->p += __builtin_ctz(~mask);
            return;
        }
        c->p += 16;
    }
#endif
    while (c->p < c->end && is_ws(*c->p))
        c->p++;
}

static int hex_value(char ch) {
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* The code unit of the four hex digits at p, or -1. */
static long hex4(const char *p) {
    long unit = 0;
    for (int i = 0; i < 4; i++) {
        int digit = hex_value(p[i]);
        if (digit < 0)
            return -1;
        unit = unit * 16 + digit;
    }
    return unit;
}

/* At a \u escape: move past it, or past the pair when it is a high surrogate. The decoder
 * rejects a lone surrogate, or a high one not followed by a low one, so the scanner must too:
 * an event left out would otherwise hide what makes the whole document undecodable. */
static RARE int scan_unicode_escape(Cursor *c) {
    if (c->end - c->p < 6)
        return 0;
    long unit = hex4(c->p + 2);
    if (unit < 0 || (unit >= 0xDC00 && unit <= 0xDFFF))
        return 0;
    if (unit >= 0xD800 && unit <= 0xDBFF) {
        if (c->end - c->p < 12 || c->p[6] != '\\' || c->p[7] != 'u')
            return 0;
        long low = hex4(c->p + 8);
        if (low < 0xDC00 || low > 0xDFFF)
            return 0;
        c->p += 12;
        return 1;
    }
    c->p += 6;
    return 1;
}

/* At a byte >= 0x80 in a string: move past one well-formed UTF-8 sequence (RFC 3629: no
 * overlong forms, no surrogates, nothing past U+10FFFF), or return 0. The decoder rejects a
 * document with any other, so an event holding one is never left out. */
static RARE int scan_utf8(Cursor *c) {
    const unsigned char *p = (const unsigned char *)c->p;
    unsigned char lead = p[0], low = 0x80, high = 0xBF;
    Py_ssize_t n;
    if (lead >= 0xC2 && lead <= 0xDF)
        n = 2;
    else if (lead >= 0xE0 && lead <= 0xEF) {
        n = 3;
        if (lead == 0xE0)
            low = 0xA0; /* overlong below U+0800 */
        else if (lead == 0xED)
            high = 0x9F; /* U+D800-DFFF: surrogates */
    } else if (lead >= 0xF0 && lead <= 0xF4) {
        n = 4;
        if (lead == 0xF0)
            low = 0x90; /* overlong below U+10000 */
        else if (lead == 0xF4)
            high = 0x8F; /* past U+10FFFF */
    } else
        return 0; /* a continuation byte, an overlong 2-byte lead (C0, C1), or F5-FF */
    if (c->end - c->p < n || p[1] < low || p[1] > high)
        return 0;
    for (Py_ssize_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    c->p += n;
    return 1;
}

/* At an opening quote: move past the closing one. Sets *escaped if the string has escapes.
 * Returns 0 on invalid JSON (bad escape or surrogate, raw control character, bytes that are
 * not UTF-8, no closing quote). */
static int scan_string(Cursor *c, int *escaped) {
    c->p++; /* opening quote */
    *escaped = 0;
    while (c->p < c->end) {
#ifdef __SSE2__
        /* Skip 16 plain ASCII bytes at a time: no quote, backslash or control character. */
        const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\');
        const __m128i control_max = _mm_set1_epi8(0x1f);
        while (c->end - c->p >= 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)c->p);
            __m128i special = _mm_or_si128(
                _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                _mm_cmpeq_epi8(_mm_min_epu8(v, control_max), v));
            /* or v itself: its high bits are the bytes >= 0x80, checked as UTF-8 below */
            int mask = _mm_movemask_epi8(_mm_or_si128(special, v));
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
        if (ch >= 0x80) {
            if (!scan_utf8(c))
                return 0;
            continue;
        }
        if (ch == '\\') {
            *escaped = 1;
            if (c->p + 1 >= c->end)
                return 0;
            char e = c->p[1];
            if (e == 'u') {
                if (!scan_unicode_escape(c))
                    return 0;
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

static int finite_number(const char *p, Py_ssize_t n);

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, and a finite double: the decoder rejects a
 * number that overflows one ("Number out of range"), so an event holding one is never left
 * out. Only a token that may reach 1e308 is converted to find out. */
static int scan_number(Cursor *c) {
    const char *start = c->p;
    if (c->p < c->end && *c->p == '-')
        c->p++;
    const char *integer = c->p;
    if (c->p < c->end && *c->p == '0')
        c->p++;
    else if (!scan_digits(c))
        return 0;
    long magnitude = (long)(c->p - integer); /* the value is below 10^magnitude */
    if (c->p < c->end && *c->p == '.') {
        c->p++;
        if (!scan_digits(c))
            return 0;
    }
    if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
        c->p++;
        int negative = 0;
        if (c->p < c->end && (*c->p == '+' || *c->p == '-'))
            negative = *c->p++ == '-';
        const char *digits = c->p;
        if (!scan_digits(c))
            return 0;
        long exponent = 0;
        for (; digits < c->p && exponent < 100000; digits++)
            exponent = exponent * 10 + (*digits - '0');
        magnitude += negative ? -exponent : exponent;
    }
    return magnitude <= 308 || finite_number(start, c->p - start);
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
        if (set->items[i].len <= len &&
            memcmp(set->items[i].ptr, ptr, (size_t)set->items[i].len) == 0)
            return 1;
    return 0;
}

static int has_substring(const TextSet *set, const char *ptr, Py_ssize_t len) {
    for (int i = 0; i < set->count; i++) {
        Py_ssize_t n = set->items[i].len;
#if defined(__GLIBC__) || defined(__APPLE__) || defined(__FreeBSD__)
        if (memmem(ptr, (size_t)len, set->items[i].ptr, (size_t)n) != NULL)
            return 1;
#else
        for (Py_ssize_t at = 0; at + n <= len; at++)
            if (memcmp(ptr + at, set->items[i].ptr, (size_t)n) == 0)
                return 1;
#endif
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

/* A number-valued key of an event ("ts", "dur", "pid"): its token, if it was one. */
typedef struct {
    const char *ptr;
    Py_ssize_t len;
    int seen;
    int number;
} Number;

static const double POWERS_OF_TEN[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                       1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                       1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A JSON number token as the nearest double, exactly as a correctly rounding parser gives it,
 * when that is certain: at most 2^53 as an integer mantissa and a power of ten up to 22, so
 * one IEEE multiplication or division rounds once (Clinger's fast path). 0 otherwise. */
static int exact_double(const char *p, Py_ssize_t n, double *out) {
    const unsigned long long limit = 1ULL << 53;
    unsigned long long mantissa = 0;
    Py_ssize_t i = 0;
    int negative = 0, integer = 1, scale = 0, exponent = 0, exponent_negative = 0;
    if (i < n && p[i] == '-') {
        negative = 1;
        i++;
    }
    for (; i < n && p[i] >= '0' && p[i] <= '9'; i++)
        if ((mantissa = mantissa * 10 + (unsigned long long)(p[i] - '0')) > limit)
            return 0;
    if (i < n && p[i] == '.')
        for (integer = 0, i++; i < n && p[i] >= '0' && p[i] <= '9'; i++, scale--)
            if ((mantissa = mantissa * 10 + (unsigned long long)(p[i] - '0')) > limit)
                return 0;
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        integer = 0;
        i++;
        if (i < n && (p[i] == '+' || p[i] == '-'))
            exponent_negative = p[i++] == '-';
        for (; i < n && p[i] >= '0' && p[i] <= '9'; i++)
            if ((exponent = exponent * 10 + (p[i] - '0')) > 400)
                return 0;
    }
    scale += exponent_negative ? -exponent : exponent;
    if (scale < -22 || scale > 22)
        return 0;
    double value = (double)mantissa;
    value = scale < 0 ? value / POWERS_OF_TEN[-scale] : value * POWERS_OF_TEN[scale];
    /* The decoder reads an integer token as an integer: "-0" is 0, so +0.0, not -0.0. */
    *out = negative && !(integer && mantissa == 0) ? -value : value;
    return 1;
}

/* Any other JSON number token as the nearest double (a correctly rounding strtod); 0 where
 * there is none to call, or the token is too long or out of range. */
static int rounded_double(const char *p, Py_ssize_t n, double *out) {
#ifdef HAVE_STRTOD_L
    char token[64], *end;
    if (c_locale == (locale_t)0 || n >= (Py_ssize_t)sizeof token)
        return 0;
    memcpy(token, p, (size_t)n);
    token[n] = '\0';
    *out = strtod_l(token, &end, c_locale);
    return end == token + n && isfinite(*out);
#else
    (void)p;
    (void)n;
    (void)out;
    return 0;
#endif
}

/* Whether a number token is a finite double; 0 where that cannot be told (no strtod_l, a
 * token of 64 bytes or more): the document is then decoded whole, which says. */
static int finite_number(const char *p, Py_ssize_t n) {
    double value;
    return rounded_double(p, n, &value);
}

static int read_double(const char *p, Py_ssize_t n, double *out) {
    return exact_double(p, n, out) || rounded_double(p, n, out);
}

/* An integer token that fits in 18 digits. */
static int plain_integer(const char *p, Py_ssize_t n, long long *out) {
    Py_ssize_t i = p[0] == '-';
    if (n - i < 1 || n - i > 18)
        return 0;
    long long value = 0;
    for (Py_ssize_t j = i; j < n; j++) {
        if (p[j] < '0' || p[j] > '9')
            return 0;
        value = value * 10 + (p[j] - '0');
    }
    *out = i ? -value : value;
    return 1;
}

/* args.correlation: `seen` times, `plain` if an integer that fits in 18 digits. */
typedef struct {
    long long value;
    int seen;
    int plain;
} Correlation;

static int scan_integer(Cursor *c, Correlation *out) {
    const char *start = c->p;
    if (!scan_number(c))
        return 0;
    out->plain = plain_integer(start, c->p - start, &out->value);
    return 1;
}

/* At the '{' of an event's args: move past it, noting its "correlation". */
static int scan_args(Cursor *c, Correlation *correlation) {
    int escaped;
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        return 1;
    }
    for (;;) {
        const char *key = c->p + 1;
        if (c->p >= c->end || *c->p != '"' || !scan_string(c, &escaped))
            return 0;
        int is_correlation =
            !escaped && c->p - 1 - key == 11 && memcmp(key, "correlation", 11) == 0;
        if (escaped)
            correlation->seen = 2; /* could be spelled "correlation": unknown then */
        skip_ws(c);
        if (c->p >= c->end || *c->p != ':')
            return 0;
        c->p++;
        skip_ws(c);
        if (is_correlation) {
            correlation->seen++;
            correlation->plain = 0;
            if (c->p < c->end && (*c->p == '-' || (*c->p >= '0' && *c->p <= '9'))) {
                if (!scan_integer(c, correlation))
                    return 0;
            } else if (!scan_value(c, 3)) {
                return 0;
            }
        } else if (!scan_value(c, 3)) {
            return 0;
        }
        int next = next_member(c, '}');
        if (next <= 0)
            return next == 0;
    }
}

#define NO_NAME 0xFFFFFFFFu

/* Distinct kernel names, interned by an open-addressing table of positions. Kernel names
 * repeat (a few hundred distinct in a trace of a million kernels), so the table stays small;
 * the hash samples the name's ends and length, and equality is checked in full. */
typedef struct {
    const char **ptr;
    unsigned int *len;
    unsigned char *comm; /* per name: 0 not yet known, 1 no communication, 2 maybe */
    unsigned int *slots; /* position + 1; 0: empty */
    size_t mask;
    unsigned int count, capacity;
    unsigned int last; /* the last name interned (kernels come in runs of one name), or NO_NAME */
} Names;

static size_t hash_name(const char *p, unsigned int n) {
    /* Words of the first and last 32 bytes (kernel names differ at the start or in their
     * template arguments near the end), and the length; equality is checked in full. */
    unsigned long long h = 0x9e3779b97f4a7c15ULL ^ n, w;
    unsigned int head = n < 32 ? n : 32, i = 0;
    for (; i + 8 <= head; i += 8) {
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ULL;
    }
    for (; i < head; i++)
        h = (h ^ (unsigned char)p[i]) * 0x100000001b3ULL;
    if (n > 40) {
        memcpy(&w, p + n - 8, 8);
        h = (h ^ w) * 0x94d049bb133111ebULL;
        memcpy(&w, p + n - 16, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ULL;
        memcpy(&w, p + n - 24, 8);
        h = (h ^ w) * 0x94d049bb133111ebULL;
    }
    return (size_t)(h ^ (h >> 31));
}

static int names_grow(Names *t) {
    unsigned int capacity = t->capacity ? t->capacity * 2 : 64;
    const char **ptr = realloc(t->ptr, capacity * sizeof(*ptr));
    if (ptr == NULL)
        return 0;
    t->ptr = ptr;
    unsigned int *len = realloc(t->len, capacity * sizeof(*len));
    if (len == NULL)
        return 0;
    t->len = len;
    unsigned char *comm = realloc(t->comm, capacity * sizeof(*comm));
    if (comm == NULL)
        return 0;
    t->comm = comm;
    size_t slots = (size_t)capacity * 2;
    unsigned int *table = calloc(slots, sizeof(*table));
    if (table == NULL)
        return 0;
    free(t->slots);
    t->slots = table;
    t->mask = slots - 1;
    t->capacity = capacity;
    for (unsigned int i = 0; i < t->count; i++) {
        size_t slot = hash_name(t->ptr[i], t->len[i]) & t->mask;
        while (t->slots[slot])
            slot = (slot + 1) & t->mask;
        t->slots[slot] = i + 1;
    }
    return 1;
}

/* The position of name (p, n), added if new; NO_NAME when out of memory. */
static unsigned int names_intern(Names *t, const char *p, unsigned int n) {
    if (t->count > 0 && t->len[t->last] == n && memcmp(t->ptr[t->last], p, n) == 0)
        return t->last;
    if (t->count == t->capacity && !names_grow(t))
        return NO_NAME;
    size_t slot = hash_name(p, n) & t->mask;
    while (t->slots[slot]) {
        unsigned int i = t->slots[slot] - 1;
        if (t->len[i] == n && memcmp(t->ptr[i], p, n) == 0)
            return t->last = i;
        slot = (slot + 1) & t->mask;
    }
    t->ptr[t->count] = p;
    t->len[t->count] = n;
    t->comm[t->count] = 0;
    t->slots[slot] = t->count + 1;
    return t->last = t->count++;
}

static void names_free(Names *t) {
    free(t->ptr);
    free(t->len);
    free(t->comm);
    free(t->slots);
}

/* The interned names as a list of str; None for one that is not UTF-8 (cannot be: the
 * decoder would reject the document, but the columns are read before it runs). */
static PyObject *names_list(const Names *t) {
    PyObject *out = PyList_New(t->count);
    if (out == NULL)
        return NULL;
    for (unsigned int i = 0; i < t->count; i++) {
        PyObject *text = PyUnicode_DecodeUTF8(t->ptr[i], t->len[i], NULL);
        if (text == NULL) {
            PyErr_Clear();
            text = Py_NewRef(Py_None);
        }
        PyList_SET_ITEM(out, i, text);
    }
    return out;
}

static int in_columns(const Span *span) {
    return span->bucket != NO_BUCKET && (span->verdict == KEEP || span->verdict == COLUMNS);
}

typedef struct {
    Span *spans;
    Py_ssize_t count, capacity;
    long long *linked; /* correlations of the events that may be device events */
    Py_ssize_t linked_count, linked_capacity;
    long long *decoded_links; /* ... of those the analysis reads decoded */
    Py_ssize_t decoded_count, decoded_capacity;
    Py_ssize_t array_open, array_close; /* offsets of '[' and ']' */
    int is_device;
    int keep_launches; /* a link we cannot read: keep every launch */
    int columns_ok;    /* every device event and launch has columns read with certainty */
    int failed;
    Names names; /* the kernel names, interned while their bytes are in cache */
} Scan;

static int grow(void **items, Py_ssize_t *capacity, size_t size) {
    Py_ssize_t grown = *capacity ? *capacity * 2 : 4096;
    void *bigger = realloc(*items, (size_t)grown * size);
    if (bigger == NULL)
        return 0;
    *items = bigger;
    *capacity = grown;
    return 1;
}

static int append_id(long long **ids, Py_ssize_t *count, Py_ssize_t *capacity, long long id) {
    if (*count == *capacity && !grow((void **)ids, capacity, sizeof(long long)))
        return 0;
    (*ids)[(*count)++] = id;
    return 1;
}

/* An event that is, or may be, a device event: its launch must stay (in the document too if
 * the analysis reads the event decoded). */
static int note_link(Scan *s, const Correlation *correlation, int decoded) {
    if (correlation->seen == 0)
        return 1; /* links nothing */
    if (correlation->seen != 1 || !correlation->plain) {
        s->keep_launches = 1;
        return 1;
    }
    if (!append_id(&s->linked, &s->linked_count, &s->linked_capacity, correlation->value))
        return 0;
    return !decoded || append_id(&s->decoded_links, &s->decoded_count, &s->decoded_capacity,
                                 correlation->value);
}

/* Whether a kernel name holds one of the lower-case `set` entries, ignoring ASCII case; a
 * name that is not ASCII counts as holding one (its decoded form decides). */
static int names_communication(const TextSet *set, const char *ptr, Py_ssize_t len) {
    for (Py_ssize_t i = 0; i < len; i++)
        if ((unsigned char)ptr[i] >= 0x80)
            return 1;
    for (int k = 0; k < set->count; k++) {
        const char *part = set->items[k].ptr;
        Py_ssize_t n = set->items[k].len;
        for (Py_ssize_t at = 0; at + n <= len; at++) {
            Py_ssize_t j = 0;
            while (j < n) {
                char ch = ptr[at + j];
                if ((ch >= 'A' && ch <= 'Z' ? ch + ('a' - 'A') : ch) != part[j])
                    break;
                j++;
            }
            if (j == n)
                return 1;
        }
    }
    return 0;
}

/* `names_communication` of interned name `i`, worked out once per distinct name: a trace has
 * a few hundred distinct kernel names and a million kernels. */
static int name_is_communication(Names *t, unsigned int i, const TextSet *set) {
    if (t->comm[i] == 0)
        t->comm[i] = (unsigned char)(1 + names_communication(set, t->ptr[i], t->len[i]));
    return t->comm[i] == 2;
}

/* The columns of a device event or launch, exactly as the decoder will read them; 0 if any is
 * missing, repeated or not certain (then the analysis reads the decoded events instead). */
static int read_columns(Span *span, const Field *phase, const Number *ts, const Number *dur,
                        const Number *pid, const Number *tid, const Correlation *correlation) {
    /* flow phases decode without times; an unusual phase may decode another way */
    if (phase->seen > 1 || (phase->seen == 1 && !phase->plain))
        return 0;
    if (phase->seen == 1 && phase->len == 1 && strchr("stf", phase->ptr[0]) != NULL)
        return 0;
    if (ts->seen != 1 || !ts->number || !read_double(ts->ptr, ts->len, &span->ts))
        return 0;
    if (correlation->seen > 1 || (correlation->seen == 1 && !correlation->plain))
        return 0;
    span->has_correlation = correlation->seen == 1;
    span->correlation = correlation->value;
    if (span->bucket == LAUNCH_BUCKET) /* read for its time, thread and correlation only */
        return tid->seen == 1 && tid->number && plain_integer(tid->ptr, tid->len, &span->tid);
    if (dur->seen != 1 || !dur->number || !read_double(dur->ptr, dur->len, &span->dur))
        return 0;
    return pid->seen == 1 && pid->number && plain_integer(pid->ptr, pid->len, &span->pid);
}

/* At the '{' of one event: move past it and decide its verdict. 0 on invalid JSON (or, with
 * s->failed set, no memory). */
static int scan_event(Cursor *c, const Rules *rules, Span *span, Scan *s) {
    Field cat = {0}, name = {0}, phase = {0};
    Number ts = {0}, dur = {0}, pid = {0}, tid = {0};
    Correlation correlation = {0};
    int escaped, args_seen = 0, odd_key = 0;
    c->p++;
    skip_ws(c);
    span->verdict = KEEP;
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        return 1;
    }
    for (;;) {
        const char *key;
        Py_ssize_t key_len;
        Field *field = NULL;
        Number *number = NULL;
        int is_args = 0;
        if (c->p >= c->end || *c->p != '"')
            return 0;
        key = c->p + 1;
        if (!scan_string(c, &escaped))
            return 0;
        key_len = c->p - 1 - key;
        if (escaped) {
            /* a key spelled with escapes might be one we look at: keep the event */
            cat.seen = 2;
            correlation.seen = 2;
            odd_key = 1;
        } else if (key_len == 3 && memcmp(key, "cat", 3) == 0) {
            field = &cat;
        } else if (key_len == 4 && memcmp(key, "name", 4) == 0) {
            field = &name;
        } else if (key_len == 2 && memcmp(key, "ph", 2) == 0) {
            field = &phase;
        } else if (key_len == 2 && memcmp(key, "ts", 2) == 0) {
            number = &ts;
        } else if (key_len == 3 && memcmp(key, "dur", 3) == 0) {
            number = &dur;
        } else if (key_len == 3 && memcmp(key, "pid", 3) == 0) {
            number = &pid;
        } else if (key_len == 3 && memcmp(key, "tid", 3) == 0) {
            number = &tid;
        } else if (key_len == 4 && memcmp(key, "args", 4) == 0) {
            is_args = 1;
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
        } else if (number != NULL) {
            number->seen++;
            number->number = c->p < c->end && (*c->p == '-' || (*c->p >= '0' && *c->p <= '9'));
            number->ptr = c->p;
            if (!scan_value(c, 2))
                return 0;
            number->len = c->p - number->ptr;
        } else if (is_args) {
            if (++args_seen > 1)
                correlation.seen = 2; /* which args the decoder keeps is its business */
            if (c->p < c->end && *c->p == '{') {
                if (!scan_args(c, &correlation))
                    return 0;
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

    int plain_cat = cat.seen == 1 && cat.plain;
    /* No "cat" key at all (and no key spelled with escapes): the decoder gives no category, and
     * such an event is never a device event or launch (`_scan`); it stays in the document. */
    if (cat.seen == 0 && !odd_key)
        return 1;
    if (plain_cat && in_set(&rules->kernels, cat.ptr, cat.len))
        span->bucket = KERNEL_BUCKET;
    else if (plain_cat && in_set(&rules->memops, cat.ptr, cat.len))
        span->bucket = MEMOP_BUCKET;
    else if (plain_cat && in_set(&rules->launches, cat.ptr, cat.len))
        span->bucket = LAUNCH_BUCKET;
    if (!plain_cat && (cat.seen > 0 || odd_key))
        s->columns_ok = 0; /* it may decode into a bucket we would not know of */
    if (span->bucket != NO_BUCKET &&
        !read_columns(span, &phase, &ts, &dur, &pid, &tid, &correlation))
        s->columns_ok = 0;

    if (!plain_cat || span->bucket == KERNEL_BUCKET || span->bucket == MEMOP_BUCKET) {
        /* A device event, or an event that might be one (no, an unusual or a repeated
         * category: the decoder decides): kept, with its launch. Kernels that are (or may be)
         * communication are read decoded; with columns, the others need not be. */
        if (plain_cat)
            s->is_device = 1;
        span->name = NO_NAME;
        if (span->bucket == KERNEL_BUCKET && name.seen == 1 && name.plain &&
            name.len < 0xFFFFFFFFL) { /* its kernel class is read from its name (`_columns`) */
            span->name = names_intern(&s->names, name.ptr, (unsigned int)name.len);
            if (span->name == NO_NAME) {
                s->failed = 1;
                return 0;
            }
        }
        span->decoded =
            !plain_cat ||
            (span->bucket == KERNEL_BUCKET &&
             (name.seen != 1 || !name.plain ||
              (span->name == NO_NAME
                   ? names_communication(&rules->comm_substrings, name.ptr, name.len)
                   : name_is_communication(&s->names, span->name, &rules->comm_substrings))));
        if (!note_link(s, &correlation, span->decoded)) {
            s->failed = 1;
            return 0;
        }
        return 1;
    }
    if (in_set(&rules->keep, cat.ptr, cat.len))
        return 1;
    if (span->bucket == LAUNCH_BUCKET) {
        if (correlation.seen == 1 && correlation.plain) {
            span->verdict = LAUNCH;
            span->correlation = correlation.value;
        }
        return 1;
    }
    int named = name.seen == 1 && name.plain;
    if (in_set(&rules->operators, cat.ptr, cat.len)) {
        if (named && !has_prefix(&rules->op_prefixes, name.ptr, name.len))
            span->verdict = OPERATOR;
        return 1;
    }
    if (in_set(&rules->python, cat.ptr, cat.len)) {
        if (named && !has_substring(&rules->py_substrings, name.ptr, name.len))
            span->verdict = DROP;
        return 1;
    }
    span->verdict = DROP; /* a category the analysis does not read at all (flow events, ...) */
    return 1;
}

/* The correlations device events name, as an open-addressing hash set. */
typedef struct {
    long long *keys;
    unsigned char *used;
    size_t mask;
} LinkSet;

static size_t hash_id(long long id) {
    unsigned long long x = (unsigned long long)id + 0x9e3779b97f4a7c15ULL; /* splitmix64 */
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return (size_t)(x ^ (x >> 31));
}

static int build_links(LinkSet *set, const long long *ids, Py_ssize_t n) {
    size_t capacity = 16;
    while (capacity < (size_t)n * 2)
        capacity *= 2;
    set->keys = malloc(capacity * sizeof(long long));
    set->used = calloc(capacity, 1);
    set->mask = capacity - 1;
    if (set->keys == NULL || set->used == NULL)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        size_t slot = hash_id(ids[i]) & set->mask;
        while (set->used[slot] && set->keys[slot] != ids[i])
            slot = (slot + 1) & set->mask;
        set->used[slot] = 1;
        set->keys[slot] = ids[i];
    }
    return 1;
}

static int linked(const LinkSet *set, long long id) {
    size_t slot = hash_id(id) & set->mask;
    while (set->used[slot]) {
        if (set->keys[slot] == id)
            return 1;
        slot = (slot + 1) & set->mask;
    }
    return 0;
}

static Span *push(Scan *s) {
    if (s->count == s->capacity && !grow((void **)&s->spans, &s->capacity, sizeof(Span)))
        return NULL;
    Span *span = &s->spans[s->count++];
    memset(span, 0, sizeof(Span));
    return span;
}

static void release(Scan *s) {
    free(s->spans);
    free(s->linked);
    free(s->decoded_links);
    names_free(&s->names);
}

enum { INVALID = 0, DONE = 1, STOPPED = 2 };

/* The traceEvents elements from `c` (at an element) until the array closes (DONE, `c` past
 * the ']') or `c` lands on `stop` at the start of an element (STOPPED). */
static int scan_elements(Cursor *c, const char *raw, const Rules *rules, Scan *s,
                         const char *stop) {
    for (;;) {
        Span *span = push(s);
        if (span == NULL) {
            s->failed = 1;
            return INVALID;
        }
        span->start = c->p - raw;
        if (c->p < c->end && *c->p == '{') {
            if (!scan_event(c, rules, span, s))
                return INVALID;
        } else if (!scan_value(c, 1)) {
            return INVALID;
        }
        span->end = c->p - raw;
        int next = next_member(c, ']');
        if (next < 0 || (next == 1 && c->p < c->end && *c->p == ']'))
            return INVALID; /* invalid, or a trailing comma */
        if (next == 0) {
            s->array_close = c->p - 1 - raw;
            return DONE;
        }
        if (c->p == stop)
            return STOPPED;
    }
}

/* The top-level members after a value, until the object closes; another traceEvents key is
 * one this scanner leaves to the decoder. The rest of the document is copied as is: its
 * decoder checks it. */
static int scan_other_members(Cursor *c) {
    int escaped;
    for (;;) {
        skip_ws(c);
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            skip_ws(c);
        }
        if (c->p >= c->end || *c->p == '}')
            return 1;
        const char *key = c->p + 1;
        if (*c->p != '"' || !scan_string(c, &escaped))
            return 0;
        if (!escaped && c->p - 1 - key == 11 && memcmp(key, "traceEvents", 11) == 0)
            return 0; /* twice: leave it to the decoder */
        skip_ws(c);
        if (c->p >= c->end || *c->p != ':')
            return 0;
        c->p++;
        skip_ws(c);
        if (!scan_value(c, 1))
            return 0;
    }
}

/* Appends `from` (the scan of a later part of the same array) to `into`. */
static int merge_scans(Scan *into, const Scan *from) {
    while (into->capacity < into->count + from->count)
        if (!grow((void **)&into->spans, &into->capacity, sizeof(Span)))
            return 0;
    memcpy(into->spans + into->count, from->spans, (size_t)from->count * sizeof(Span));
    /* The later part's kernel names, as positions in `into`'s names. */
    unsigned int *remap = NULL;
    if (from->names.count > 0) {
        remap = malloc(from->names.count * sizeof(*remap));
        if (remap == NULL)
            return 0;
        for (unsigned int i = 0; i < from->names.count; i++) {
            remap[i] = names_intern(&into->names, from->names.ptr[i], from->names.len[i]);
            if (remap[i] == NO_NAME) {
                free(remap);
                return 0;
            }
        }
    }
    for (Py_ssize_t i = into->count; i < into->count + from->count; i++) {
        Span *span = &into->spans[i];
        if (span->bucket == KERNEL_BUCKET && span->name != NO_NAME)
            span->name = remap[span->name];
    }
    free(remap);
    into->count += from->count;
    for (Py_ssize_t i = 0; i < from->linked_count; i++)
        if (!append_id(&into->linked, &into->linked_count, &into->linked_capacity,
                       from->linked[i]))
            return 0;
    for (Py_ssize_t i = 0; i < from->decoded_count; i++)
        if (!append_id(&into->decoded_links, &into->decoded_count, &into->decoded_capacity,
                       from->decoded_links[i]))
            return 0;
    into->is_device |= from->is_device;
    into->keep_launches |= from->keep_launches;
    into->columns_ok &= from->columns_ok;
    into->array_close = from->array_close;
    return 1;
}

/* The split settings and counters are read and written by scans running without the GIL
 * (several analyser threads may scan at once): relaxed atomics, so a race is defined. */
#if defined(__GNUC__) || defined(__clang__)
#define ATOMIC_LOAD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define ATOMIC_STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)
#define ATOMIC_INCREMENT(x) __atomic_add_fetch(&(x), 1, __ATOMIC_RELAXED)
#else
#define ATOMIC_LOAD(x) (x)
#define ATOMIC_STORE(x, v) ((x) = (v))
#define ATOMIC_INCREMENT(x) (++(x))
#endif

/* Arrays at least this long are scanned in two halves on two threads (-1: never). */
static Py_ssize_t split_min_bytes = 4 << 20;
/* Splits whose halves joined up, and those abandoned (the split point was no element start):
 * diagnostics for the tests. */
static Py_ssize_t splits_joined, splits_abandoned;

/* A likely element start near the middle of [from, end): a '{' after "}," (whitespace
 * allowed). Only likely: it may lie inside a string, which the first half's scan finds out. */
static const char *split_point(const char *from, const char *end) {
    const char *p = from + (end - from) / 2;
    const char *limit = end - p > (1 << 20) ? p + (1 << 20) : end; /* look no further */
    while ((p = memchr(p, '}', (size_t)(limit - p))) != NULL) {
        Cursor c = {p + 1, end};
        skip_ws(&c);
        if (c.p < end && *c.p == ',') {
            c.p++;
            skip_ws(&c);
            if (c.p < end && *c.p == '{')
                return c.p;
        }
        p++;
    }
    return NULL;
}

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#define HAVE_THREADS 1

typedef struct {
    const char *raw, *start, *end;
    const Rules *rules;
    Scan s;
    int ok;
} Half;

/* The second half: its elements, then the rest of the document. */
static void *scan_second_half(void *arg) {
    Half *half = arg;
    Cursor c = {half->start, half->end};
    half->ok = scan_elements(&c, half->raw, half->rules, &half->s, NULL) == DONE &&
               scan_other_members(&c);
    return NULL;
}
#endif

/* Find the top-level traceEvents array and classify its elements. No Python calls. */
static int scan_document(const char *raw, Py_ssize_t n, const Rules *rules, Scan *s) {
    Cursor c = {raw, raw + n};
    int escaped;
    skip_ws(&c);
    if (c.p >= c.end || *c.p != '{')
        return 0;
    c.p++;
    skip_ws(&c);
    for (;;) { /* the members before traceEvents */
        const char *key = c.p + 1;
        if (c.p >= c.end || *c.p != '"' || !scan_string(&c, &escaped))
            return 0;
        int is_events = !escaped && c.p - 1 - key == 11 && memcmp(key, "traceEvents", 11) == 0;
        skip_ws(&c);
        if (c.p >= c.end || *c.p != ':')
            return 0;
        c.p++;
        skip_ws(&c);
        if (is_events)
            break;
        if (!scan_value(&c, 1))
            return 0;
        skip_ws(&c);
        if (c.p < c.end && *c.p == ',') {
            c.p++;
            skip_ws(&c);
        }
        if (c.p >= c.end || *c.p == '}')
            return 0; /* no traceEvents */
    }
    if (c.p >= c.end || *c.p != '[')
        return 0; /* not an array: leave it to the decoder */
    s->array_open = c.p - raw;
    c.p++;
    skip_ws(&c);
    if (c.p < c.end && *c.p == ']')
        return 0; /* no events: nothing to leave out */

#ifdef HAVE_THREADS
    const char *split = NULL;
    Py_ssize_t split_min = ATOMIC_LOAD(split_min_bytes);
    if (split_min >= 0 && c.end - c.p >= split_min)
        split = split_point(c.p, c.end);
    Half half = {raw, split, c.end, rules, {0}, 0};
    pthread_t thread;
    half.s.columns_ok = 1;
    if (split != NULL && pthread_create(&thread, NULL, scan_second_half, &half) != 0)
        split = NULL;
    int first = scan_elements(&c, raw, rules, s, split);
    if (split != NULL) {
        pthread_join(thread, NULL);
        /* Landing on the split point proves it an element start: the halves join up. */
        int joined = first == STOPPED && half.ok && !half.s.failed;
        if (first == STOPPED)
            ATOMIC_INCREMENT(splits_joined);
        else
            ATOMIC_INCREMENT(splits_abandoned);
        if (joined && !merge_scans(s, &half.s))
            s->failed = 1;
        s->failed |= half.s.failed;
        release(&half.s);
        if (first == STOPPED)
            return joined && !s->failed;
    }
#else
    int first = scan_elements(&c, raw, rules, s, NULL);
#endif
    return first == DONE && scan_other_members(&c);
}

static void free_links(LinkSet *set) {
    free(set->keys);
    free(set->used);
}

/* Every span's final verdict: KEEP, COLUMNS or DROP; the number in the document, or -1 if out
 * of memory. With certain columns ("lean"), device events the analysis reads only as numbers
 * and launches only they name go to the columns alone. */
static Py_ssize_t resolve(Scan *s) {
    LinkSet links = {0}, decoded = {0};
    Py_ssize_t kept = 0;
    int prune = !s->keep_launches, lean = prune && s->columns_ok;
    if ((prune && !build_links(&links, s->linked, s->linked_count)) ||
        (lean && !build_links(&decoded, s->decoded_links, s->decoded_count))) {
        free_links(&links);
        free_links(&decoded);
        return -1;
    }
    for (Py_ssize_t i = 0; i < s->count; i++) {
        Span *span = &s->spans[i];
        if (span->verdict == OPERATOR) /* on a host-only trace every operator is compute */
            span->verdict = s->is_device ? DROP : KEEP;
        else if (span->verdict == LAUNCH && !prune)
            span->verdict = KEEP;
        else if (span->verdict == LAUNCH && lean)
            span->verdict = linked(&decoded, span->correlation)
                                ? KEEP
                                : (linked(&links, span->correlation) ? COLUMNS : DROP);
        else if (span->verdict == LAUNCH)
            span->verdict = linked(&links, span->correlation) ? KEEP : DROP;
        else if (lean && span->verdict == KEEP && !span->decoded &&
                 (span->bucket == KERNEL_BUCKET || span->bucket == MEMOP_BUCKET))
            span->verdict = COLUMNS;
        kept += span->verdict == KEEP;
    }
    free_links(&links);
    free_links(&decoded);
    return kept;
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

/* The columns of the device events and launches kept (in the document or not), in file order:
 * one RECORD_SIZE record each, little-endian: ts f8, dur f8, pid i8, correlation i8, tid i8,
 * bucket u1, has_correlation u1, in_document u1, (pad u1), name u4: a kernel's position in
 * the list of distinct kernel names returned beside the records (NO_NAME: none read). */
#define RECORD_SIZE 48

/* (records, names): the columns and the distinct kernel names they point into. */
static PyObject *columns_of(const Scan *s) {
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < s->count; i++)
        n += in_columns(&s->spans[i]);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * RECORD_SIZE);
    if (out == NULL)
        return NULL;
    char *dst = PyBytes_AS_STRING(out);
    memset(dst, 0, (size_t)(n * RECORD_SIZE));
    for (Py_ssize_t i = 0; i < s->count; i++) {
        const Span *span = &s->spans[i];
        if (!in_columns(span))
            continue;
        memcpy(dst, &span->ts, 8);
        memcpy(dst + 8, &span->dur, 8);
        memcpy(dst + 16, &span->pid, 8);
        memcpy(dst + 24, &span->correlation, 8);
        memcpy(dst + 32, &span->tid, 8);
        dst[40] = (char)span->bucket;
        dst[41] = (char)span->has_correlation;
        dst[42] = (char)(span->verdict == KEEP);
        unsigned int name = span->bucket == KERNEL_BUCKET ? span->name : NO_NAME;
        memcpy(dst + 44, &name, 4);
        dst += RECORD_SIZE;
    }
    PyObject *list = names_list(&s->names);
    if (list == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    return Py_BuildValue("(NN)", out, list);
}

/* The document without the events left out (None: nothing left out), and the columns. */
static PyObject *selected_document(const char *raw, Py_ssize_t n, Scan *s, Py_ssize_t kept) {
    if (kept == s->count)
        Py_RETURN_NONE;
    Py_ssize_t size = s->array_open + 1 + (n - s->array_close);
    for (Py_ssize_t i = 0; i < s->count; i++)
        if (s->spans[i].verdict == KEEP)
            size += s->spans[i].end - s->spans[i].start + 1; /* and a comma */
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL)
        return NULL;
    char *start = PyBytes_AS_STRING(out), *dst = start;
    Py_BEGIN_ALLOW_THREADS
    memcpy(dst, raw, (size_t)(s->array_open + 1));
    dst += s->array_open + 1;
    int first = 1;
    for (Py_ssize_t i = 0; i < s->count; i++) {
        const Span *span = &s->spans[i];
        if (span->verdict != KEEP)
            continue;
        if (!first)
            *dst++ = ',';
        first = 0;
        memcpy(dst, raw + span->start, (size_t)(span->end - span->start));
        dst += span->end - span->start;
    }
    memcpy(dst, raw + s->array_close, (size_t)(n - s->array_close));
    dst += n - s->array_close;
    Py_END_ALLOW_THREADS
    /* `size` counted a comma per kept event; the first has none. */
    if (_PyBytes_Resize(&out, dst - start) < 0)
        return NULL;
    return out;
}

static PyObject *select_events(PyObject *module, PyObject *args) {
    PyObject *raw_obj, *keep, *kernels, *memops, *launches, *operators, *op_prefixes, *python;
    PyObject *py_substrings, *comm_substrings;
    Rules rules;
    Scan s = {0};
    int ok;
    Py_ssize_t kept = 0;
    (void)module;
    if (!PyArg_ParseTuple(args, "SOOOOOOOOO:select_events", &raw_obj, &keep, &kernels, &memops,
                          &launches, &operators, &op_prefixes, &python, &py_substrings,
                          &comm_substrings))
        return NULL;
    if (!read_set(keep, &rules.keep) || !read_set(kernels, &rules.kernels) ||
        !read_set(memops, &rules.memops) || !read_set(launches, &rules.launches) ||
        !read_set(operators, &rules.operators) || !read_set(op_prefixes, &rules.op_prefixes) ||
        !read_set(python, &rules.python) || !read_set(py_substrings, &rules.py_substrings) ||
        !read_set(comm_substrings, &rules.comm_substrings))
        return NULL;
    const char *raw = PyBytes_AS_STRING(raw_obj);
    Py_ssize_t n = PyBytes_GET_SIZE(raw_obj);
    s.columns_ok = 1;

    Py_BEGIN_ALLOW_THREADS
    ok = scan_document(raw, n, &rules, &s);
    if (ok)
        kept = resolve(&s);
    Py_END_ALLOW_THREADS
    if (s.failed || kept < 0) {
        release(&s);
        return PyErr_NoMemory();
    }
    if (!ok) {
        release(&s);
        return Py_BuildValue("(OO)", Py_None, Py_None);
    }
    PyObject *document = selected_document(raw, n, &s, kept);
    PyObject *columns =
        document != NULL && s.columns_ok ? columns_of(&s) : Py_NewRef(Py_None);
    release(&s);
    if (document == NULL || columns == NULL) {
        Py_XDECREF(document);
        Py_XDECREF(columns);
        return NULL;
    }
    return Py_BuildValue("(NN)", document, columns);
}

static PyObject *set_split_min_bytes(PyObject *module, PyObject *args) {
    Py_ssize_t value;
    (void)module;
    if (!PyArg_ParseTuple(args, "n:set_split_min_bytes", &value))
        return NULL;
    Py_ssize_t previous = ATOMIC_LOAD(split_min_bytes);
    ATOMIC_STORE(split_min_bytes, value);
    return PyLong_FromSsize_t(previous);
}

static PyObject *split_counts(PyObject *module, PyObject *args) {
    (void)module;
    (void)args;
    return Py_BuildValue("(nn)", ATOMIC_LOAD(splits_joined), ATOMIC_LOAD(splits_abandoned));
}

static PyMethodDef methods[] = {
    {"split_counts", split_counts, METH_NOARGS,
     "split_counts() -> (joined, abandoned): two-half scans so far. For tests."},
    {"set_split_min_bytes", set_split_min_bytes, METH_VARARGS,
     "set_split_min_bytes(n) -> previous: arrays of at least n bytes are scanned on two threads"
     " (-1: never). For tests."},
    {"select_events", select_events, METH_VARARGS,
     "select_events(raw, keep, kernels, memops, launches, operators, operator_prefixes, python,"
     " python_substrings, communication_substrings)"
     " -> (document, (records, kernel names)): see _select.py and _columns.py."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_select_c", "Kineto event pre-filter (see _select.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__select_c(void) {
#ifdef HAVE_STRTOD_L
    c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0); /* none: long numbers go uncertain */
#endif
    return PyModule_Create(&module);
}
