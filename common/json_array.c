/*
 * Arrays of integers (token ids, block hashes): a fast path over digits and
 * commas, by 64-byte windows where SSE2 is there; anything else falls back to
 * the full reader, errors included.
 */
#include <stdint.h>
#include <string.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "common/json.h"
#include "common/json_int.h"

/* ---- number arrays -------------------------------------------------------------------- */

/*
 * Number of leading ASCII digits in the eight bytes at @s (8: all of them).
 * a = byte ^ '0' is 0..9 for a digit; a + 0x76 sets the high bit from 10
 * up, and a high bit already set marks the rest. Carries only reach bytes
 * after the first non-digit, which do not count.
 */
static inline unsigned kvt_json_digit_run(const char *s)
{
    uint64_t x;
    memcpy(&x, s, 8);
    uint64_t a = x ^ 0x3030303030303030ull;
    uint64_t nd = (a | (a + 0x7676767676767676ull)) & 0x8080808080808080ull;
    return nd ? (unsigned)__builtin_ctzll(nd) >> 3 : 8;
}

/* Value of the @k (1..8) ASCII digits at @s; eight bytes must be readable there. */
static inline uint32_t kvt_json_swar_digits(const char *s, unsigned k)
{
    uint64_t a;
    memcpy(&a, s, 8);
    a ^= 0x3030303030303030ull; /* digit bytes to 0..9 */
    /* the k digit values to the last k bytes (zeros lead), then fold 2, 4, 8 */
    a <<= 8 * (8 - k);
    a = (a * 2561) >> 8;
    a = ((a & 0x00FF00FF00FF00FFull) * 6553601) >> 16;
    a = ((a & 0x0000FFFF0000FFFFull) * 42949672960001ull) >> 32;
    return (uint32_t)a;
}

#ifdef __SSE2__
/* Bits of the 16 bytes in @x equal to @c. */
static inline uint64_t kvt_json_eq16(__m128i x, char c)
{
    return (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(x, _mm_set1_epi8(c)));
}

/*
 * Token ids, 64 bytes at a time while 72 are readable, for bodies of a few
 * thousand ids. Masks of the window's digits, commas and spaces show where
 * every element "digits ',' [' ']" starts and ends, so the elements are
 * converted independently of one another: no element waits for the scan of
 * the one before. Takes elements up to the first byte that breaks that shape
 * (another byte, a comma or a space out of place); stops at an element of
 * over 8 digits, with a leading zero, over @max or past @cap, untaken, so
 * that the caller's loops read it (errors included). Returns the new position.
 */
static size_t kvt_json_u32_windows(const char *s, size_t len, size_t p, uint32_t *o, size_t *n_p,
                                   size_t cap, uint64_t max)
{
    size_t n = *n_p;
    while (len - p >= 72 && KVT_JSON_IS_DIGIT(s[p])) {
        uint64_t dig = 0, com = 0, spc = 0;
        for (int q = 0; q < 4; q++) {
            __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(s + p + 16 * q));
            __m128i t = _mm_sub_epi8(x, _mm_set1_epi8('0'));
            __m128i d = _mm_cmpeq_epi8(_mm_min_epu8(t, _mm_set1_epi8(9)), t);
            dig |= (uint64_t)(uint16_t)_mm_movemask_epi8(d) << (16 * q);
            com |= kvt_json_eq16(x, ',') << (16 * q);
            spc |= kvt_json_eq16(x, ' ') << (16 * q);
        }
        /* first byte out of shape: another byte, a comma after no digit, a space after no comma */
        uint64_t bad = ~(dig | com | spc) | (com & ~(dig << 1)) | (spc & ~(com << 1));
        uint64_t keep = bad ? ((uint64_t)1 << __builtin_ctzll(bad)) - 1 : ~(uint64_t)0;
        uint64_t ends = com & keep, starts = dig & ~(dig << 1) & keep;
        if (ends == 0)
            break;
        size_t next = p;
        for (; ends != 0; ends &= ends - 1, starts &= starts - 1) {
            unsigned b = (unsigned)__builtin_ctzll(starts), k = (unsigned)__builtin_ctzll(ends) - b;
            const char *e = s + p + b;
            if (k > 8 || (k > 1 && e[0] == '0') || n >= cap)
                break;
            uint32_t v = kvt_json_swar_digits(e, k);
            if (v > max)
                break;
            o[n++] = v;
            next = p + b + k + 1;
        }
        if (ends != 0) {
            p += __builtin_ctzll(starts); /* the element that stopped the run */
            break;
        }
        p = next + (s[next] == ' ');
    }
    *n_p = n;
    return p;
}
#endif

/*
 * Fast path for one integer literal at s[p]: up to 20 digits with an
 * optional '-', not followed by '.', 'e', 'E' or another digit. Returns 1
 * with the magnitude in *mag and the end in *end; 0 for anything else (a
 * leading zero, overflow, a fraction, another type), which the caller hands
 * to the full scanner so that errors read the same either way.
 */
static inline int kvt_json_fast_int(const char *s, size_t len, size_t p, bool *neg, uint64_t *mag,
                                    size_t *end)
{
    *neg = false;
    if (p < len && s[p] == '-') {
        *neg = true;
        p++;
    }
    if (p >= len || !KVT_JSON_IS_DIGIT(s[p]))
        return 0;
    if (len - p >= 8) {
        /* up to 7 digits (token ids): eight bytes at once */
        unsigned k = kvt_json_digit_run(s + p);
        if (k < 8 && (k == 1 || s[p] != '0')) {
            char c = s[p + k];
            if (c == '.' || c == 'e' || c == 'E')
                return 0;
            *mag = kvt_json_swar_digits(s + p, k);
            *end = p + k;
            return 1;
        }
    }
    uint64_t v = (uint64_t)(s[p] - '0');
    size_t q = p + 1;
    if (v != 0) {
        size_t lim = len - q < 18 ? len : q + 18; /* 19 digits cannot overflow */
        while (q < lim && KVT_JSON_IS_DIGIT(s[q]))
            v = v * 10 + (uint64_t)(s[q++] - '0');
        if (q < len && KVT_JSON_IS_DIGIT(s[q])) {
            uint64_t d = (uint64_t)(s[q] - '0');
            if (v > (UINT64_MAX - d) / 10)
                return 0;
            v = v * 10 + d;
            q++;
        }
    }
    if (q < len && (KVT_JSON_IS_DIGIT(s[q]) || s[q] == '.' || s[q] == 'e' || s[q] == 'E'))
        return 0;
    *mag = v;
    *end = q;
    return 1;
}

/*
 * Both array readers: @hash selects kvt_json_hash() semantics (negatives
 * wrap) and u64 output, else unsigned in [0, max] and u32 output.
 */
static kvt_status_t kvt_json_int_array(kvt_json_t *j, bool hash, void *out, size_t cap,
                                       uint64_t max, size_t *n_p)
{
    kvt_status_t st = kvt_json_array_begin(j);
    if (st != KVT_OK)
        return st;
    const char *s = j->s;
    const size_t len = j->len;
    size_t p = j->pos, n = 0;

    while (p < len && KVT_JSON_IS_WS(s[p]))
        p++;
    if (p < len && s[p] == ']') {
        j->pos = p;
        kvt_json_close(j);
        *n_p = 0;
        return KVT_OK;
    }
    if (!hash) {
        /*
         * Token ids: digits then ',' and at most one space, taken by 64-byte
         * windows where SSE2 is there (1..8 digits), then eight bytes at a
         * time while 16 are readable (1..7 digits). Anything else (the last
         * element, other whitespace, a leading zero, a fraction, a value
         * over @max, a full @out) stops here untaken, and the loop below
         * reads it, errors included.
         */
        uint32_t *o = out;
#ifdef __SSE2__
        p = kvt_json_u32_windows(s, len, p, o, &n, cap, max);
#endif
        while (len - p >= 16 && n < cap) {
            unsigned k = kvt_json_digit_run(s + p);
            if (k == 0 || k == 8 || s[p + k] != ',' || (k > 1 && s[p] == '0'))
                break;
            uint32_t v = kvt_json_swar_digits(s + p, k);
            if (v > max)
                break;
            o[n++] = v;
            p += k + 1;
            p += s[p] == ' ';
        }
        while (p < len && KVT_JSON_IS_WS(s[p]))
            p++;
    }
    for (;;) {
        /* One element at p (after whitespace). */
        bool neg;
        uint64_t mag = 0, v = 0;
        size_t end, start = p;
        if (kvt_json_fast_int(s, len, p, &neg, &mag, &end) &&
            (hash ? !neg || mag <= (uint64_t)INT64_MAX + 1 : !neg || mag == 0)) {
            v = neg ? 0 - mag : mag;
            p = end;
        } else {
            /* Slow path: the full reader decides, or fails with its message. */
            j->pos = p;
            j->expect = KVT_JSON_X_VALUE;
            st = hash ? kvt_json_hash(j, &v) : kvt_json_read_uint(j, UINT32_MAX, "a u32", &v);
            if (st != KVT_OK)
                return st;
            p = j->pos;
        }
        if (!hash && v > max)
            return kvt_json_fail(j, KVT_ERR_RANGE, start, "%llu is above the limit %llu",
                                 (unsigned long long)v, (unsigned long long)max);
        if (n >= cap)
            return kvt_json_fail(j, KVT_ERR_TOO_BIG, start, "array has more than %zu elements",
                                 cap);
        if (hash)
            ((uint64_t *)out)[n++] = v;
        else
            ((uint32_t *)out)[n++] = (uint32_t)v;

        while (p < len && KVT_JSON_IS_WS(s[p]))
            p++;
        if (p < len && s[p] == ',') {
            p++;
            while (p < len && KVT_JSON_IS_WS(s[p]))
                p++;
            continue;
        }
        if (p < len && s[p] == ']')
            break;
        j->pos = p;
        return kvt_json_expected(j, p, "',' or ']'");
    }
    j->pos = p;
    kvt_json_close(j);
    *n_p = n;
    return KVT_OK;
}

kvt_status_t kvt_json_u32_array(kvt_json_t *j, uint32_t *out, size_t cap, uint32_t max, size_t *n_p)
{
    return kvt_json_int_array(j, false, out, cap, max, n_p);
}

kvt_status_t kvt_json_hash_array(kvt_json_t *j, uint64_t *out, size_t cap, size_t *n_p)
{
    return kvt_json_int_array(j, true, out, cap, UINT64_MAX, n_p);
}
