/* Kineto's trace events parsed in compiled code (native.py says how it is used).

   scan() reads one region of a trace's `traceEvents` array: whole events (JSON objects)
   separated by commas, exactly the regions reader.py hands its parsers. It validates the
   JSON and emits, for the events reader.py keeps, the columns its pyarrow path produces
   before the Kineto-specific work that both share (reader._finish_chunk): the kind, the
   name and category coded against the region's own lists (in order of first appearance),
   and the integer columns (ts and dur in exact nanoseconds).

   The contract that keeps the two paths identical: wherever the pyarrow path would not
   read a region in one go (a value of an odd type, a time with more than three decimals,
   a separator pattern inside an event, invalid UTF-8 in a kept name, anything that is not
   plain JSON), scan() reads nothing and says why, and the caller parses that region with
   the pyarrow path. So this parser may be stricter than pyarrow, never more lenient, and
   where it does read, it reads what pyarrow reads.

   The scan runs without the GIL; the input stays alive and unchanged through the buffer
   the caller passes (a bytearray view held for the call). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MISSING (-1)
#define MAX_SPACE 32   /* reader._MAX_SPACE: whitespace a separator may hold per gap */
#define MAX_DEPTH 4096 /* nesting inside an event that is skipped; deeper: the slow path */

/* The integer columns, in the order of native.INT_COLUMNS. */
enum {
    COL_TS, COL_DUR, COL_PID, COL_TID,
    ARG_EXTERNAL_ID, ARG_CORRELATION, ARG_DEVICE, ARG_STREAM, ARG_BYTES, ARG_ALLOC_BYTES,
    ARG_TOTAL_ALLOCATED, ARG_DEVICE_ID, ARG_TOTAL_RESERVED, ARG_ADDR, ARG_DEVICE_TYPE,
    N_INT
};
#define N_ARGS (N_INT - ARG_EXTERNAL_ID)
static const char *const ARG_NAMES[N_ARGS] = {
    "External id", "correlation", "device", "stream", "bytes", "Bytes",
    "Total Allocated", "Device Id", "Total Reserved", "Addr", "Device Type",
};

/* --- growable columns and string tables ------------------------------------------- */

typedef struct {
    Py_ssize_t rows, capacity;
    int8_t *kind;
    int32_t *name, *category;
    int64_t *ints[N_INT];
} Columns;

static void columns_free(Columns *c) {
    free(c->kind);
    free(c->name);
    free(c->category);
    for (int i = 0; i < N_INT; i++) free(c->ints[i]);
    memset(c, 0, sizeof(*c));
}

static int columns_grow(Columns *c, Py_ssize_t region) {
    /* first: about one kept event per 128 bytes (Kineto's are 150-400); pages never
       written are never resident */
    Py_ssize_t capacity = c->capacity ? 2 * c->capacity : (region / 128 > 4096 ? region / 128 : 4096);
    void *p;
    if (!(p = realloc(c->kind, (size_t)capacity))) return -1;
    c->kind = p;
    if (!(p = realloc(c->name, (size_t)capacity * 4))) return -1;
    c->name = p;
    if (!(p = realloc(c->category, (size_t)capacity * 4))) return -1;
    c->category = p;
    for (int i = 0; i < N_INT; i++) {
        if (!(p = realloc(c->ints[i], (size_t)capacity * 8))) return -1;
        c->ints[i] = p;
    }
    c->capacity = capacity;
    return 0;
}

/* Distinct strings in order of first appearance; open addressing on a 64-bit hash. */
typedef struct {
    const uint8_t *bytes;
    Py_ssize_t length;
    uint64_t hash;
    int owned; /* decoded from escapes: a copy of its own */
} Entry;

typedef struct {
    Entry *entries; /* by code */
    Py_ssize_t count, entry_capacity;
    int32_t *slots; /* code + 1, 0: empty */
    Py_ssize_t slot_mask;
} Strings;

static void strings_free(Strings *s) {
    for (Py_ssize_t i = 0; i < s->count; i++)
        if (s->entries[i].owned) free((void *)s->entries[i].bytes);
    free(s->entries);
    free(s->slots);
    memset(s, 0, sizeof(*s));
}

static uint64_t hash_bytes(const uint8_t *p, Py_ssize_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, (size_t)n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ULL;
    return h ^ (h >> 29);
}

static int strings_rehash(Strings *s, Py_ssize_t slots) {
    int32_t *table = calloc((size_t)slots, sizeof(int32_t));
    if (!table) return -1;
    for (Py_ssize_t i = 0; i < s->count; i++) {
        Py_ssize_t at = (Py_ssize_t)(s->entries[i].hash & (uint64_t)(slots - 1));
        while (table[at]) at = (at + 1) & (slots - 1);
        table[at] = (int32_t)(i + 1);
    }
    free(s->slots);
    s->slots = table;
    s->slot_mask = slots - 1;
    return 0;
}

/* The code of `bytes` (added if new; `copy`: the bytes do not outlive the call), or -1. */
static int32_t strings_code(Strings *s, const uint8_t *bytes, Py_ssize_t length, int copy) {
    if (!s->slots && strings_rehash(s, 1024) < 0) return -1;
    uint64_t h = hash_bytes(bytes, length);
    Py_ssize_t at = (Py_ssize_t)(h & (uint64_t)s->slot_mask);
    while (s->slots[at]) {
        Entry *e = &s->entries[s->slots[at] - 1];
        if (e->hash == h && e->length == length && memcmp(e->bytes, bytes, (size_t)length) == 0) return s->slots[at] - 1;
        at = (at + 1) & s->slot_mask;
    }
    if (s->count >= INT32_MAX - 1) return -1;
    if (s->count == s->entry_capacity) {
        Py_ssize_t capacity = s->entry_capacity ? 2 * s->entry_capacity : 256;
        Entry *grown = realloc(s->entries, (size_t)capacity * sizeof(Entry));
        if (!grown) return -1;
        s->entries = grown;
        s->entry_capacity = capacity;
    }
    const uint8_t *kept = bytes;
    if (copy) {
        uint8_t *own = malloc((size_t)length + 1);
        if (!own) return -1;
        memcpy(own, bytes, (size_t)length);
        kept = own;
    }
    s->entries[s->count] = (Entry){kept, length, h, copy};
    s->slots[at] = (int32_t)(s->count + 1);
    s->count++;
    if (2 * s->count > s->slot_mask && strings_rehash(s, 2 * (s->slot_mask + 1)) < 0) return -1;
    return (int32_t)(s->count - 1);
}

/* --- the scanner ------------------------------------------------------------------ */

typedef struct {
    const uint8_t *start, *p, *end;
    const char *why;      /* why the region is left to the pyarrow path */
    const uint8_t *where; /* and where */
} Scan;

typedef struct {
    const uint8_t *p; /* the raw text between the quotes */
    Py_ssize_t length;
    int escaped;
    int present; /* 1: a string, 0: absent or null */
} Str;

#define GIVE_UP(S, reason) do { (S)->why = (reason); (S)->where = (S)->p; return -1; } while (0)

static uint8_t IS_SPACE[256];
static uint8_t STRING_STOP[256]; /* '"', '\\', '}' and control characters */
static uint8_t PLAIN_KEY[256];   /* printable ASCII but '"', '\\' and '}' */

static inline void skip_space(Scan *S) {
    const uint8_t *p = S->p, *end = S->end;
    /* nearly always none or one: every byte above ' ' ends it at once */
    if (p < end && *p > ' ') return;
    while (p < end && IS_SPACE[*p]) p++;
    S->p = p;
}

/* Up to MAX_SPACE whitespace bytes from `p`, like reader._skip_spaces. */
static inline const uint8_t *skip_few(const uint8_t *p, const uint8_t *end) {
    for (int i = 0; i < MAX_SPACE && p < end && IS_SPACE[*p]; i++) p++;
    return p;
}

/* Whether the `}` at `close` is followed by `,` `{` `"` (whitespace between, as
   reader._find_separators allows it): the pattern reader.py takes for a boundary
   between two events. Returns the `{`, or NULL. */
static const uint8_t *separator_after(const uint8_t *close, const uint8_t *end) {
    const uint8_t *comma = skip_few(close + 1, end);
    if (comma >= end || *comma != ',') return NULL;
    const uint8_t *brace = skip_few(comma + 1, end);
    if (brace >= end || *brace != '{') return NULL;
    const uint8_t *quote = skip_few(brace + 1, end);
    if (quote >= end || *quote != '"') return NULL;
    return brace;
}

static inline int hex_value(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_hex4(const uint8_t *p, const uint8_t *end) {
    if (end - p < 4) return -1;
    int value = 0;
    for (int i = 0; i < 4; i++) {
        int nibble = hex_value(p[i]);
        if (nibble < 0) return -1;
        value = value * 16 + nibble;
    }
    return value;
}

/* The first '"', '\\', '}' or control character in [p, end), or end. */
#if defined(__SSE2__)
#include <emmintrin.h>
static inline const uint8_t *string_stop(const uint8_t *p, const uint8_t *end) {
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), brace = _mm_set1_epi8('}'), control = _mm_set1_epi8(0x1F);
    while (end - p >= 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)p);
        __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, backslash)),
                                   _mm_or_si128(_mm_cmpeq_epi8(x, brace), _mm_cmpeq_epi8(_mm_max_epu8(x, control), control)));
        int mask = _mm_movemask_epi8(hit);
        if (mask) return p + __builtin_ctz((unsigned)mask);
        p += 16;
    }
    while (p < end && !STRING_STOP[*p]) p++;
    return p;
}
#else
static inline const uint8_t *string_stop(const uint8_t *p, const uint8_t *end) {
    while (p < end && !STRING_STOP[*p]) p++;
    return p;
}
#endif

/* A string at S->p (its opening quote); leaves S->p after the closing quote. */
static int scan_string(Scan *S, Str *out) {
    const uint8_t *p = S->p + 1, *end = S->end;
    int escaped = 0;
    for (;;) {
        p = string_stop(p, end);
        if (p >= end) { S->p = p; GIVE_UP(S, "a string runs past the region"); }
        uint8_t c = *p;
        if (c == '"') break;
        if (c == '\\') {
            escaped = 1;
            if (p + 1 >= end) { S->p = p; GIVE_UP(S, "a string runs past the region"); }
            uint8_t e = p[1];
            if (e == 'u') {
                int unit = read_hex4(p + 2, end);
                if (unit < 0) { S->p = p; GIVE_UP(S, "a bad \\u escape"); }
                p += 6;
                if (unit >= 0xD800 && unit <= 0xDBFF) {
                    int low = (end - p >= 6 && p[0] == '\\' && p[1] == 'u') ? read_hex4(p + 2, end) : -1;
                    if (low < 0xDC00 || low > 0xDFFF) { S->p = p; GIVE_UP(S, "a lone surrogate escape"); }
                    p += 6;
                } else if (unit >= 0xDC00 && unit <= 0xDFFF) {
                    S->p = p;
                    GIVE_UP(S, "a lone surrogate escape");
                }
                continue;
            }
            if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
                p += 2;
                continue;
            }
            S->p = p;
            GIVE_UP(S, "a bad escape in a string");
        }
        if (c == '}') {
            /* reader.py would cut the region here (it looks for the pattern everywhere) */
            if (separator_after(p, end)) { S->p = p; GIVE_UP(S, "an event separator inside a string"); }
            p++;
            continue;
        }
        S->p = p;
        GIVE_UP(S, "a control character in a string");
    }
    out->p = S->p + 1;
    out->length = p - (S->p + 1);
    out->escaped = escaped;
    out->present = 1;
    S->p = p + 1;
    return 0;
}

/* The UTF-8 of a string with escapes (validated by scan_string) into `into` (room for
   `length` bytes: decoding never lengthens). Returns the decoded length. */
static Py_ssize_t decode_string(const uint8_t *p, Py_ssize_t length, uint8_t *into) {
    const uint8_t *end = p + length;
    uint8_t *o = into;
    while (p < end) {
        if (*p != '\\') { *o++ = *p++; continue; }
        uint8_t e = p[1];
        p += 2;
        switch (e) {
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            uint32_t cp = (uint32_t)read_hex4(p, end);
            p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t low = (uint32_t)read_hex4(p + 2, end);
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            }
            if (cp < 0x80) *o++ = (uint8_t)cp;
            else if (cp < 0x800) { *o++ = (uint8_t)(0xC0 | (cp >> 6)); *o++ = (uint8_t)(0x80 | (cp & 0x3F)); }
            else if (cp < 0x10000) {
                *o++ = (uint8_t)(0xE0 | (cp >> 12));
                *o++ = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
                *o++ = (uint8_t)(0x80 | (cp & 0x3F));
            } else {
                *o++ = (uint8_t)(0xF0 | (cp >> 18));
                *o++ = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
                *o++ = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
                *o++ = (uint8_t)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default: *o++ = e; break; /* '"', '\\', '/' */
        }
    }
    return o - into;
}

typedef struct {
    int negative;
    const uint8_t *digits; /* integer part */
    Py_ssize_t int_length;
    const uint8_t *fraction;
    Py_ssize_t fraction_length;
    int has_exponent;
    long exponent;
} Number;

/* A JSON number at S->p (RFC 8259's grammar, nothing more). Exponents are accepted
   where a double holds the value (pyarrow's parser fails on the others). */
static int scan_number(Scan *S, Number *n) {
    const uint8_t *p = S->p, *end = S->end;
    memset(n, 0, sizeof(*n));
    if (p < end && *p == '-') { n->negative = 1; p++; }
    if (p >= end || *p < '0' || *p > '9') GIVE_UP(S, "a malformed number");
    n->digits = p;
    if (*p == '0') p++;
    else while (p < end && *p >= '0' && *p <= '9') p++;
    n->int_length = p - n->digits;
    if (p < end && *p == '.') {
        p++;
        n->fraction = p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        n->fraction_length = p - n->fraction;
        if (!n->fraction_length) { S->p = p; GIVE_UP(S, "a malformed number"); }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        int negative = 0;
        if (p < end && (*p == '+' || *p == '-')) negative = *p++ == '-';
        const uint8_t *first = p;
        long value = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            if (value < 100000) value = value * 10 + (*p - '0');
            p++;
        }
        if (p == first) { S->p = p; GIVE_UP(S, "a malformed number"); }
        n->has_exponent = 1;
        n->exponent = negative ? -value : value;
    }
    S->p = p;
    if (n->int_length > 300 || (n->has_exponent && (n->exponent > 300 - n->int_length || n->exponent < -300)))
        GIVE_UP(S, "a number out of a double's range");
    return 0;
}

/* The number times 10^places as an exact int64, or -1: no exponent, and no non-zero digit
   beyond `places` decimals (those pyarrow's decimal would round). */
static int number_to_scaled(const Number *n, Py_ssize_t places, int64_t *out) {
    if (n->has_exponent || n->int_length > 19) return -1;
    for (Py_ssize_t i = places; i < n->fraction_length; i++)
        if (n->fraction[i] != '0') return -1;
    uint64_t value = 0;
    for (Py_ssize_t i = 0; i < n->int_length + places; i++) {
        Py_ssize_t f = i - n->int_length;  /* the decimal's index once past the integer part */
        uint64_t d = f < 0 ? (uint64_t)(n->digits[i] - '0') : f < n->fraction_length ? (uint64_t)(n->fraction[f] - '0') : 0;
        if (value > (UINT64_MAX - d) / 10) return -1;
        value = value * 10 + d;
    }
    if (n->negative) {
        if (value > (uint64_t)INT64_MAX + 1) return -1;
        *out = (int64_t)(0 - value);
    } else {
        if (value > (uint64_t)INT64_MAX) return -1;
        *out = (int64_t)value;
    }
    return 0;
}

/* An integer that fits int64 (pyarrow reads nothing else into an int64 column). */
static int number_to_int64(const Number *n, int64_t *out) {
    return n->fraction ? -1 : number_to_scaled(n, 0, out);
}

/* Microseconds with at most three decimal places (more places: only zeros) as exact
   nanoseconds, as pyarrow's decimal(38, 3) then reader._micros_to_ns read them. */
static int number_to_ns(const Number *n, int64_t *out) {
    return number_to_scaled(n, 3, out);
}

/* The general path of the int and time readers below: the whole JSON number grammar, then
   `convert`; a number it refuses gives up at the number's start, with `refused` as the reason. */
static int read_general_number(Scan *S, int (*convert)(const Number *, int64_t *), int64_t *out, const char *refused) {
    Number n;
    const uint8_t *at = S->p;
    if (scan_number(S, &n) < 0) return -1;
    if (convert(&n, out) < 0) { S->p = at; GIVE_UP(S, refused); }
    return 0;
}

static int expect_literal(Scan *S, const char *word, size_t length) {
    if ((size_t)(S->end - S->p) < length || memcmp(S->p, word, length) != 0) GIVE_UP(S, "an invalid value");
    S->p += length;
    return 0;
}

/* Skip one JSON value of any shape, without recursion. */
static int skip_value(Scan *S) {
    uint8_t stack[MAX_DEPTH];
    int depth = 0;
    Str ignored;
    Number number;
value:
    skip_space(S);
    if (S->p >= S->end) GIVE_UP(S, "a value runs past the region");
    switch (*S->p) {
    case '"':
        if (scan_string(S, &ignored) < 0) return -1;
        goto after_value;
    case '{':
        S->p++;
        skip_space(S);
        if (S->p < S->end && *S->p == '}') {
            if (separator_after(S->p, S->end)) GIVE_UP(S, "an event separator inside an event");
            S->p++;
            goto after_value;
        }
        if (depth == MAX_DEPTH) GIVE_UP(S, "nested too deep");
        stack[depth++] = '{';
        goto member;
    case '[':
        S->p++;
        skip_space(S);
        if (S->p < S->end && *S->p == ']') { S->p++; goto after_value; }
        if (depth == MAX_DEPTH) GIVE_UP(S, "nested too deep");
        stack[depth++] = '[';
        goto value;
    case 't':
        if (expect_literal(S, "true", 4) < 0) return -1;
        goto after_value;
    case 'f':
        if (expect_literal(S, "false", 5) < 0) return -1;
        goto after_value;
    case 'n':
        if (expect_literal(S, "null", 4) < 0) return -1;
        goto after_value;
    default:
        if (scan_number(S, &number) < 0) return -1;
        goto after_value;
    }
member:
    skip_space(S);
    if (S->p >= S->end || *S->p != '"') GIVE_UP(S, "an object member without a name");
    if (scan_string(S, &ignored) < 0) return -1;
    skip_space(S);
    if (S->p >= S->end || *S->p != ':') GIVE_UP(S, "a missing ':'");
    S->p++;
    goto value;
after_value:
    if (depth == 0) return 0;
    skip_space(S);
    if (S->p >= S->end) GIVE_UP(S, "a value runs past the region");
    if (*S->p == ',') {
        S->p++;
        if (stack[depth - 1] == '{') goto member;
        goto value;
    }
    if (stack[depth - 1] == '{' && *S->p == '}') {
        if (separator_after(S->p, S->end)) GIVE_UP(S, "an event separator inside an event");
        S->p++;
        depth--;
        goto after_value;
    }
    if (stack[depth - 1] == '[' && *S->p == ']') {
        S->p++;
        depth--;
        goto after_value;
    }
    GIVE_UP(S, "a missing ',' or closing bracket");
}

/* A value that is a string or null (ph, cat, name). */
static int read_string_value(Scan *S, Str *out) {
    if (S->p < S->end && *S->p == '"') return scan_string(S, out);
    if (S->p < S->end && *S->p == 'n') {
        out->present = 0;
        return expect_literal(S, "null", 4);
    }
    GIVE_UP(S, "a name, category or phase that is not a string");
}

/* An integer value or null (-1); `strings`: a string reads as null too (pid, tid). */
static int read_int_value(Scan *S, int64_t *out, int strings, const uint8_t *after_key) {
    if (S->p >= S->end) GIVE_UP(S, "a value runs past the region");
    uint8_t c = *S->p;
    if (c == 'n') {
        *out = MISSING;
        return expect_literal(S, "null", 4);
    }
    if (c == '"' && strings) {
        /* reader._rename_string_ids renames `"pid": "` and `"pid":"` (Kineto's "Spans",
           "Traces") and reads them as null; another spacing sends the region to the slow
           parser, which reads numeric strings as numbers: leave those regions to it. */
        Py_ssize_t gap = S->p - after_key;
        if (!(gap == 1 || (gap == 2 && after_key[1] == ' '))) GIVE_UP(S, "a string pid/tid spaced unusually");
        Str ignored;
        if (scan_string(S, &ignored) < 0) return -1;
        *out = MISSING;
        return 0;
    }
    if (c != '-' && (c < '0' || c > '9')) GIVE_UP(S, "an integer field that is not an integer");
    {
        /* the usual: at most 18 digits, no fraction, no exponent (else the general path) */
        const uint8_t *p = S->p + (c == '-'), *end = S->end, *first = p;
        uint64_t value = 0;
        while (p < end && (unsigned)(*p - '0') < 10 && p - first < 18) value = value * 10 + (uint64_t)(*p++ - '0');
        Py_ssize_t digits = p - first;
        if (digits > 0 && digits < 18 && !(first[0] == '0' && digits > 1) && (p >= end || (*p != '.' && *p != 'e' && *p != 'E' && (unsigned)(*p - '0') >= 10))) {
            *out = c == '-' ? -(int64_t)value : (int64_t)value;
            S->p = p;
            return 0;
        }
    }
    return read_general_number(S, number_to_int64, out, "an integer field that is not an int64");
}

static int read_time_value(Scan *S, int64_t *out) {
    if (S->p >= S->end) GIVE_UP(S, "a value runs past the region");
    uint8_t c = *S->p;
    if (c == 'n') {
        *out = 0; /* reader._micros_to_ns: a missing time is 0 */
        return expect_literal(S, "null", 4);
    }
    if (c != '-' && (c < '0' || c > '9')) GIVE_UP(S, "a time that is not a number");
    {
        /* the usual: at most 15 integer digits and 1-3 decimals, no exponent */
        const uint8_t *p = S->p + (c == '-'), *end = S->end, *first = p;
        uint64_t value = 0;
        while (p < end && (unsigned)(*p - '0') < 10 && p - first < 16) value = value * 10 + (uint64_t)(*p++ - '0');
        Py_ssize_t digits = p - first;
        if (digits > 0 && digits < 16 && !(first[0] == '0' && digits > 1)) {
            int places = 0;
            if (p + 1 < end && *p == '.' && (unsigned)(p[1] - '0') < 10) {
                p++;
                while (p < end && (unsigned)(*p - '0') < 10 && places < 4) { value = value * 10 + (uint64_t)(*p++ - '0'); places++; }
            }
            if (places < 4 && (p >= end || (*p != '.' && *p != 'e' && *p != 'E' && (unsigned)(*p - '0') >= 10))) {
                for (; places < 3; places++) value *= 10;
                *out = c == '-' ? -(int64_t)value : (int64_t)value;
                S->p = p;
                return 0;
            }
        }
    }
    return read_general_number(S, number_to_ns, out, "a time with more than three decimals or beyond int64 ns");
}

static inline int key_is(const Str *key, const char *name, Py_ssize_t length) {
    return key->length == length && memcmp(key->p, name, (size_t)length) == 0;
}

static Py_ssize_t ARG_LENGTHS[N_ARGS];

static int arg_index(const Str *key) {
    for (int i = 0; i < N_ARGS; i++)
        if (key->length == ARG_LENGTHS[i] && key->p[0] == (uint8_t)ARG_NAMES[i][0] && memcmp(key->p, ARG_NAMES[i], (size_t)key->length) == 0) return i;
    return -1;
}

/* Member name and ':' at S->p; leaves S->p at the value. */
static int read_key(Scan *S, Str *key, const uint8_t **after_key) {
    if (S->p >= S->end || *S->p != '"') GIVE_UP(S, "an object member without a name");
    /* Kineto's keys are short plain ASCII: found without scan_string's general loop */
    const uint8_t *q = S->p + 1;
    while (q < S->end && PLAIN_KEY[*q]) q++;
    if (q < S->end && *q == '"') {
        key->p = S->p + 1;
        key->length = q - key->p;
        key->escaped = 0;
        key->present = 1;
        S->p = q + 1;
    } else {
        if (scan_string(S, key) < 0) return -1;
        if (key->escaped) GIVE_UP(S, "a member name with escapes");
    }
    *after_key = S->p;
    if (S->p < S->end && *S->p == ':') S->p++;
    else {
        skip_space(S);
        if (S->p >= S->end || *S->p != ':') GIVE_UP(S, "a missing ':'");
        S->p++;
    }
    skip_space(S);
    if (S->p >= S->end) GIVE_UP(S, "a value runs past the region");
    return 0;
}

/* The `args` object (S->p at '{'): the integer fields reader.py reads. */
static int read_args(Scan *S, int64_t *ints, unsigned *seen) {
    S->p++;
    skip_space(S);
    if (S->p < S->end && *S->p == '}') goto close;
    for (;;) {
        Str key;
        const uint8_t *after_key;
        if (read_key(S, &key, &after_key) < 0) return -1;
        int index = arg_index(&key);
        if (index >= 0) {
            if (*seen & (1u << index)) GIVE_UP(S, "an args field given twice");
            *seen |= 1u << index;
            if (read_int_value(S, &ints[ARG_EXTERNAL_ID + index], 0, after_key) < 0) return -1;
        } else if (skip_value(S) < 0) {
            return -1;
        }
        skip_space(S);
        if (S->p >= S->end) GIVE_UP(S, "an event runs past the region");
        if (*S->p == ',') { S->p++; skip_space(S); continue; }
        if (*S->p == '}') break;
        GIVE_UP(S, "a missing ',' or '}' in args");
    }
close:
    if (separator_after(S->p, S->end)) GIVE_UP(S, "an event separator inside an event");
    S->p++;
    return 0;
}

enum { KEY_PH = 1, KEY_CAT = 2, KEY_NAME = 4, KEY_PID = 8, KEY_TID = 16, KEY_TS = 32, KEY_DUR = 64, KEY_ARGS = 128 };

typedef struct {
    Str ph, cat, name;
    int64_t ints[N_INT];
} Event;

/* One event (S->p at its '{'); leaves S->p after its '}'. */
static int read_event(Scan *S, Event *ev) {
    unsigned seen = 0, args_seen = 0;
    memset(&ev->ph, 0, sizeof(Str));
    memset(&ev->cat, 0, sizeof(Str));
    memset(&ev->name, 0, sizeof(Str));
    for (int i = 0; i < N_INT; i++) ev->ints[i] = MISSING;
    ev->ints[COL_TS] = ev->ints[COL_DUR] = 0;
    S->p++;
    skip_space(S);
    if (S->p < S->end && *S->p == '}') { S->p++; return 0; }
    for (;;) {
        Str key;
        const uint8_t *after_key;
        if (read_key(S, &key, &after_key) < 0) return -1;
        unsigned bit = 0;
        int status = 0;
        switch (key.length) {
        case 2:
            if (key_is(&key, "ph", 2)) { bit = KEY_PH; status = read_string_value(S, &ev->ph); }
            else if (key_is(&key, "ts", 2)) { bit = KEY_TS; status = read_time_value(S, &ev->ints[COL_TS]); }
            break;
        case 3:
            if (key_is(&key, "cat", 3)) { bit = KEY_CAT; status = read_string_value(S, &ev->cat); }
            else if (key_is(&key, "pid", 3)) { bit = KEY_PID; status = read_int_value(S, &ev->ints[COL_PID], 1, after_key); }
            else if (key_is(&key, "tid", 3)) { bit = KEY_TID; status = read_int_value(S, &ev->ints[COL_TID], 1, after_key); }
            else if (key_is(&key, "dur", 3)) { bit = KEY_DUR; status = read_time_value(S, &ev->ints[COL_DUR]); }
            break;
        case 4:
            if (key_is(&key, "name", 4)) { bit = KEY_NAME; status = read_string_value(S, &ev->name); }
            else if (key_is(&key, "args", 4)) {
                bit = KEY_ARGS;
                if (*S->p == '{') status = read_args(S, ev->ints, &args_seen);
                else if (*S->p == 'n') status = expect_literal(S, "null", 4);
                else GIVE_UP(S, "args that is not an object");
            }
            break;
        }
        if (bit) {
            if (seen & bit) GIVE_UP(S, "a field given twice");
            seen |= bit;
            if (status < 0) return -1;
        } else if (skip_value(S) < 0) {
            return -1;
        }
        skip_space(S);
        if (S->p >= S->end) GIVE_UP(S, "an event runs past the region");
        if (*S->p == ',') { S->p++; skip_space(S); continue; }
        if (*S->p == '}') { S->p++; return 0; }
        GIVE_UP(S, "a missing ',' or '}' in an event");
    }
}

/* --- the categories reader.py knows ---------------------------------------------- */

typedef struct {
    Py_ssize_t count;
    const char **names;
    Py_ssize_t *lengths;
    int8_t *kinds;
    int8_t other;
} Categories;

static int category_kind(const Categories *c, const uint8_t *p, Py_ssize_t length) {
    for (Py_ssize_t i = 0; i < c->count; i++)
        if (c->lengths[i] == length && memcmp(c->names[i], p, (size_t)length) == 0) return c->kinds[i];
    return -1;
}

/* --- one region ------------------------------------------------------------------- */

typedef struct {
    Columns columns;
    Strings names, categories;
    int8_t *category_kinds; /* by category code: its kind, or -1 */
    Py_ssize_t category_kinds_capacity;
    uint8_t *scratch; /* decoded strings with escapes */
    Py_ssize_t scratch_capacity;
} Output;

static void output_free(Output *o) {
    columns_free(&o->columns);
    strings_free(&o->names);
    strings_free(&o->categories);
    free(o->category_kinds);
    free(o->scratch);
}

/* A string value's bytes: the raw text, or its escapes decoded into the scratch buffer;
   NULL on no memory. */
static const uint8_t *unescaped(Output *o, const Str *s, Py_ssize_t *length) {
    if (!s->escaped) {
        *length = s->length;
        return s->p;
    }
    if (s->length > o->scratch_capacity) {
        uint8_t *grown = realloc(o->scratch, (size_t)s->length + 1);
        if (!grown) return NULL;
        o->scratch = grown;
        o->scratch_capacity = s->length;
    }
    *length = decode_string(s->p, s->length, o->scratch);
    return o->scratch;
}

/* The code of a string value (decoded when it has escapes), or -1 on no memory. */
static int32_t code_of(Output *o, Strings *table, const Str *s) {
    Py_ssize_t length;
    const uint8_t *bytes = unescaped(o, s, &length);
    return bytes ? strings_code(table, bytes, length, s->escaped) : -1;
}

/* Whether a phase is `want` ("X", "i" or "I"), escapes decoded; -1 on no memory. */
static int phase_is(Output *o, const Str *ph, char want) {
    if (!ph->present) return 0;
    Py_ssize_t length;
    const uint8_t *bytes = unescaped(o, ph, &length);
    if (!bytes) return -1;
    return length == 1 && bytes[0] == (uint8_t)want;
}

static const char NO_MEMORY[] = "out of memory";

static int scan_region(Scan *S, const Categories *cats, Output *o) {
    Event ev;
    skip_space(S);
    while (S->p < S->end) {
        if (*S->p != '{') GIVE_UP(S, "an event that is not an object");
        if (read_event(S, &ev) < 0) return -1;
        const uint8_t *close = S->p - 1;
        skip_space(S);
        if (S->p < S->end) {
            const uint8_t *next = separator_after(close, S->end);
            if (!next) GIVE_UP(S, "events not separated as reader.py separates them");
            S->p = next;
        }
        /* reader._columns' rule: complete events of any category, instants of a known one. */
        if (!ev.cat.present || !ev.ph.present) continue;
        int complete = phase_is(o, &ev.ph, 'X');
        if (complete < 0) { S->why = NO_MEMORY; return -1; }
        if (!complete) {
            if (phase_is(o, &ev.ph, 'i') <= 0 && phase_is(o, &ev.ph, 'I') <= 0) continue;
            const uint8_t *text = ev.cat.p;
            Py_ssize_t length = ev.cat.length;
            if (ev.cat.escaped) {
                if (ev.cat.length > o->scratch_capacity) {
                    uint8_t *grown = realloc(o->scratch, (size_t)ev.cat.length + 1);
                    if (!grown) { S->why = NO_MEMORY; return -1; }
                    o->scratch = grown;
                    o->scratch_capacity = ev.cat.length;
                }
                length = decode_string(ev.cat.p, ev.cat.length, o->scratch);
                text = o->scratch;
            }
            if (category_kind(cats, text, length) < 0) continue; /* an instant of an unknown category */
        }
        Columns *c = &o->columns;
        if (c->rows == c->capacity && columns_grow(c, S->end - S->start) < 0) { S->why = NO_MEMORY; return -1; }
        static const Str EMPTY = {(const uint8_t *)"", 0, 0, 1};
        int32_t name = code_of(o, &o->names, ev.name.present ? &ev.name : &EMPTY);
        int32_t category = code_of(o, &o->categories, &ev.cat);
        if (name < 0 || category < 0) { S->why = NO_MEMORY; return -1; }
        if (category >= o->category_kinds_capacity) {
            /* a new category: its kind, once */
            Py_ssize_t capacity = 2 * (Py_ssize_t)category + 16;
            int8_t *grown = realloc(o->category_kinds, (size_t)capacity);
            if (!grown) { S->why = NO_MEMORY; return -1; }
            for (Py_ssize_t i = o->category_kinds_capacity; i < capacity; i++) grown[i] = -2;
            o->category_kinds = grown;
            o->category_kinds_capacity = capacity;
        }
        if (o->category_kinds[category] == -2) {
            const Entry *e = &o->categories.entries[category];
            o->category_kinds[category] = (int8_t)category_kind(cats, e->bytes, e->length);
        }
        int kind = o->category_kinds[category];
        Py_ssize_t row = c->rows++;
        c->kind[row] = (int8_t)(kind >= 0 ? kind : cats->other);
        c->name[row] = name;
        c->category[row] = category;
        for (int i = 0; i < N_INT; i++) c->ints[i][row] = ev.ints[i];
    }
    return 0;
}

/* --- Python ----------------------------------------------------------------------- */

static PyObject *strings_list(const Strings *s) {
    PyObject *list = PyList_New(s->count);
    if (!list) return NULL;
    for (Py_ssize_t i = 0; i < s->count; i++) {
        /* strict: a kept name that is not UTF-8 goes to the pyarrow path (see scan) */
        PyObject *text = PyUnicode_DecodeUTF8((const char *)s->entries[i].bytes, s->entries[i].length, NULL);
        if (!text) { Py_DECREF(list); return NULL; }
        PyList_SET_ITEM(list, i, text);
    }
    return list;
}

/* A column handed to Python without a copy: owns its malloc'd memory, exports it as a
   writable buffer (numpy.frombuffer keeps the object alive). */
typedef struct {
    PyObject_HEAD
    void *data;
    Py_ssize_t size;
} Column;

static int column_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    Column *c = (Column *)self;
    static char nothing[1];
    return PyBuffer_FillInfo(view, self, c->data ? c->data : nothing, c->size, 0, flags);
}

static void column_dealloc(PyObject *self) {
    free(((Column *)self)->data);
    Py_TYPE(self)->tp_free(self);
}

static PyBufferProcs column_buffer = {column_getbuffer, NULL};

static PyTypeObject ColumnType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stepscope.traces._kineto.Column",
    .tp_basicsize = sizeof(Column),
    .tp_dealloc = column_dealloc,
    .tp_as_buffer = &column_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One column of scan()'s result (a buffer).",
};

/* Takes *data (set to NULL: the column owns it now). */
static PyObject *column_take(void **data, Py_ssize_t size) {
    Column *c = PyObject_New(Column, &ColumnType);
    if (!c) return NULL;
    c->data = *data;
    c->size = size;
    *data = NULL;
    return (PyObject *)c;
}

static int read_categories(PyObject *known, int other, Categories *c) {
    PyObject *items = PySequence_Fast(known, "categories must be a sequence of (name, kind) pairs");
    if (!items) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    c->count = n;
    c->other = (int8_t)other;
    c->names = calloc((size_t)n + 1, sizeof(char *));
    c->lengths = calloc((size_t)n + 1, sizeof(Py_ssize_t));
    c->kinds = calloc((size_t)n + 1, 1);
    if (!c->names || !c->lengths || !c->kinds) { Py_DECREF(items); PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(items, i);
        const char *name;
        Py_ssize_t length;
        int kind;
        if (!PyArg_ParseTuple(pair, "s#i", &name, &length, &kind)) { Py_DECREF(items); return -1; }
        c->names[i] = name; /* borrowed: `known` outlives the scan */
        c->lengths[i] = length;
        c->kinds[i] = (int8_t)kind;
    }
    Py_DECREF(items);
    return 0;
}

PyDoc_STRVAR(scan_doc,
"scan(text, start, end, categories, other) -> tuple | (None, reason, offset)\n\n"
"The kept events of text[start:end] (whole events separated by commas) as columns:\n"
"(rows, kind int8, name int32 codes, names, category int32 codes, categories, ints)\n"
"where ints is a tuple of native.INT_COLUMNS (int64); the columns are buffers. `categories`: the\n"
"(name, kind code) pairs of the known categories; `other`: the kind of the others.\n"
"(None, reason, offset) where the region is the pyarrow path's to read.");

static PyObject *scan(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t start, end;
    PyObject *known;
    int other;
    if (!PyArg_ParseTuple(args, "y*nnOi", &view, &start, &end, &known, &other)) return NULL;
    if (start < 0 || end > view.len || start > end) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "scan: the region is outside the text");
        return NULL;
    }
    Categories cats = {0};
    if (read_categories(known, other, &cats) < 0) {
        free(cats.names); free(cats.lengths); free(cats.kinds);
        PyBuffer_Release(&view);
        return NULL;
    }
    const uint8_t *base = (const uint8_t *)view.buf;
    Scan S = {base + start, base + start, base + end, NULL, NULL};
    Output out;
    memset(&out, 0, sizeof(out));
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = scan_region(&S, &cats, &out);
    Py_END_ALLOW_THREADS
    free(cats.names); free(cats.lengths); free(cats.kinds);
    PyObject *result = NULL;
    if (status < 0) {
        if (S.why == NO_MEMORY) PyErr_NoMemory();
        else result = Py_BuildValue("(Osn)", Py_None, S.why, (Py_ssize_t)((S.where ? S.where : S.p) - base));
        goto done;
    }
    Columns *c = &out.columns;
    PyObject *names = strings_list(&out.names);
    PyObject *categories = names ? strings_list(&out.categories) : NULL;
    if (!names || !categories) {
        Py_XDECREF(names);
        Py_XDECREF(categories);
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) goto done;
        PyErr_Clear();
        result = Py_BuildValue("(Osn)", Py_None, "a kept name or category that is not UTF-8", start);
        goto done;
    }
    PyObject *ints = PyTuple_New(N_INT);
    for (int i = 0; ints && i < N_INT; i++) {
        PyObject *column = column_take((void **)&c->ints[i], c->rows * 8);
        if (!column) Py_CLEAR(ints);
        else PyTuple_SET_ITEM(ints, i, column);
    }
    PyObject *kind = column_take((void **)&c->kind, c->rows);
    PyObject *name = column_take((void **)&c->name, c->rows * 4);
    PyObject *category = column_take((void **)&c->category, c->rows * 4);
    if (ints && kind && name && category)
        result = Py_BuildValue("(nOOOOOO)", c->rows, kind, name, names, category, categories, ints);
    Py_XDECREF(ints);
    Py_XDECREF(kind);
    Py_XDECREF(name);
    Py_XDECREF(category);
    Py_DECREF(names);
    Py_DECREF(categories);
done:
    output_free(&out);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, scan_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kineto", "Kineto trace events parsed in compiled code (native.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__kineto(void) {
    for (int i = 0; i < N_ARGS; i++) ARG_LENGTHS[i] = (Py_ssize_t)strlen(ARG_NAMES[i]);
    IS_SPACE[' '] = IS_SPACE['\t'] = IS_SPACE['\n'] = IS_SPACE['\r'] = 1;
    for (int c = 0; c < 0x20; c++) STRING_STOP[c] = 1;
    STRING_STOP['"'] = STRING_STOP['\\'] = STRING_STOP['}'] = 1;
    for (int c = 0x20; c < 0x7F; c++) PLAIN_KEY[c] = !STRING_STOP[c];
    if (PyType_Ready(&ColumnType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "INT_COLUMNS", N_INT) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
