/* The writer threads' encoders in C: a held batch of scalar steps framed in one call
   (`frame_held`, see step_framing.py), one array's record framed in one call (`frame_array`,
   its part below says why) and the step timeline's events written as Chrome-trace lines
   (`timeline_events`, see step_timeline.py; its part below says why).

   Under the capture defaults the losses and metrics are saved at every step, and the hook
   hands them to the writer a hundred steps at a time (held_steps.py). Framed from Python,
   each such step is a dozen small objects and a few dozen bytecodes per value, index and
   step-table entry: about 3 ms of the writer thread's Python per hundred steps, all of it
   holding the GIL, which the training thread then waits for when it comes back from each
   framework operation (bench/step_cycle.py shows where). Here the same bytes are made in
   C: the event file's records (TFRecord framing, CRC-32C), each step's index file and its
   step-table entry, byte for byte what the Python path makes (tests compare them).

   Only what the Python path would frame without a question is framed here: steps whose
   values are all numpy scalars, 0-d arrays or Python floats of a plain numeric dtype and
   that save no shapes. Anything else (an array, a shape, a name the index cannot hold) returns None
   before anything is kept, and the writer frames the batch in Python as before. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The records hold little-endian numbers (a double's bytes are copied as they are). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "little-endian hosts only: elsewhere the writer frames held steps in Python"
#endif

/* ---- CRC-32C (Castagnoli), slicing by eight ------------------------------------------ */

static uint32_t crc_table[8][256];

static void
crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t crc = i;
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
        crc_table[0][i] = crc;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t
crc32c(const unsigned char *data, size_t size)
{
    uint32_t crc = 0xFFFFFFFFu;
    while (size >= 8) {
        uint32_t low = crc ^ ((uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 | (uint32_t)data[3] << 24);
        crc = crc_table[7][low & 0xFF] ^ crc_table[6][(low >> 8) & 0xFF] ^ crc_table[5][(low >> 16) & 0xFF] ^ crc_table[4][low >> 24]
            ^ crc_table[3][data[4]] ^ crc_table[2][data[5]] ^ crc_table[1][data[6]] ^ crc_table[0][data[7]];
        data += 8;
        size -= 8;
    }
    while (size--)
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *data++) & 0xFF];
    return crc ^ 0xFFFFFFFFu;
}

/* TFRecord's masked CRC (records.mask). */
static uint32_t
masked(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

#define SMDEBUG_PLACEHOLDER_CRC 0x062DC0B3u /* records.SMDEBUG_PLACEHOLDER_CRC */

/* ---- a large tensor's payload: its CRC-32C and its finiteness in one pass ------------ */

/* A save of weights and gradients is megabytes, and two things read all of it on the writer
   thread: the record's CRC-32C and the black box's check for NaN and infinities (blackbox.py,
   two numpy reductions, each a pass over memory). `scan` does both in one pass: the SSE4.2
   crc32 instruction over three interleaved lanes of 8 KiB (one lane waits three cycles per
   word on the instruction's latency; three keep it busy), with each lane's exponents compared
   in the same iterations (SSE2, on the execution ports the crc32 instruction leaves free).
   Only on x86-64 CPUs that have the instruction
   (checked at run time); elsewhere `scan` returns None and the writer keeps its two passes. */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_SCAN 1
#include <emmintrin.h>
#include <nmmintrin.h>

#define LANE 8192 /* bytes per lane; a block is three lanes */
#define SHORT_LANE 256

/* shift[k][b]: the CRC register after LANE (or SHORT_LANE) zero bytes, from a register holding
   byte b at byte position k: how a lane's register is carried over the lanes after it. */
static uint32_t shift_lane[4][256], shift_short[4][256];
static int scan_state; /* 0: not set up; 1: ready; -1: the CPU lacks SSE4.2 */

static void
shift_table(uint32_t table[4][256], size_t zeros)
{
    uint32_t column[32];
    for (int bit = 0; bit < 32; bit++) {
        uint32_t reg = 1u << bit;
        for (size_t i = 0; i < zeros; i++)
            reg = (reg >> 8) ^ crc_table[0][reg & 0xFF];
        column[bit] = reg;
    }
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++) {
            uint32_t out = 0;
            for (int j = 0; j < 8; j++)
                if (b & (1u << j))
                    out ^= column[8 * k + j];
            table[k][b] = out;
        }
}

static inline uint32_t
shifted(uint32_t table[4][256], uint32_t reg)
{
    return table[0][reg & 0xFF] ^ table[1][(reg >> 8) & 0xFF] ^ table[2][(reg >> 16) & 0xFF] ^ table[3][reg >> 24];
}

static inline uint64_t
word_at(const unsigned char *p)
{
    uint64_t word;
    memcpy(&word, p, 8); /* (an unaligned load: x86 takes it at full speed) */
    return word;
}

/* The bits of a float's exponent (itemsize 2, 4 or 8), repeated over 16 bytes, and which
   _mm_movemask_ps bits count: a double's exponent is in its high 32 bits, so the low ones
   are compared with nothing and left out. */
static inline __m128i
exponent_bits(int itemsize, int *lanes)
{
    *lanes = itemsize == 8 ? 0xA : 0xF;
    if (itemsize == 2)
        return _mm_set1_epi16(0x7C00);
    if (itemsize == 4)
        return _mm_set1_epi32(0x7F800000);
    return _mm_set_epi32(0x7FF00000, 0, 0x7FF00000, 0);
}

/* Lanes of `v` whose exponent bits are all set (a NaN or an infinity) as all-ones. */
static inline __m128i
full_exponents(__m128i v, __m128i exponent, int itemsize)
{
    v = _mm_and_si128(v, exponent);
    return itemsize == 2 ? _mm_cmpeq_epi16(v, exponent) : _mm_cmpeq_epi32(v, exponent);
}

static inline int
any_full(__m128i seen, int itemsize, int lanes)
{
    return itemsize == 2 ? _mm_movemask_epi8(seen) != 0 : (_mm_movemask_ps(_mm_castsi128_ps(seen)) & lanes) != 0;
}

/* Whether `size` bytes of IEEE floats of `itemsize` bytes (2, 4 or 8) hold no NaN and no
   infinity: no element's exponent has all its bits set. SSE2, which every x86-64 has. */
static int
all_finite(const unsigned char *p, size_t size, int itemsize)
{
    int lanes;
    __m128i exponent = exponent_bits(itemsize, &lanes), seen = _mm_setzero_si128();
    size_t i = 0;
    for (; i + 16 <= size; i += 16)
        seen = _mm_or_si128(seen, full_exponents(_mm_loadu_si128((const __m128i *)(p + i)), exponent, itemsize));
    int found = any_full(seen, itemsize, lanes);
    for (; !found && i + (size_t)itemsize <= size; i += (size_t)itemsize) {
        uint64_t bits = 0;
        memcpy(&bits, p + i, (size_t)itemsize);
        if (itemsize == 2)
            found = (bits & 0x7C00u) == 0x7C00u;
        else if (itemsize == 4)
            found = (bits & 0x7F800000u) == 0x7F800000u;
        else
            found = (bits & 0x7FF0000000000000ull) == 0x7FF0000000000000ull;
    }
    return !found;
}

/* The raw CRC register carried over three lanes of `lane` bytes from `p` (a block): each
   lane's register runs alone, then the first two are carried over the lanes after them. */
__attribute__((target("sse4.2"))) static inline uint32_t
three_lanes(uint32_t reg, const unsigned char *p, size_t lane, uint32_t table[4][256])
{
    uint64_t a = reg, b = 0, c = 0;
    for (const unsigned char *end = p + lane; p < end; p += 8) {
        a = _mm_crc32_u64(a, word_at(p));
        b = _mm_crc32_u64(b, word_at(p + lane));
        c = _mm_crc32_u64(c, word_at(p + 2 * lane));
    }
    return shifted(table, shifted(table, (uint32_t)a) ^ (uint32_t)b) ^ (uint32_t)c;
}

/* The raw CRC register (no inversions) carried over `size` bytes; with `itemsize` (2, 4, 8)
   it also clears *finite where the bytes hold a float that is not finite. In the three-lane
   loop the exponents are compared in the same iterations: the crc32 instruction keeps one
   execution port busy and the comparisons run on the others, so the check costs next to
   nothing there. */
__attribute__((target("sse4.2"))) static uint32_t
crc_hardware(uint32_t reg, const unsigned char *p, size_t size, int itemsize, int *finite)
{
    int lanes;
    __m128i exponent = exponent_bits(itemsize ? itemsize : 4, &lanes), seen = _mm_setzero_si128();
    while (size >= 3 * LANE) {
        if (itemsize) {
            uint64_t a = reg, b = 0, c = 0;
            for (const unsigned char *q = p, *end = p + LANE; q < end; q += 16) {
                a = _mm_crc32_u64(_mm_crc32_u64(a, word_at(q)), word_at(q + 8));
                b = _mm_crc32_u64(_mm_crc32_u64(b, word_at(q + LANE)), word_at(q + LANE + 8));
                c = _mm_crc32_u64(_mm_crc32_u64(c, word_at(q + 2 * LANE)), word_at(q + 2 * LANE + 8));
                __m128i hits = _mm_or_si128(full_exponents(_mm_loadu_si128((const __m128i *)q), exponent, itemsize),
                                            full_exponents(_mm_loadu_si128((const __m128i *)(q + LANE)), exponent, itemsize));
                seen = _mm_or_si128(seen, _mm_or_si128(hits, full_exponents(_mm_loadu_si128((const __m128i *)(q + 2 * LANE)), exponent, itemsize)));
            }
            reg = shifted(shift_lane, shifted(shift_lane, (uint32_t)a) ^ (uint32_t)b) ^ (uint32_t)c;
        } else
            reg = three_lanes(reg, p, LANE, shift_lane);
        p += 3 * LANE;
        size -= 3 * LANE;
    }
    /* The rest (under 24 KiB): checked in one pass of its own, then its CRC. */
    if (itemsize && (any_full(seen, itemsize, lanes) || !all_finite(p, size, itemsize)))
        *finite = 0;
    for (; size >= 3 * SHORT_LANE; p += 3 * SHORT_LANE, size -= 3 * SHORT_LANE)
        reg = three_lanes(reg, p, SHORT_LANE, shift_short);
    uint64_t last = reg;
    for (; size >= 8; p += 8, size -= 8)
        last = _mm_crc32_u64(last, word_at(p));
    reg = (uint32_t)last;
    for (; size; size--)
        reg = _mm_crc32_u8(reg, *p++);
    return reg;
}

/* ---- a snapshot copied, its CRC-32C and its finiteness taken in the same pass ---------

   A save step copies each CPU tensor out of the model on the training thread (the optimizer
   updates it in place right after), and the writer thread then read all of it again for the
   record's CRC: 3.2 MB more of memory traffic per save of a small MLP's weights and
   gradients, which with training on every core slows the training threads sharing the
   memory (bench/ab_writer_parts.py). `copy_scan` copies and takes the CRC register of the
   bytes (from 0: the framer carries the record's head over them with `crc_shift`) and
   their finiteness in one pass, the crc32 instructions running while the loads wait on
   memory; `frame_array` then frames the record without reading the array. */

static int streaming = 1; /* streaming_stores(): bench/ab_writer_parts.py compares the two */

/* Whether streamed stores to `dst` would slow the copy from `p` down more than tenfold: where
   the destination sits up to 64 bytes after the source in their 4 KiB pages, each load of
   the next bytes matches the page offset of a store still in a write-combining buffer (a
   false dependency the CPU resolves by draining it). Measured on this project's AMD EPYC
   VM: 0.7-1.0 ms per MiB against 0.06 (a pinned or page-aligned source under an arena view
   at a page's start); plain stores keep their speed there. A window of 256 bytes leaves
   room for CPUs that look further ahead. */
static inline int
aliased_stores(const unsigned char *dst, const unsigned char *p)
{
    return (((uintptr_t)dst - (uintptr_t)p) & 4095) < 256;
}

/* The raw register (from 0) of `size` bytes copied from `p` to `dst`; like crc_hardware,
   clears *finite where `itemsize` (2, 4, 8) says to check and a float is not finite. */
__attribute__((target("sse4.2"))) static uint32_t
copy_crc_hardware(unsigned char *dst, const unsigned char *p, size_t size, int itemsize, int *finite)
{
    uint32_t reg = 0;
    int lanes;
    __m128i exponent = exponent_bits(itemsize ? itemsize : 4, &lanes), seen = _mm_setzero_si128();
    /* Where the copy is aligned (the arena's are), its stores go around the caches: the
       snapshot is read once, milliseconds later, by the writer, and stored through the
       caches it would evict as many bytes of the training's own data (and read each line
       of the copy first). */
    int stream = streaming && ((uintptr_t)dst & 15) == 0 && !aliased_stores(dst, p);
    while (size >= 3 * LANE) {
        uint64_t a = reg, b = 0, c = 0;
        for (size_t i = 0; i < LANE; i += 16) {
            __m128i x = _mm_loadu_si128((const __m128i *)(p + i)), y = _mm_loadu_si128((const __m128i *)(p + LANE + i)),
                    z = _mm_loadu_si128((const __m128i *)(p + 2 * LANE + i));
            if (stream) {
                _mm_stream_si128((__m128i *)(dst + i), x);
                _mm_stream_si128((__m128i *)(dst + LANE + i), y);
                _mm_stream_si128((__m128i *)(dst + 2 * LANE + i), z);
            } else {
                _mm_storeu_si128((__m128i *)(dst + i), x);
                _mm_storeu_si128((__m128i *)(dst + LANE + i), y);
                _mm_storeu_si128((__m128i *)(dst + 2 * LANE + i), z);
            }
            a = _mm_crc32_u64(_mm_crc32_u64(a, word_at(p + i)), word_at(p + i + 8));
            b = _mm_crc32_u64(_mm_crc32_u64(b, word_at(p + LANE + i)), word_at(p + LANE + i + 8));
            c = _mm_crc32_u64(_mm_crc32_u64(c, word_at(p + 2 * LANE + i)), word_at(p + 2 * LANE + i + 8));
            if (itemsize)
                seen = _mm_or_si128(seen, _mm_or_si128(_mm_or_si128(full_exponents(x, exponent, itemsize), full_exponents(y, exponent, itemsize)),
                                                       full_exponents(z, exponent, itemsize)));
        }
        reg = shifted(shift_lane, shifted(shift_lane, (uint32_t)a) ^ (uint32_t)b) ^ (uint32_t)c;
        p += 3 * LANE;
        dst += 3 * LANE;
        size -= 3 * LANE;
    }
    if (stream)
        _mm_sfence(); /* (the streamed stores ordered before what follows, as plain ones are) */
    if (itemsize && any_full(seen, itemsize, lanes))
        *finite = 0;
    /* The rest (under 24 KiB): copied, then read again where the copy left it (in cache). */
    memcpy(dst, p, size);
    return crc_hardware(reg, dst, size, itemsize, finite);
}

/* CRC-32C's polynomial arithmetic (reflected, as zlib's crc32_combine does it for its own
   polynomial): the register of A then B is the register of A carried over len(B) zero bytes,
   xor the register of B from 0. Carrying over n bytes is a product by x^(8n) mod P. */
#define CASTAGNOLI 0x82F63B78u

static uint32_t
mul_mod_p(uint32_t a, uint32_t b)
{
    uint32_t m = 1u << 31, product = 0;
    for (; m; m >>= 1) {
        if (a & m)
            product ^= b;
        b = b & 1 ? (b >> 1) ^ CASTAGNOLI : b >> 1;
    }
    return product;
}

static uint32_t x_power_table[64]; /* x^(2^k) mod P */

static void
power_init(void)
{
    uint32_t p = 1u << 30; /* x^1 */
    for (int k = 0; k < 64; k++) {
        x_power_table[k] = p;
        p = mul_mod_p(p, p);
    }
}

/* The register `reg` carried over `bytes` zero bytes. */
static uint32_t
crc_shift(uint32_t reg, uint64_t bytes)
{
    uint32_t power = 1u << 31; /* x^0 */
    uint64_t bits = bytes; /* the power is 8 * bytes: three squarings ahead */
    for (int k = 3; bits && k < 64; k++, bits >>= 1)
        if (bits & 1)
            power = mul_mod_p(x_power_table[k], power);
    return mul_mod_p(power, reg);
}

static int
scan_ready(void)
{
    /* Called holding the GIL: the tables are made once, before any thread reads them. */
    if (scan_state == 0) {
        __builtin_cpu_init();
        if (__builtin_cpu_supports("sse4.2")) {
            shift_table(shift_lane, LANE);
            shift_table(shift_short, SHORT_LANE);
            power_init();
            scan_state = 1;
        } else
            scan_state = -1;
    }
    return scan_state == 1;
}
#endif

/* scan(data, crc, itemsize, /): (the CRC-32C of `data` continued from `crc` as the crc32c
   package's second argument continues one, or None where `crc` is None; whether its floats are
   all finite, or None where itemsize is 0), or None where this CPU cannot. */
static PyObject *
scan(PyObject *module, PyObject *args)
{
    Py_buffer view;
    PyObject *crc_in;
    int itemsize;
    if (!PyArg_ParseTuple(args, "y*Oi:scan", &view, &crc_in, &itemsize))
        return NULL;
    PyObject *result = NULL;
    uint32_t reg = 0;
    int want_crc = crc_in != Py_None;
    if (itemsize != 0 && itemsize != 2 && itemsize != 4 && itemsize != 8) {
        PyErr_Format(PyExc_ValueError, "scan: itemsize must be 0, 2, 4 or 8, not %d", itemsize);
        goto done;
    }
    if (want_crc) {
        unsigned long value = PyLong_AsUnsignedLong(crc_in);
        if (value == (unsigned long)-1 && PyErr_Occurred())
            goto done;
        if (value > 0xFFFFFFFFul) {
            PyErr_SetString(PyExc_ValueError, "scan: crc must fit in 32 bits");
            goto done;
        }
        reg = ~(uint32_t)value;
    }
    if (itemsize && view.len % itemsize) {
        PyErr_Format(PyExc_ValueError, "scan: %zd bytes are not a whole number of %d-byte floats", view.len, itemsize);
        goto done;
    }
#ifdef HAVE_SCAN
    if (!scan_ready())
        goto none;
    {
        const unsigned char *p = view.buf;
        size_t size = (size_t)view.len;
        int finite = 1;
        Py_BEGIN_ALLOW_THREADS
        if (want_crc)
            reg = crc_hardware(reg, p, size, itemsize, &finite);
        else if (itemsize)
            finite = all_finite(p, size, itemsize);
        Py_END_ALLOW_THREADS
        PyObject *crc_out = want_crc ? PyLong_FromUnsignedLong(~reg) : Py_NewRef(Py_None);
        if (crc_out != NULL)
            result = Py_BuildValue("(NO)", crc_out, itemsize ? (finite ? Py_True : Py_False) : Py_None);
        goto done;
    }
none:
#endif
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&view);
    return result;
}

/* copy_scan(dst, src, itemsize, /): src's bytes copied into dst (a writable buffer of the same
   size), with (the raw CRC-32C register of those bytes from 0, whether its floats of
   itemsize bytes are all finite or None where itemsize is 0); None where this CPU cannot
   (nothing is copied then). frame_array takes the pair as `scanned`. */
static PyObject *
copy_scan(PyObject *module, PyObject *args)
{
    Py_buffer dst, src;
    int itemsize;
    if (!PyArg_ParseTuple(args, "w*y*i:copy_scan", &dst, &src, &itemsize))
        return NULL;
    PyObject *result = NULL;
    if (itemsize != 0 && itemsize != 2 && itemsize != 4 && itemsize != 8)
        PyErr_Format(PyExc_ValueError, "copy_scan: itemsize must be 0, 2, 4 or 8, not %d", itemsize);
    else if (dst.len != src.len)
        PyErr_Format(PyExc_ValueError, "copy_scan: %zd bytes cannot be copied into %zd", src.len, dst.len);
    else if (itemsize && src.len % itemsize)
        PyErr_Format(PyExc_ValueError, "copy_scan: %zd bytes are not a whole number of %d-byte floats", src.len, itemsize);
    else if (!PyBuffer_IsContiguous(&dst, 'C') || !PyBuffer_IsContiguous(&src, 'C'))
        PyErr_SetString(PyExc_ValueError, "copy_scan: both buffers must be contiguous");
    else {
#ifdef HAVE_SCAN
        if (scan_ready()) {
            int finite = 1;
            uint32_t reg;
            Py_BEGIN_ALLOW_THREADS
            reg = copy_crc_hardware(dst.buf, src.buf, (size_t)src.len, itemsize, &finite);
            Py_END_ALLOW_THREADS
            result = Py_BuildValue("(kO)", (unsigned long)reg, itemsize ? (finite ? Py_True : Py_False) : Py_None);
        } else
#endif
            result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    return result;
}

/* ---- a growing byte buffer ----------------------------------------------------------- */

typedef struct {
    char *data;
    size_t size, capacity;
} Buffer;

static int
reserve(Buffer *b, size_t more)
{
    if (b->size + more <= b->capacity)
        return 0;
    size_t capacity = b->capacity ? b->capacity : 4096;
    while (capacity < b->size + more)
        capacity *= 2;
    char *data = PyMem_RawRealloc(b->data, capacity); /* (Raw: also with the GIL released) */
    if (data == NULL)
        return -1; /* (the caller, holding the GIL, says so: PyErr_NoMemory) */
    b->data = data;
    b->capacity = capacity;
    return 0;
}

static int
put(Buffer *b, const void *data, size_t size)
{
    if (reserve(b, size) < 0)
        return -1;
    memcpy(b->data + b->size, data, size);
    b->size += size;
    return 0;
}

#define PUT_TEXT(b, text) put((b), (text), sizeof(text) - 1)

static int
put_varint(Buffer *b, uint64_t value)
{
    unsigned char out[10];
    int n = 0;
    do {
        unsigned char byte = value & 0x7F;
        value >>= 7;
        out[n++] = value ? (byte | 0x80) : byte;
    } while (value);
    return put(b, out, (size_t)n);
}

static size_t
varint_size(uint64_t value)
{
    size_t n = 1;
    while (value >= 0x80) {
        value >>= 7;
        n++;
    }
    return n;
}

static int
put_le(Buffer *b, uint64_t value, int bytes)
{
    unsigned char out[8];
    for (int i = 0; i < bytes; i++)
        out[i] = (unsigned char)(value >> (8 * i));
    return put(b, out, (size_t)bytes);
}

static int
put_decimal(Buffer *b, long long value)
{
    char text[32];
    int n = snprintf(text, sizeof(text), "%lld", value);
    return put(b, text, (size_t)n);
}

/* ---- one value ------------------------------------------------------------------------ */

/* What the head cache holds per tensor name: (type, value head, name as JSON, nbytes, dtype
   or None), made by the Python side (`miss`). The value head is events.small_value_head's bytes: the
   Summary.Value up to the content's bytes. */
typedef struct {
    PyObject *type;
    const char *head;
    Py_ssize_t head_size;
    const char *json;
    Py_ssize_t json_size;
    Py_ssize_t nbytes;
} Head;

/* Whether head cache entry `entry` is the one for `value`: of its type and, for an array
   (a 0-d one: Keras's losses), of its dtype (the entry's fifth item; None for scalars,
   whose type says their dtype). 1, 0, -1. */
static int
entry_fits(PyObject *entry, PyObject *value)
{
    if (entry == NULL || !PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 5 || PyTuple_GET_ITEM(entry, 0) != (PyObject *)Py_TYPE(value))
        return 0;
    PyObject *dtype = PyTuple_GET_ITEM(entry, 4);
    if (dtype == Py_None)
        return 1;
    PyObject *own = PyObject_GetAttrString(value, "dtype");
    if (own == NULL)
        return -1;
    Py_DECREF(own);
    return own == dtype; /* (numpy's dtypes of the plain types are one object each) */
}

/* The cached head of `name` for `value`, asking `miss` on a first sight or another type. 1
   and `out` filled, 0: not framed here (the Python path frames the batch), -1: error. */
static int
head_of(PyObject *names, PyObject *miss, PyObject *name, PyObject *value, Head *out)
{
    PyObject *entry = PyDict_GetItemWithError(names, name); /* borrowed */
    if (entry == NULL && PyErr_Occurred())
        return -1;
    int fits = entry_fits(entry, value);
    if (fits < 0)
        return -1;
    if (!fits) {
        PyObject *made = PyObject_CallFunctionObjArgs(miss, name, value, NULL);
        if (made == NULL)
            return -1;
        if (made == Py_None) {
            Py_DECREF(made);
            return 0;
        }
        int stored = PyDict_SetItem(names, name, made);
        Py_DECREF(made); /* (the dict holds it) */
        if (stored < 0)
            return -1;
        entry = made;
        if ((fits = entry_fits(entry, value)) <= 0) {
            if (fits == 0)
                PyErr_SetString(PyExc_TypeError, "frame_held: miss() must return (type(value), bytes, bytes, int, dtype or None) that fits the value, or None");
            return -1;
        }
    }
    PyObject *head = PyTuple_GET_ITEM(entry, 1), *json = PyTuple_GET_ITEM(entry, 2);
    if (!PyBytes_CheckExact(head) || !PyBytes_CheckExact(json)) {
        PyErr_SetString(PyExc_TypeError, "frame_held: a head entry holds something other than bytes");
        return -1;
    }
    Py_ssize_t nbytes = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 3));
    if (nbytes < 0)
        return PyErr_Occurred() ? -1 : 0;
    out->type = PyTuple_GET_ITEM(entry, 0);
    out->head = PyBytes_AS_STRING(head);
    out->head_size = PyBytes_GET_SIZE(head);
    out->json = PyBytes_AS_STRING(json);
    out->json_size = PyBytes_GET_SIZE(json);
    out->nbytes = nbytes;
    return 1;
}

/* The value's bytes into `content` (at most 16): 1, 0 (not the size its head says), -1. */
static int
value_bytes(PyObject *value, Py_ssize_t nbytes, unsigned char *content)
{
    if (PyFloat_CheckExact(value)) {
        double number = PyFloat_AS_DOUBLE(value);
        if (nbytes != (Py_ssize_t)sizeof(number))
            return 0;
        memcpy(content, &number, sizeof(number));
        return 1;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(value, &view, PyBUF_ND) < 0) { /* (ND: its number of dimensions, which must be 0) */
        PyErr_Clear();
        return 0;
    }
    int fits = view.ndim == 0 && view.len == nbytes && nbytes <= 16;
    if (fits)
        memcpy(content, view.buf, (size_t)nbytes);
    PyBuffer_Release(&view);
    return fits;
}

/* The Value's metadata field (events._metadata_field): the mode step's plugin data, then
   the mode's. */
static int
put_metadata(Buffer *b, long mode, long long mode_step)
{
    char step_text[32], mode_text[32];
    int step_size = snprintf(step_text, sizeof(step_text), "%lld", mode_step);
    int mode_size = snprintf(mode_text, sizeof(mode_text), "%ld", mode);
    /* PluginData {plugin_name = 1: "mode_step", content = 2: digits} */
    size_t first = 2 + 9 + 1 + varint_size((uint64_t)step_size) + (size_t)step_size;
    size_t second = 2 + 4 + 1 + varint_size((uint64_t)mode_size) + (size_t)mode_size;
    size_t body = 1 + varint_size(first) + first + 1 + varint_size(second) + second;
    if (put_varint(b, (9 << 3) | 2) < 0 || put_varint(b, body) < 0)
        return -1;
    if (put_varint(b, (1 << 3) | 2) < 0 || put_varint(b, first) < 0 || PUT_TEXT(b, "\x0a\x09mode_step\x12") < 0
        || put_varint(b, (uint64_t)step_size) < 0 || put(b, step_text, (size_t)step_size) < 0)
        return -1;
    if (put_varint(b, (1 << 3) | 2) < 0 || put_varint(b, second) < 0 || PUT_TEXT(b, "\x0a\x04mode\x12") < 0
        || put_varint(b, (uint64_t)mode_size) < 0 || put(b, mode_text, (size_t)mode_size) < 0)
        return -1;
    return 0;
}

/* One record (events._encode_small_tensor_event, framed as records.frame does) at the end
   of `file`. -1 on error. */
static int
put_record(Buffer *file, Buffer *payload, const Head *head, const unsigned char *content, double wall_time, long long step,
           const char *metadata, size_t metadata_len, int placeholder_crc)
{
    payload->size = 0;
    size_t value_len = (size_t)head->head_size + (size_t)head->nbytes + metadata_len;
    size_t summary_len = 1 + varint_size(value_len) + value_len;
    if (put_varint(payload, (1 << 3) | 1) < 0 || put(payload, &wall_time, sizeof(wall_time)) < 0)
        return -1;
    if (step && (put_varint(payload, (2 << 3) | 0) < 0 || put_varint(payload, (uint64_t)step) < 0))
        return -1;
    if (put_varint(payload, (5 << 3) | 2) < 0 || put_varint(payload, summary_len) < 0 || put_varint(payload, (1 << 3) | 2) < 0
        || put_varint(payload, value_len) < 0 || put(payload, head->head, (size_t)head->head_size) < 0
        || put(payload, content, (size_t)head->nbytes) < 0 || put(payload, metadata, metadata_len) < 0)
        return -1;
    unsigned char length[8];
    for (int i = 0; i < 8; i++)
        length[i] = (unsigned char)((uint64_t)payload->size >> (8 * i));
    uint32_t footer = placeholder_crc ? SMDEBUG_PLACEHOLDER_CRC : masked(crc32c((const unsigned char *)payload->data, payload->size));
    if (put(file, length, 8) < 0 || put_le(file, masked(crc32c(length, 8)), 4) < 0 || put(file, payload->data, payload->size) < 0
        || put_le(file, footer, 4) < 0)
        return -1;
    return 0;
}

/* ---- one tensor's record --------------------------------------------------------------

   A save of weights and gradients frames a dozen to a few dozen arrays per step. Framed in
   Python (events.encode_tensor_event, records.frame_sized, the CRC pass), each array is some
   sixty bytecodes and a dozen calls holding the GIL, 20-40 us of the writer thread that the
   training thread waits for when it comes back from a framework operation. `frame_array`
   makes the same record in one call: the Event's fields around the array's bytes, the
   TFRecord header and footer, and the payload's CRC-32C in the pass that also says whether a
   float array is finite, with the GIL released over large arrays. The array's own bytes are
   not copied: the record is (head, the array's memory, tail), as the Python path makes it. */

#define SMALL_TENSOR_BYTES 1024 /* events.SMALL_TENSOR_BYTES: a record this small is one buffer */
#define GIL_RELEASED_FROM (64 * 1024) /* step_framing.GIL_RELEASED_FROM */

/* The TensorProto's dtype and shape fields (events._tensor_head). */
static int
put_tensor_head(Buffer *b, long dtype, const Py_buffer *view)
{
    if (put_varint(b, (1 << 3) | 0) < 0 || put_varint(b, (uint64_t)dtype) < 0)
        return -1;
    if (view->ndim == 0)
        return 0;
    size_t dims = 0;
    for (int i = 0; i < view->ndim; i++) {
        uint64_t d = (uint64_t)view->shape[i];
        dims += 2 + (d ? 1 + varint_size(d) : 0);
    }
    if (put_varint(b, (2 << 3) | 2) < 0 || put_varint(b, dims) < 0)
        return -1;
    for (int i = 0; i < view->ndim; i++) {
        uint64_t d = (uint64_t)view->shape[i];
        if (put_varint(b, (2 << 3) | 2) < 0 || put_varint(b, d ? 1 + varint_size(d) : 0) < 0)
            return -1;
        if (d && (put_varint(b, (1 << 3) | 0) < 0 || put_varint(b, d) < 0))
            return -1;
    }
    return 0;
}

/* frame_array(name, array, prefix, metadata, formats, placeholder_crc, finite_from, scanned=None, /):
   `scanned`, where given, is copy_scan's pair for the array's bytes: the record's CRC is then
   carried over them (crc_shift) and their finiteness taken from it, without reading them. */
/* frame_array's work, on its arguments parsed: a new reference to (parts, length, finite),
   None (the Python path frames it) or NULL (an error). `address` receives the address of the
   array's bytes, the record's middle part where it has three. */
static PyObject *
frame_one(PyObject *name, PyObject *array, const Py_buffer *prefix_args, const Py_buffer *metadata_args, PyObject *formats, int placeholder_crc,
          Py_ssize_t finite_from, PyObject *scanned, uintptr_t *address, size_t *size)
{
    const Py_buffer prefix = *prefix_args, metadata = *metadata_args; /* (borrowed: the caller releases them) */
    Py_buffer view;
    unsigned long scanned_reg = 0;
    PyObject *scanned_finite = Py_None;
    if (scanned != Py_None) {
        if (!PyTuple_CheckExact(scanned) || PyTuple_GET_SIZE(scanned) != 2 || !PyLong_CheckExact(PyTuple_GET_ITEM(scanned, 0))) {
            PyErr_SetString(PyExc_TypeError, "frame_array: scanned must be None or copy_scan's (register, finite) pair");
            return NULL;
        }
        scanned_reg = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(scanned, 0));
        if (scanned_reg == (unsigned long)-1 && PyErr_Occurred())
            return NULL;
        if (scanned_reg > 0xFFFFFFFFul) {
            PyErr_SetString(PyExc_ValueError, "frame_array: a scanned register must fit in 32 bits");
            return NULL;
        }
        scanned_finite = PyTuple_GET_ITEM(scanned, 1);
    }
    PyObject *result = NULL, *content = NULL, *flat = NULL;
    Buffer head = {0}, tensor = {0};
    int have_view = 0;
#ifdef HAVE_SCAN
    if (!scan_ready())
        goto none;
#else
    goto none;
#endif
    if (PyObject_GetBuffer(array, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear(); /* (not contiguous, or no buffer: the Python path frames it) */
        goto none;
    }
    have_view = 1;
    *address = (uintptr_t)view.buf;
    const char *format = view.format ? view.format : "B";
    PyObject *code = PyDict_GetItemString(formats, format); /* borrowed */
    if (code == NULL)
        goto none; /* a dtype the Python path knows better (strings, byte-swapped, bfloat16) */
    long dtype = PyLong_AsLong(code);
    if (dtype == -1 && PyErr_Occurred())
        goto done;
    Py_ssize_t name_size;
    const char *name_text = PyUnicode_AsUTF8AndSize(name, &name_size); /* (a lone surrogate raises, as in Python) */
    if (name_text == NULL)
        goto done;
    size_t nbytes = (size_t)view.len;
    *size = nbytes;
    if (put_tensor_head(&tensor, dtype, &view) < 0)
        goto nomemory;
    size_t tensor_len = tensor.size + (nbytes ? 1 + varint_size(nbytes) : 0) + nbytes;
    size_t value_head = 1 + varint_size((uint64_t)name_size) + (size_t)name_size + 1 + varint_size(tensor_len) + tensor.size
                        + (nbytes ? 1 + varint_size(nbytes) : 0);
    size_t value_len = value_head + nbytes + (size_t)metadata.len;
    size_t summary_len = 1 + varint_size(value_len) + value_len;
    /* The record header (its length is known now), then the Event up to the array's bytes. */
    size_t payload_len = (size_t)prefix.len + 1 + varint_size(summary_len) + summary_len;
    unsigned char length[8];
    for (int i = 0; i < 8; i++)
        length[i] = (unsigned char)((uint64_t)payload_len >> (8 * i));
    if (put(&head, length, 8) < 0 || put_le(&head, masked(crc32c(length, 8)), 4) < 0 || put(&head, prefix.buf, (size_t)prefix.len) < 0
        || put_varint(&head, (5 << 3) | 2) < 0 || put_varint(&head, summary_len) < 0 || put_varint(&head, (1 << 3) | 2) < 0
        || put_varint(&head, value_len) < 0 || put_varint(&head, (1 << 3) | 2) < 0 || put_varint(&head, (uint64_t)name_size) < 0
        || put(&head, name_text, (size_t)name_size) < 0 || put_varint(&head, (8 << 3) | 2) < 0 || put_varint(&head, tensor_len) < 0
        || put(&head, tensor.data, tensor.size) < 0)
        goto nomemory;
    if (nbytes && (put_varint(&head, (4 << 3) | 2) < 0 || put_varint(&head, nbytes) < 0))
        goto nomemory;
    /* Whether a large float array is finite (the black box's question), in the CRC's pass. */
    int itemsize = 0;
    if (finite_from >= 0 && (Py_ssize_t)nbytes >= finite_from && format[1] == '\0' && (format[0] == 'e' || format[0] == 'f' || format[0] == 'd'))
        itemsize = (int)view.itemsize;
    int finite = 1;
    uint32_t footer = SMDEBUG_PLACEHOLDER_CRC;
#ifdef HAVE_SCAN
    const unsigned char *bytes = view.buf;
    if (scanned != Py_None) {
        /* (copy_scan read the bytes: only the head and the tail are read here) */
        if (itemsize) {
            if (scanned_finite == Py_None) {
                Py_BEGIN_ALLOW_THREADS
                finite = all_finite(bytes, nbytes, itemsize);
                Py_END_ALLOW_THREADS
            } else
                finite = scanned_finite == Py_True;
        }
        if (!placeholder_crc) {
            uint32_t reg = crc_hardware(0xFFFFFFFFu, (const unsigned char *)head.data + 12, head.size - 12, 0, &finite);
            reg = crc_shift(reg, nbytes) ^ (uint32_t)scanned_reg;
            reg = crc_hardware(reg, metadata.buf, (size_t)metadata.len, 0, &finite);
            footer = masked(~reg);
        }
    } else if (placeholder_crc) {
        if (itemsize) {
            Py_BEGIN_ALLOW_THREADS
            finite = all_finite(bytes, nbytes, itemsize);
            Py_END_ALLOW_THREADS
        }
    } else {
        uint32_t reg = crc_hardware(0xFFFFFFFFu, (const unsigned char *)head.data + 12, head.size - 12, 0, &finite);
        if (nbytes >= GIL_RELEASED_FROM) {
            Py_BEGIN_ALLOW_THREADS
            reg = crc_hardware(reg, bytes, nbytes, itemsize, &finite);
            Py_END_ALLOW_THREADS
        } else
            reg = crc_hardware(reg, bytes, nbytes, itemsize, &finite);
        reg = crc_hardware(reg, metadata.buf, (size_t)metadata.len, 0, &finite);
        footer = masked(~reg);
    }
#endif
    PyObject *finite_out = itemsize ? (finite ? Py_True : Py_False) : Py_None;
    size_t record_len = head.size + nbytes + (size_t)metadata.len + 4;
    if (nbytes <= SMALL_TENSOR_BYTES) {
        /* One buffer: the copy costs less than three buffers handed on. */
        if (put(&head, view.buf, nbytes) < 0 || put(&head, metadata.buf, (size_t)metadata.len) < 0 || put_le(&head, footer, 4) < 0)
            goto nomemory;
        PyObject *one = PyBytes_FromStringAndSize(head.data, (Py_ssize_t)head.size);
        if (one != NULL)
            result = Py_BuildValue("([N]nO)", one, (Py_ssize_t)record_len, finite_out);
        goto done;
    }
    Buffer tail = {0};
    if (put(&tail, metadata.buf, (size_t)metadata.len) < 0 || put_le(&tail, footer, 4) < 0) {
        PyMem_RawFree(tail.data);
        goto nomemory;
    }
    PyObject *first = PyBytes_FromStringAndSize(head.data, (Py_ssize_t)head.size);
    PyObject *last = PyBytes_FromStringAndSize(tail.data, (Py_ssize_t)tail.size);
    PyMem_RawFree(tail.data);
    /* The array's memory as flat bytes (a view that keeps the array alive). */
    content = PyMemoryView_FromObject(array);
    flat = content == NULL ? NULL : PyObject_CallMethod(content, "cast", "s", "B");
    if (first != NULL && last != NULL && flat != NULL)
        result = Py_BuildValue("([OOO]nO)", first, flat, last, (Py_ssize_t)record_len, finite_out);
    Py_XDECREF(first);
    Py_XDECREF(last);
    goto done;
nomemory:
    PyErr_NoMemory();
    goto done;
none:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(flat);
    Py_XDECREF(content);
    PyMem_RawFree(head.data);
    PyMem_RawFree(tensor.data);
    if (have_view)
        PyBuffer_Release(&view);
    return result;
}

static PyObject *
frame_array(PyObject *module, PyObject *args)
{
    PyObject *name, *array, *formats, *scanned = Py_None;
    Py_buffer prefix, metadata;
    int placeholder_crc;
    Py_ssize_t finite_from;
    if (!PyArg_ParseTuple(args, "UOy*y*O!pn|O:frame_array", &name, &array, &prefix, &metadata, &PyDict_Type, &formats, &placeholder_crc,
                          &finite_from, &scanned)) /* fmt: skip */
        return NULL;
    uintptr_t address = 0;
    size_t size = 0;
    PyObject *result = frame_one(name, array, &prefix, &metadata, formats, placeholder_crc, finite_from, scanned, &address, &size);
    PyBuffer_Release(&prefix);
    PyBuffer_Release(&metadata);
    return result;
}

/* ---- a step's values ------------------------------------------------------------------

   StepFramer.frame's loop over a step's values, for those `frame_array` frames: in Python
   each was some forty bytecodes around the call (the index entry, the padding record that
   puts a large tensor's bytes on an aligned file offset, the listeners' tables), 15-25 us
   of the writer thread per value where training on every core leaves its caches cold, and
   the writer's CPU is taken from training. Here the loop is one call a step; a value it
   does not frame goes back to the Python path, which frames it (and drops it, saying why,
   where it cannot be saved) and hands the rest back. */

#define PADDING_FIELD 1999 /* events.PADDING_FIELD */
#define RECORD_OVERHEAD 16 /* records.OVERHEAD: the header's 12 bytes and the footer's 4 */

/* events.padding_record: a whole record of exactly `size` bytes holding an Event of `prefix`
   and a filler of zeros in field PADDING_FIELD; NULL with no error where no record has that
   size, NULL with an error when out of memory. */
static PyObject *
padding_record(size_t size, const Py_buffer *prefix, int placeholder_crc)
{
    uint64_t key = ((uint64_t)PADDING_FIELD << 3) | 2;
    size_t fixed = RECORD_OVERHEAD + (size_t)prefix->len + varint_size(key);
    if (size < fixed)
        return NULL;
    size_t room = size - fixed;
    for (size_t width = 1; width <= 3; width++) {
        if (room < width || varint_size(room - width) != width)
            continue;
        size_t filler = room - width;
        Buffer record = {0};
        size_t payload_len = (size_t)prefix->len + varint_size(key) + width + filler;
        unsigned char length[8];
        for (int i = 0; i < 8; i++)
            length[i] = (unsigned char)((uint64_t)payload_len >> (8 * i));
        int failed = reserve(&record, size) < 0 || put(&record, length, 8) < 0 || put_le(&record, masked(crc32c(length, 8)), 4) < 0
                     || put(&record, prefix->buf, (size_t)prefix->len) < 0 || put_varint(&record, key) < 0 || put_varint(&record, filler) < 0;
        if (!failed) {
            memset(record.data + record.size, 0, filler);
            record.size += filler;
            uint32_t footer = placeholder_crc ? SMDEBUG_PLACEHOLDER_CRC : masked(crc32c((const unsigned char *)record.data + 12, payload_len));
            failed = put_le(&record, footer, 4) < 0;
        }
        PyObject *made = failed ? NULL : PyBytes_FromStringAndSize(record.data, (Py_ssize_t)record.size);
        PyMem_RawFree(record.data);
        if (failed)
            PyErr_NoMemory();
        return made;
    }
    return NULL;
}

/* StepFramer._padded for a record framed here: the padding record to put before it at file
   offset `offset`, so that its array's bytes (at memory address `address`, after the record's
   head of `head_size` bytes) land on a multiple of `align`; None where it needs none or its
   bytes are not aligned in memory (the direct write stages them). NULL on error. */
static PyObject *
padding_before(size_t offset, size_t head_size, uintptr_t address, size_t align, const Py_buffer *prefix, int placeholder_crc)
{
    if (address % align)
        Py_RETURN_NONE;
    size_t gap = (align - (offset + head_size) % align) % align;
    if (!gap)
        Py_RETURN_NONE;
    PyObject *padding = padding_record(gap, prefix, placeholder_crc);
    if (padding == NULL && !PyErr_Occurred()) /* (too small a gap for a record: one block more) */
        padding = padding_record(gap + align, prefix, placeholder_crc);
    if (padding == NULL && !PyErr_Occurred())
        Py_RETURN_NONE;
    return padding;
}

static double
seconds_now(void)
{
#ifdef CLOCK_MONOTONIC
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
#else
    return (double)clock() / CLOCKS_PER_SEC; /* (the processor's time: a bound all the same) */
#endif
}

/* frame_values(items, start, parts, entries, arrays, finite, names, scanned_type, prefix, metadata, formats, placeholder_crc,
                finite_from, align, place_from, offset, budget_s, keys, /) -> (index, offset, pause)

   Frames items[start:] ((name, value) pairs) as StepFramer.frame does, appending each record's
   buffers (after its padding record) to `parts` and its index entry (a dict of keys[0..2]:
   name, file offset, length) to `entries`, and filling `arrays` and `finite` (each None or a
   dict); `offset` is the file's size so far. Stops at the first item it leaves to the Python
   path: a name not in `names` (the names known to go into the index's JSON), a value neither
   a numpy array nor a `scanned_type` (host_arena.Scanned), one frame_array leaves, or one it
   fails on (the Python path frames it again and says why). `pause` is true where it stopped
   because it held the GIL for `budget_s`: the caller pauses, then goes on from `index`. */
static PyObject *
frame_values(PyObject *module, PyObject *args)
{
    PyObject *items, *parts, *entries, *arrays, *finite, *names, *scanned_type, *formats, *keys;
    Py_ssize_t start, finite_from, align, place_from, offset;
    int placeholder_crc;
    double budget;
    Py_buffer prefix, metadata;
    if (!PyArg_ParseTuple(args, "O!nO!O!OOO!Oy*y*O!pnnnndO!:frame_values", &PyList_Type, &items, &start, &PyList_Type, &parts, &PyList_Type,
                          &entries, &arrays, &finite, &PySet_Type, &names, &scanned_type, &prefix, &metadata, &PyDict_Type, &formats,
                          &placeholder_crc, &finite_from, &align, &place_from, &offset, &budget, &PyTuple_Type, &keys)) /* fmt: skip */
        return NULL;
    PyObject *result = NULL;
    int pause = 0;
    if ((arrays != Py_None && !PyDict_Check(arrays)) || (finite != Py_None && !PyDict_Check(finite)) || PyTuple_GET_SIZE(keys) != 3 || start < 0
        || offset < 0 || align < 0) {
        PyErr_SetString(PyExc_TypeError, "frame_values: arrays and finite must be dicts or None, keys three names, start, offset and align >= 0");
        goto done;
    }
    double began = seconds_now();
    Py_ssize_t i = start;
    for (; i < PyList_GET_SIZE(items); i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2)
            break;
        PyObject *name = PyTuple_GET_ITEM(item, 0), *value = PyTuple_GET_ITEM(item, 1);
        if (!PyUnicode_CheckExact(name))
            break;
        int known = PySet_Contains(names, name);
        if (known <= 0) {
            if (known < 0)
                goto done;
            break;
        }
        PyObject *array, *scan;
        if (Py_TYPE(value) == (PyTypeObject *)scanned_type) {
            array = PyObject_GetAttrString(value, "array");
            scan = array == NULL ? NULL : PyObject_GetAttrString(value, "scan");
            if (scan == NULL) {
                Py_XDECREF(array);
                goto done;
            }
        } else if (strcmp(Py_TYPE(value)->tp_name, "numpy.ndarray") == 0) {
            array = Py_NewRef(value);
            scan = Py_NewRef(Py_None);
        } else
            break;
        uintptr_t address = 0;
        size_t size = 0;
        PyObject *made = frame_one(name, array, &prefix, &metadata, formats, placeholder_crc, finite_from, scan, &address, &size);
        Py_DECREF(scan);
        if (made == NULL || made == Py_None) {
            PyErr_Clear(); /* (the Python path frames it again, and drops it saying why if it fails there too) */
            Py_XDECREF(made);
            Py_DECREF(array);
            break;
        }
        PyObject *framed = PyTuple_GET_ITEM(made, 0), *length = PyTuple_GET_ITEM(made, 1), *checked = PyTuple_GET_ITEM(made, 2);
        int failed = 0;
        if (checked != Py_None && finite != Py_None)
            failed = PyDict_SetItem(finite, name, checked) < 0;
        if (!failed && align && size >= (size_t)place_from && PyList_GET_SIZE(framed) == 3) {
            PyObject *padding = padding_before((size_t)offset, (size_t)PyBytes_GET_SIZE(PyList_GET_ITEM(framed, 0)), address, (size_t)align,
                                               &prefix, placeholder_crc);
            failed = padding == NULL;
            if (!failed && padding != Py_None) {
                failed = PyList_Append(parts, padding) < 0;
                offset += PyBytes_GET_SIZE(padding);
            }
            Py_XDECREF(padding);
        }
        if (!failed && arrays != Py_None)
            failed = PyDict_SetItem(arrays, name, array) < 0;
        Py_DECREF(array);
        PyObject *entry = failed ? NULL : PyDict_New();
        PyObject *at = entry == NULL ? NULL : PyLong_FromSsize_t(offset);
        failed = at == NULL || PyDict_SetItem(entry, PyTuple_GET_ITEM(keys, 0), name) < 0 || PyDict_SetItem(entry, PyTuple_GET_ITEM(keys, 1), at) < 0
                 || PyDict_SetItem(entry, PyTuple_GET_ITEM(keys, 2), length) < 0 || PyList_Append(entries, entry) < 0;
        Py_XDECREF(at);
        Py_XDECREF(entry);
        Py_ssize_t record_len = failed ? -1 : PyLong_AsSsize_t(length);
        if (!failed && record_len >= 0) {
            for (Py_ssize_t k = 0; k < PyList_GET_SIZE(framed) && !failed; k++)
                failed = PyList_Append(parts, PyList_GET_ITEM(framed, k)) < 0;
            offset += record_len;
        }
        Py_DECREF(made);
        if (failed || record_len < 0) /* (out of memory: the step's framing fails as a whole, as in Python) */
            goto done;
        /* The GIL's pauses as the Python loop owes them: a large array's CRC released it
           (its time is not owed; a snapshot's was taken in its copy, all the same), a run
           of small ones holding it for the budget owes one. */
        double now = seconds_now();
        if (size >= GIL_RELEASED_FROM)
            began = now;
        else if (now - began >= budget) {
            i++;
            pause = 1;
            break;
        }
    }
    result = Py_BuildValue("(nnO)", i, offset, pause ? Py_True : Py_False);
done:
    PyBuffer_Release(&prefix);
    PyBuffer_Release(&metadata);
    return result;
}

/* ---- the batch ------------------------------------------------------------------------ */

static int
as_long_long(PyObject *number, long long *out)
{
    if (!PyLong_CheckExact(number))
        return 0;
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(number, &overflow);
    if (*out == -1 && PyErr_Occurred())
        return -1;
    return !overflow;
}

typedef struct {
    PyObject *steps, *names, *miss, *event_key, *mode_names;
    const char *file_head, *event_json;
    Py_ssize_t file_head_size, event_json_size;
    double wall_time;
    int placeholder_crc;
} Batch;

/* One step's records into `file`, its index body into `index` and its step-table entry
   (StepTables' tuple) appended to `entries`. 1, 0 (not framed here), -1. */
static int
frame_step(const Batch *batch, PyObject *held, int first, Buffer *file, Buffer *payload, Buffer *index, Buffer *metadata, PyObject *bodies,
           PyObject *entries)
{
    if (!PyTuple_CheckExact(held) || PyTuple_GET_SIZE(held) != 5)
        return 0;
    PyObject *step_obj = PyTuple_GET_ITEM(held, 0), *mode_obj = PyTuple_GET_ITEM(held, 1), *mode_step_obj = PyTuple_GET_ITEM(held, 2);
    PyObject *tensors = PyTuple_GET_ITEM(held, 3), *shapes = PyTuple_GET_ITEM(held, 4);
    long long step, mode_step;
    int ok = as_long_long(step_obj, &step);
    if (ok <= 0)
        return ok;
    if ((ok = as_long_long(mode_step_obj, &mode_step)) <= 0)
        return ok;
    if (!PyLong_Check(mode_obj) || !PyDict_CheckExact(tensors) || !PyDict_CheckExact(shapes) || PyDict_GET_SIZE(shapes))
        return 0;
    long mode = PyLong_AsLong(mode_obj);
    if (mode == -1 && PyErr_Occurred())
        return -1;
    if (mode < 0 || mode >= PyTuple_GET_SIZE(batch->mode_names))
        return 0;
    PyObject *mode_name = PyTuple_GET_ITEM(batch->mode_names, mode); /* (str, bytes: the JSON text) */
    if (!PyTuple_CheckExact(mode_name) || PyTuple_GET_SIZE(mode_name) != 2 || !PyBytes_CheckExact(PyTuple_GET_ITEM(mode_name, 1)))
        return 0;

    metadata->size = 0;
    if (put_metadata(metadata, mode, mode_step) < 0)
        return -1;
    Py_ssize_t count = PyDict_GET_SIZE(tensors);
    PyObject *names = PyTuple_New(count), *starts = PyTuple_New(count), *lengths = PyTuple_New(count);
    PyObject *body = NULL, *entry = NULL;
    int result = -1;
    if (names == NULL || starts == NULL || lengths == NULL)
        goto done;
    index->size = 0;
    PyObject *mode_json = PyTuple_GET_ITEM(mode_name, 1);
    if (PUT_TEXT(index, "{\"meta\": {\"mode\": ") < 0 || put(index, PyBytes_AS_STRING(mode_json), (size_t)PyBytes_GET_SIZE(mode_json)) < 0
        || PUT_TEXT(index, ", \"mode_step\": ") < 0 || put_decimal(index, mode_step) < 0 || PUT_TEXT(index, ", \"event_file_name\": ") < 0
        || put(index, batch->event_json, (size_t)batch->event_json_size) < 0 || PUT_TEXT(index, "}, \"tensor_payload\": [") < 0)
        goto done;
    Py_ssize_t position = 0, i = 0;
    PyObject *name, *value;
    while (PyDict_Next(tensors, &position, &name, &value)) {
        Head head;
        unsigned char content[16];
        if (!PyUnicode_CheckExact(name)) {
            result = 0;
            goto done;
        }
        /* (held while `miss` may run Python code: nothing else should change a handed-over
           step, but a borrowed value must not go away under us if something did) */
        Py_INCREF(name);
        Py_INCREF(value);
        int found = head_of(batch->names, batch->miss, name, value, &head);
        if (found > 0)
            found = value_bytes(value, head.nbytes, content);
        Py_DECREF(value);
        if (found <= 0) {
            Py_DECREF(name);
            result = found;
            goto done;
        }
        size_t start = file->size;
        if (put_record(file, payload, &head, content, batch->wall_time, step, metadata->data, metadata->size, batch->placeholder_crc) < 0) {
            Py_DECREF(name);
            goto done;
        }
        size_t length = file->size - start;
        if ((i && PUT_TEXT(index, ", ") < 0) || PUT_TEXT(index, "{\"tensorname\": ") < 0 || put(index, head.json, (size_t)head.json_size) < 0
            || PUT_TEXT(index, ", \"start_idx\": ") < 0 || put_decimal(index, (long long)start) < 0 || PUT_TEXT(index, ", \"length\": ") < 0
            || put_decimal(index, (long long)length) < 0 || PUT_TEXT(index, "}") < 0) {
            Py_DECREF(name);
            goto done;
        }
        PyObject *start_obj = PyLong_FromSize_t(start), *length_obj = PyLong_FromSize_t(length);
        if (start_obj == NULL || length_obj == NULL) {
            Py_XDECREF(start_obj);
            Py_XDECREF(length_obj);
            Py_DECREF(name);
            goto done;
        }
        PyTuple_SET_ITEM(names, i, name); /* (takes the reference held above) */
        PyTuple_SET_ITEM(starts, i, start_obj);
        PyTuple_SET_ITEM(lengths, i, length_obj);
        i++;
    }
    if (i != count) { /* (the dict changed while it was read: the Python path frames the batch) */
        result = 0;
        goto done;
    }
    if (PUT_TEXT(index, "], \"shape_payload\": []}") < 0)
        goto done;
    body = PyBytes_FromStringAndSize(index->data, (Py_ssize_t)index->size);
    if (body == NULL)
        goto done;
    /* (step, mode, mode_step, names, starts, lengths, shapes, event): the first step names the
       event file, whose key its own index gives (StepTables.add leaves it out). */
    entry = PyTuple_Pack(8, step_obj, PyTuple_GET_ITEM(mode_name, 0), mode_step_obj, names, starts, lengths, Py_None, first ? Py_None : batch->event_key);
    if (entry == NULL || PyList_Append(bodies, body) < 0 || PyList_Append(entries, entry) < 0)
        goto done;
    result = 1;
done:
    Py_XDECREF(names);
    Py_XDECREF(starts);
    Py_XDECREF(lengths);
    Py_XDECREF(body);
    Py_XDECREF(entry);
    return result;
}

static PyObject *
frame_held(PyObject *module, PyObject *args)
{
    Batch batch;
    Py_buffer file_head, event_json;
    if (!PyArg_ParseTuple(args, "O!O!Oy*Uy*O!dp:frame_held", &PyList_Type, &batch.steps, &PyDict_Type, &batch.names, &batch.miss, &file_head,
                          &batch.event_key, &event_json, &PyTuple_Type, &batch.mode_names, &batch.wall_time, &batch.placeholder_crc))
        return NULL;
    batch.file_head = file_head.buf;
    batch.file_head_size = file_head.len;
    batch.event_json = event_json.buf;
    batch.event_json_size = event_json.len;
    Buffer file = {NULL, 0, 0}, payload = {NULL, 0, 0}, index = {NULL, 0, 0}, metadata = {NULL, 0, 0};
    PyObject *bodies = PyList_New(0), *entries = PyList_New(0), *result = NULL;
    int framed = -1;
    if (bodies == NULL || entries == NULL || put(&file, batch.file_head, (size_t)batch.file_head_size) < 0)
        goto done;
    /* (held steps are owned by the batch: no other thread changes the list meanwhile) */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(batch.steps); i++) {
        framed = frame_step(&batch, PyList_GET_ITEM(batch.steps, i), i == 0, &file, &payload, &index, &metadata, bodies, entries);
        if (framed <= 0)
            goto done;
    }
    framed = 1;
    PyObject *data = PyBytes_FromStringAndSize(file.data, (Py_ssize_t)file.size);
    if (data != NULL) {
        result = PyTuple_Pack(3, data, bodies, entries);
        Py_DECREF(data);
    }
done:
    PyBuffer_Release(&file_head);
    PyBuffer_Release(&event_json);
    PyMem_RawFree(file.data);
    PyMem_RawFree(payload.data);
    PyMem_RawFree(index.data);
    PyMem_RawFree(metadata.data);
    Py_XDECREF(bodies);
    Py_XDECREF(entries);
    if (framed == 0 && !PyErr_Occurred())
        Py_RETURN_NONE;
    if (result == NULL && !PyErr_Occurred())
        PyErr_NoMemory(); /* (a buffer that could not grow) */
    return result;
}

/* ---- the step timeline's events -------------------------------------------------------

   A flush of the step timeline (step_timeline.py, `encode_timeline`) turns the events of
   the last 10 s (five or so per step: tens of thousands) into Chrome-trace JSON. In Python
   that was about 1.3 ms of the flush thread per 100 steps, in one burst every 10 s that
   held the GIL against the training thread (the steps around each flush took 10-60 ms
   longer), and enough short-lived tuples to set off the garbage collector. Here the events
   are read with the GIL held (a few dozen ns each), then sorted, given their tracks and
   written with it released. */

typedef struct {
    long long start, end, step;
    Py_ssize_t index;
    int mode;
    const char *name, *phase, *args;
    Py_ssize_t name_size, phase_size, args_size;
} Slice;

/* Python's two stable sorts (by end descending, then by start): start ascending, the longer
   first at equal starts, then the order given. */
static int
slice_order(const void *a, const void *b)
{
    const Slice *x = a, *y = b;
    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    if (x->end != y->end)
        return x->end > y->end ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* The JSON text of `text` from the cache `quoted`, made by `quote` on a miss; the bytes are
   kept alive by `keep`. 1, 0 (not bytes: the Python path encodes), -1. */
static int
quoted_text(PyObject *quoted, PyObject *quote, PyObject *keep, PyObject *text, const char **out, Py_ssize_t *size)
{
    PyObject *json = PyDict_GetItemWithError(quoted, text); /* borrowed */
    if (json == NULL) {
        if (PyErr_Occurred())
            return -1;
        json = PyObject_CallOneArg(quote, text);
        if (json == NULL)
            return -1;
        int stored = PyBytes_CheckExact(json) ? PyDict_SetItem(quoted, text, json) : 0;
        Py_DECREF(json); /* (the dict holds it, or it is not bytes and unused) */
        if (stored < 0)
            return -1;
        if (!PyBytes_CheckExact(json))
            return 0;
    }
    if (!PyBytes_CheckExact(json) || PyList_Append(keep, json) < 0)
        return PyErr_Occurred() ? -1 : 0;
    *out = PyBytes_AS_STRING(json);
    *size = PyBytes_GET_SIZE(json);
    return 1;
}

/* Read event `item` (name, start_ns, end_ns, step, mode, phase, args JSON or None) into
   `slice`. 1, 0 (anything else: the Python path encodes), -1. */
static int
read_event(PyObject *item, Py_ssize_t index, PyObject *quoted, PyObject *quote, PyObject *keep, int modes, Slice *slice)
{
    if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 7)
        return 0;
    PyObject *name = PyTuple_GET_ITEM(item, 0), *phase = PyTuple_GET_ITEM(item, 5), *args = PyTuple_GET_ITEM(item, 6);
    long long numbers[4];
    for (int i = 0; i < 4; i++) {
        int ok = as_long_long(PyTuple_GET_ITEM(item, i == 3 ? 4 : i + 1), &numbers[i]);
        if (ok <= 0)
            return ok;
    }
    if (!PyUnicode_CheckExact(name) || !PyUnicode_CheckExact(phase) || (args != Py_None && !PyUnicode_CheckExact(args)))
        return 0;
    if (numbers[0] > numbers[1] || numbers[3] < 1 || numbers[3] >= modes)
        return 0;
    slice->start = numbers[0];
    slice->end = numbers[1];
    slice->step = numbers[2];
    slice->mode = (int)numbers[3];
    slice->index = index;
    int ok = quoted_text(quoted, quote, keep, name, &slice->name, &slice->name_size);
    if (ok <= 0)
        return ok;
    if ((ok = quoted_text(quoted, quote, keep, phase, &slice->phase, &slice->phase_size)) <= 0)
        return ok;
    slice->args = NULL;
    slice->args_size = 0;
    if (args != Py_None) {
        if (PyList_Append(keep, args) < 0)
            return -1;
        slice->args = PyUnicode_AsUTF8AndSize(args, &slice->args_size);
        if (slice->args == NULL)
            return -1;
    }
    return 1;
}

/* A stack of open end times (one track of a mode). */
typedef struct {
    long long *ends;
    size_t size, capacity;
} Stack;

/* Tracks per mode (step_timeline._assign_lanes): the first of a mode is tid `mode`; an
   event that overlaps every open one of its mode without nesting goes to the next,
   tid 100 * mode + k. Writes each slice's tid; -1 when out of memory. */
static int
assign_tracks(const Slice *slices, Py_ssize_t count, int modes, long long *tids)
{
    Stack **lanes = calloc((size_t)modes, sizeof(Stack *));
    size_t *lane_counts = calloc((size_t)modes, sizeof(size_t));
    int failed = lanes == NULL || lane_counts == NULL;
    for (Py_ssize_t i = 0; i < count && !failed; i++) {
        const Slice *slice = &slices[i];
        int m = slice->mode;
        size_t k = 0;
        for (; k < lane_counts[m]; k++) {
            Stack *stack = &lanes[m][k];
            while (stack->size && stack->ends[stack->size - 1] <= slice->start)
                stack->size--;
            if (!stack->size || slice->end <= stack->ends[stack->size - 1])
                break;
        }
        if (k == lane_counts[m]) { /* a new track (the first of a mode, or one more) */
            Stack *grown = realloc(lanes[m], (k + 1) * sizeof(Stack));
            if (grown == NULL) {
                failed = 1;
                break;
            }
            lanes[m] = grown;
            grown[k] = (Stack){NULL, 0, 0};
            lane_counts[m] = k + 1;
        }
        Stack *stack = &lanes[m][k];
        if (stack->size == stack->capacity) {
            size_t capacity = stack->capacity ? 2 * stack->capacity : 8;
            long long *ends = realloc(stack->ends, capacity * sizeof(long long));
            if (ends == NULL) {
                failed = 1;
                break;
            }
            stack->ends = ends;
            stack->capacity = capacity;
        }
        stack->ends[stack->size++] = slice->end;
        tids[i] = k == 0 ? m : 100LL * m + (long long)k;
    }
    for (int m = 0; lanes != NULL && m < modes; m++) {
        for (size_t k = 0; k < lane_counts[m]; k++)
            free(lanes[m][k].ends);
        free(lanes[m]);
    }
    free(lanes);
    free(lane_counts);
    return failed ? -1 : 0;
}

/* "%d.%03d" of value // 1000 and value % 1000, with Python's floor division. */
static int
put_micros(Buffer *b, long long nanos)
{
    long long whole = nanos / 1000, part = nanos % 1000;
    if (part < 0) {
        whole -= 1;
        part += 1000;
    }
    char text[40];
    int n = snprintf(text, sizeof(text), "%lld.%03lld", whole, part);
    return put(b, text, (size_t)n);
}

/* The events' lines (step_timeline.encode_timeline's), joined by ",\n". -1 on error. */
static int
put_events(Buffer *b, const Slice *slices, const long long *tids, Py_ssize_t count, const char *pid, PyObject *const *mode_names)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        const Slice *slice = &slices[i];
        if ((i && PUT_TEXT(b, ",\n") < 0) || PUT_TEXT(b, "{\"name\": ") < 0 || put(b, slice->name, (size_t)slice->name_size) < 0
            || PUT_TEXT(b, ", \"cat\": ") < 0 || put(b, slice->phase, (size_t)slice->phase_size) < 0 || PUT_TEXT(b, ", \"ph\": \"X\", \"ts\": ") < 0
            || put_micros(b, slice->start) < 0 || PUT_TEXT(b, ", \"dur\": ") < 0 || put_micros(b, slice->end - slice->start) < 0
            || PUT_TEXT(b, ", \"pid\": ") < 0 || put(b, pid, strlen(pid)) < 0 || PUT_TEXT(b, ", \"tid\": ") < 0 || put_decimal(b, tids[i]) < 0
            || PUT_TEXT(b, ", \"args\": ") < 0)
            return -1;
        if (slice->args != NULL) {
            if (put(b, slice->args, (size_t)slice->args_size) < 0 || PUT_TEXT(b, "}") < 0)
                return -1;
            continue;
        }
        PyObject *mode = mode_names[slice->mode];
        if (PUT_TEXT(b, "{\"step\": ") < 0 || put_decimal(b, slice->step) < 0 || PUT_TEXT(b, ", \"mode\": \"") < 0
            || put(b, PyBytes_AS_STRING(mode), (size_t)PyBytes_GET_SIZE(mode)) < 0 || PUT_TEXT(b, "\", \"phase\": ") < 0
            || put(b, slice->phase, (size_t)slice->phase_size) < 0 || PUT_TEXT(b, "}}") < 0)
            return -1;
    }
    return 0;
}

static PyObject *
timeline_events(PyObject *module, PyObject *args)
{
    PyObject *events, *quoted, *quote, *mode_names;
    long long rank;
    if (!PyArg_ParseTuple(args, "O!LO!OO!:timeline_events", &PyList_Type, &events, &rank, &PyDict_Type, &quoted, &quote, &PyTuple_Type,
                          &mode_names))
        return NULL;
    int modes = (int)PyTuple_GET_SIZE(mode_names);
    for (int m = 1; m < modes; m++)
        if (!PyBytes_CheckExact(PyTuple_GET_ITEM(mode_names, m))) {
            PyErr_SetString(PyExc_TypeError, "timeline_events: mode_names must hold bytes from index 1");
            return NULL;
        }
    Py_ssize_t count = PyList_GET_SIZE(events);
    Slice *slices = PyMem_RawMalloc((size_t)(count ? count : 1) * sizeof(Slice));
    long long *tids = PyMem_RawMalloc((size_t)(count ? count : 1) * sizeof(long long));
    PyObject *keep = PyList_New(0), *result = NULL;
    Buffer body = {NULL, 0, 0};
    int read = 1;
    if (slices == NULL || tids == NULL || keep == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count && read > 0; i++) {
        if (i >= PyList_GET_SIZE(events)) { /* (the list shrank while `quote` ran: the Python path writes it) */
            read = 0;
            break;
        }
        PyObject *item = PyList_GET_ITEM(events, i);
        Py_INCREF(item); /* (held while `quote` may run Python code; its strings are kept in `keep`) */
        read = PyList_Append(keep, item) < 0 ? -1 : read_event(item, i, quoted, quote, keep, modes, &slices[i]);
        Py_DECREF(item);
    }
    if (read <= 0)
        goto done;
    char pid[32];
    snprintf(pid, sizeof(pid), "%lld", rank);
    int failed;
    PyObject *const *names = &PyTuple_GET_ITEM(mode_names, 0); /* (bytes the tuple holds, while the GIL is released) */
    Py_BEGIN_ALLOW_THREADS
    qsort(slices, (size_t)count, sizeof(Slice), slice_order);
    failed = assign_tracks(slices, count, modes, tids) < 0 || put_events(&body, slices, tids, count, pid, names) < 0;
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject *tid_set = PySet_New(NULL);
    long long last_end = 0;
    for (Py_ssize_t i = 0; tid_set != NULL && i < count; i++) {
        PyObject *tid = PyLong_FromLongLong(tids[i]);
        if (tid == NULL || PySet_Add(tid_set, tid) < 0)
            Py_CLEAR(tid_set);
        Py_XDECREF(tid);
        if (i == 0 || slices[i].end > last_end)
            last_end = slices[i].end;
    }
    PyObject *data = tid_set != NULL ? PyBytes_FromStringAndSize(body.data, (Py_ssize_t)body.size) : NULL;
    PyObject *first = count ? PyLong_FromLongLong(slices[0].start) : Py_NewRef(Py_None);
    PyObject *last = count ? PyLong_FromLongLong(last_end) : Py_NewRef(Py_None);
    if (data != NULL && first != NULL && last != NULL)
        result = PyTuple_Pack(4, data, tid_set, first, last);
    Py_XDECREF(tid_set);
    Py_XDECREF(data);
    Py_XDECREF(first);
    Py_XDECREF(last);
done:
    PyMem_RawFree(slices);
    PyMem_RawFree(tids);
    PyMem_RawFree(body.data);
    Py_XDECREF(keep);
    if (read == 0 && !PyErr_Occurred())
        Py_RETURN_NONE;
    return result;
}

/* streaming_stores(on, /) -> bool: whether copy_scan's aligned copies go around the caches
   from now on (they do unless told otherwise; a benchmark compares the two); the setting before. */
static PyObject *
streaming_stores(PyObject *module, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
#ifdef HAVE_SCAN
    int before = streaming;
    streaming = on;
    return PyBool_FromLong(before);
#else
    Py_RETURN_FALSE;
#endif
}

static PyObject *
crc32c_of(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t crc = crc32c(view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef methods[] = {
    {"frame_held", frame_held, METH_VARARGS,
     "frame_held(steps, names, miss, file_head, event_key, event_json, mode_names, wall_time, placeholder_crc, /): "
     "(event file bytes, index bodies, step-table entries) of held scalar steps, or None where the Python path frames them."},
    {"timeline_events", timeline_events, METH_VARARGS,
     "timeline_events(events, rank, quoted, quote, mode_names, /): (the events' Chrome-trace lines joined by ',\\n', the set of "
     "their tids, the first start, the last end) as step_timeline.encode_timeline writes them, or None where it writes them itself."},
    {"scan", scan, METH_VARARGS,
     "scan(data, crc, itemsize, /): (CRC-32C of data continued from crc, or None where crc is None; whether its floats of "
     "itemsize bytes are all finite, or None where itemsize is 0), or None where this CPU has no CRC-32C instruction."},
    {"frame_array", frame_array, METH_VARARGS,
     "frame_array(name, array, prefix, metadata, formats, placeholder_crc, finite_from, scanned=None, /): (the record of `array` "
     "saved as `name` as buffers, its length, whether it is finite or None), as StepFramer.frame's Python path frames it (with "
     "`scanned`, copy_scan's pair for the array's bytes, without reading them), or None "
     "where that path frames it (not C-contiguous, a dtype format not in `formats`, no CRC-32C instruction)."},
    {"frame_values", frame_values, METH_VARARGS,
     "frame_values(items, start, parts, entries, arrays, finite, names, scanned_type, prefix, metadata, formats, placeholder_crc, "
     "finite_from, align, place_from, offset, budget_s, keys, /) -> (index, offset, pause): StepFramer.frame's loop over a "
     "step's (name, value) items from `start`, for the values frame_array frames; stops at the first it leaves to the Python path."},
    {"copy_scan", copy_scan, METH_VARARGS,
     "copy_scan(dst, src, itemsize, /): src's bytes copied into dst (as large), returning (the raw CRC-32C register of the bytes "
     "from 0, whether its floats of itemsize bytes are all finite or None where itemsize is 0) for frame_array's `scanned`; "
     "None where this CPU has no CRC-32C instruction (nothing copied)."},
    {"streaming_stores", streaming_stores, METH_O,
     "streaming_stores(on, /) -> bool: whether copy_scan's aligned copies go around the caches from now on (the default); "
     "the setting before. For benchmarks that compare the two."},
    {"crc32c", crc32c_of, METH_O, "crc32c(data, /): CRC-32C of a buffer (the one the records here are framed with)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef framing_module = {
    PyModuleDef_HEAD_INIT, "_encode", "The writer threads' encoders in C: held scalar steps, arrays' records, the step timeline's events.", -1, methods,
};

PyMODINIT_FUNC
PyInit__encode(void)
{
    crc_init();
    return PyModule_Create(&framing_module);
}
