/*
 * common/config_parse.c: the config table's value types (kvt_cfg_string, _bool, _u32,
 * _u64, _i64, _double, _size, _duration, _string_list, _log_level): each one's parser,
 * its formatter for --dump-config and its cleanup. config.c walks the table and layers
 * file, environment and flags; it reaches these only through kvt_cfg_type_t.
 */
#include "common/config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/errtext.h"
#include "common/log.h"

/* ---------------------------------------------------------------- number syntax */

enum num_result { NUM_OK, NUM_SYNTAX, NUM_RANGE };

/*
 * Reads an unsigned integer at *s: "0x" then hex digits, or decimal digits (never octal,
 * so "010" is ten). Advances *s past the digits; the caller checks what follows.
 */
static enum num_result scan_unsigned(const char **s, bool allow_hex, uint64_t max, uint64_t *out)
{
    const char *p = *s;
    unsigned base = 10;
    uint64_t v = 0;

    if (allow_hex && p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
        base = 16;
        p += 2;
    }
    const char *digits = p;
    enum num_result res = NUM_OK;
    for (;; p++) {
        unsigned d;
        if (*p >= '0' && *p <= '9')
            d = (unsigned)(*p - '0');
        else if (base == 16 && *p >= 'a' && *p <= 'f')
            d = (unsigned)(*p - 'a' + 10);
        else if (base == 16 && *p >= 'A' && *p <= 'F')
            d = (unsigned)(*p - 'A' + 10);
        else
            break;
        if (v > (max - d) / base)
            res = NUM_RANGE; /* keep scanning so the caller sees where the number ends */
        else
            v = v * base + d;
    }
    if (p == digits)
        return NUM_SYNTAX;
    *s = p;
    if (res == NUM_OK)
        *out = v;
    return res;
}

static enum num_result parse_unsigned_text(const char *text, uint64_t max, uint64_t *out)
{
    const char *p = text;
    uint64_t v;
    enum num_result r = scan_unsigned(&p, true, max, &v);
    if (r == NUM_SYNTAX || *p != '\0')
        return NUM_SYNTAX;
    if (r == NUM_OK)
        *out = v;
    return r;
}

/* ---------------------------------------------------------------- types */

static kvt_status_t parse_string(void *field, const char *text, char *err, size_t errlen)
{
    char *copy = strdup(text);
    if (copy == NULL) {
        kvt_errf(err, errlen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    char **f = field;
    free(*f);
    *f = copy;
    return KVT_OK;
}

static int format_string(const void *field, size_t i, char *buf, size_t len)
{
    const char *const *f = field;
    if (i != 0 || *f == NULL)
        return -1;
    return snprintf(buf, len, "%s", *f);
}

static void cleanup_string(void *field)
{
    char **f = field;
    free(*f);
    *f = NULL;
}

const kvt_cfg_type_t kvt_cfg_string = {
    "STRING", sizeof(char *), false, parse_string, format_string, cleanup_string,
};

static kvt_status_t parse_bool(void *field, const char *text, char *err, size_t errlen)
{
    static const char *const yes[] = {"true", "1", "yes", "on"};
    static const char *const no[] = {"false", "0", "no", "off"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        if (strcasecmp(text, yes[i]) == 0) {
            *(bool *)field = true;
            return KVT_OK;
        }
        if (strcasecmp(text, no[i]) == 0) {
            *(bool *)field = false;
            return KVT_OK;
        }
    }
    kvt_errf(err, errlen, "expected true/false, yes/no, on/off or 1/0");
    return KVT_ERR_INVAL;
}

static int format_bool(const void *field, size_t i, char *buf, size_t len)
{
    if (i != 0)
        return -1;
    return snprintf(buf, len, "%s", *(const bool *)field ? "true" : "false");
}

const kvt_cfg_type_t kvt_cfg_bool = {
    "BOOL", sizeof(bool), false, parse_bool, format_bool, NULL,
};

static kvt_status_t parse_u32(void *field, const char *text, char *err, size_t errlen)
{
    uint64_t v = 0;
    switch (parse_unsigned_text(text, UINT32_MAX, &v)) {
    case NUM_OK: *(uint32_t *)field = (uint32_t)v; return KVT_OK;
    case NUM_RANGE: kvt_errf(err, errlen, "out of range (at most %" PRIu32 ")", UINT32_MAX); break;
    case NUM_SYNTAX: kvt_errf(err, errlen, "expected an unsigned integer"); break;
    }
    return KVT_ERR_INVAL;
}

static int format_u32(const void *field, size_t i, char *buf, size_t len)
{
    if (i != 0)
        return -1;
    return snprintf(buf, len, "%" PRIu32, *(const uint32_t *)field);
}

const kvt_cfg_type_t kvt_cfg_u32 = {
    "N", sizeof(uint32_t), false, parse_u32, format_u32, NULL,
};

static kvt_status_t parse_u64(void *field, const char *text, char *err, size_t errlen)
{
    uint64_t v = 0;
    switch (parse_unsigned_text(text, UINT64_MAX, &v)) {
    case NUM_OK: *(uint64_t *)field = v; return KVT_OK;
    case NUM_RANGE: kvt_errf(err, errlen, "out of range (at most %" PRIu64 ")", UINT64_MAX); break;
    case NUM_SYNTAX: kvt_errf(err, errlen, "expected an unsigned integer"); break;
    }
    return KVT_ERR_INVAL;
}

static int format_u64(const void *field, size_t i, char *buf, size_t len)
{
    if (i != 0)
        return -1;
    return snprintf(buf, len, "%" PRIu64, *(const uint64_t *)field);
}

const kvt_cfg_type_t kvt_cfg_u64 = {
    "N", sizeof(uint64_t), false, parse_u64, format_u64, NULL,
};

static kvt_status_t parse_i64(void *field, const char *text, char *err, size_t errlen)
{
    const char *p = text;
    bool neg = false;
    if (*p == '-' || *p == '+')
        neg = *p++ == '-';
    /* The magnitude of INT64_MIN is INT64_MAX + 1. */
    uint64_t max = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    uint64_t v = 0;
    enum num_result r = scan_unsigned(&p, false, max, &v);
    if (r == NUM_SYNTAX || *p != '\0') {
        kvt_errf(err, errlen, "expected an integer");
        return KVT_ERR_INVAL;
    }
    if (r == NUM_RANGE) {
        kvt_errf(err, errlen, "out of range (%" PRId64 " to %" PRId64 ")", INT64_MIN, INT64_MAX);
        return KVT_ERR_INVAL;
    }
    /* Negate in unsigned arithmetic: -(INT64_MIN) would overflow int64_t. */
    *(int64_t *)field = neg ? (int64_t)(0 - v) : (int64_t)v;
    return KVT_OK;
}

static int format_i64(const void *field, size_t i, char *buf, size_t len)
{
    if (i != 0)
        return -1;
    return snprintf(buf, len, "%" PRId64, *(const int64_t *)field);
}

const kvt_cfg_type_t kvt_cfg_i64 = {
    "N", sizeof(int64_t), false, parse_i64, format_i64, NULL,
};

static kvt_status_t parse_double(void *field, const char *text, char *err, size_t errlen)
{
    char *end;
    if (*text == '\0' || isspace((unsigned char)*text)) {
        kvt_errf(err, errlen, "expected a number");
        return KVT_ERR_INVAL;
    }
    errno = 0;
    double v = strtod(text, &end);
    if (*end != '\0' || isnan(v)) {
        kvt_errf(err, errlen, "expected a number");
        return KVT_ERR_INVAL;
    }
    /* ERANGE also flags underflow to a denormal, which is a fine value. */
    if (isinf(v) || (errno == ERANGE && fabs(v) == HUGE_VAL)) {
        kvt_errf(err, errlen, "out of range");
        return KVT_ERR_INVAL;
    }
    *(double *)field = v;
    return KVT_OK;
}

static int format_double(const void *field, size_t i, char *buf, size_t len)
{
    if (i != 0)
        return -1;
    double v = *(const double *)field;
    /* The shortest of %.15g..%.17g that reads back exactly ("0.1", not "0.10000000000000001"). */
    char tmp[64];
    for (int prec = 15; prec < 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*g", prec, v);
        if (strtod(tmp, NULL) == v)
            return snprintf(buf, len, "%s", tmp);
    }
    return snprintf(buf, len, "%.17g", v);
}

const kvt_cfg_type_t kvt_cfg_double = {
    "X", sizeof(double), false, parse_double, format_double, NULL,
};

typedef struct unit {
    const char *suffix;
    uint64_t mult;
} unit_t;

/* Parses "<decimal digits><suffix>" with a suffix from @units; the first unit is "". */
static enum num_result parse_with_unit(const char *text, const unit_t *units, size_t nunits,
                                       uint64_t *out)
{
    const char *p = text;
    uint64_t v = 0;
    enum num_result r = scan_unsigned(&p, false, UINT64_MAX, &v);
    if (r == NUM_SYNTAX)
        return NUM_SYNTAX;
    for (size_t i = 0; i < nunits; i++) {
        if (strcmp(p, units[i].suffix) != 0)
            continue;
        if (r == NUM_RANGE || v > UINT64_MAX / units[i].mult)
            return NUM_RANGE;
        *out = v * units[i].mult;
        return NUM_OK;
    }
    return NUM_SYNTAX;
}

#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)
#define TIB (UINT64_C(1) << 40)

static const unit_t size_units[] = {
    {"", 1},      {"B", 1},   {"k", KIB}, {"K", KIB},   {"KiB", KIB}, {"m", MIB}, {"M", MIB},
    {"MiB", MIB}, {"g", GIB}, {"G", GIB}, {"GiB", GIB}, {"t", TIB},   {"T", TIB}, {"TiB", TIB},
};

static kvt_status_t parse_size(void *field, const char *text, char *err, size_t errlen)
{
    uint64_t v = 0;
    switch (parse_with_unit(text, size_units, sizeof(size_units) / sizeof(size_units[0]), &v)) {
    case NUM_OK: *(uint64_t *)field = v; return KVT_OK;
    case NUM_RANGE: kvt_errf(err, errlen, "size out of range (at most 2^64-1 bytes)"); break;
    case NUM_SYNTAX:
        kvt_errf(err, errlen, "expected a size in bytes such as 4096, 64k, 64KiB, 2G or 1TiB");
        break;
    }
    return KVT_ERR_INVAL;
}

static int format_size(const void *field, size_t i, char *buf, size_t len)
{
    static const unit_t big[] = {{"TiB", TIB}, {"GiB", GIB}, {"MiB", MIB}, {"KiB", KIB}};
    if (i != 0)
        return -1;
    uint64_t v = *(const uint64_t *)field;
    for (size_t u = 0; v != 0 && u < sizeof(big) / sizeof(big[0]); u++) {
        if (v % big[u].mult == 0)
            return snprintf(buf, len, "%" PRIu64 "%s", v / big[u].mult, big[u].suffix);
    }
    return snprintf(buf, len, "%" PRIu64, v);
}

const kvt_cfg_type_t kvt_cfg_size = {
    "SIZE", sizeof(uint64_t), false, parse_size, format_size, NULL,
};

static const unit_t duration_units[] = {
    {"", 1}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000},
};

static kvt_status_t parse_duration(void *field, const char *text, char *err, size_t errlen)
{
    uint64_t v = 0;
    size_t nunits = sizeof(duration_units) / sizeof(duration_units[0]);
    switch (parse_with_unit(text, duration_units, nunits, &v)) {
    case NUM_OK: *(uint64_t *)field = v; return KVT_OK;
    case NUM_RANGE: kvt_errf(err, errlen, "duration out of range"); break;
    case NUM_SYNTAX:
        kvt_errf(err, errlen, "expected a duration such as 250 (ms), 250ms, 30s, 5m or 1h");
        break;
    }
    return KVT_ERR_INVAL;
}

static int format_duration(const void *field, size_t i, char *buf, size_t len)
{
    if (i != 0)
        return -1;
    uint64_t v = *(const uint64_t *)field;
    for (size_t u = sizeof(duration_units) / sizeof(duration_units[0]) - 1; v != 0 && u >= 2; u--) {
        if (v % duration_units[u].mult == 0)
            return snprintf(buf, len, "%" PRIu64 "%s", v / duration_units[u].mult,
                            duration_units[u].suffix);
    }
    return snprintf(buf, len, "%" PRIu64 "ms", v);
}

const kvt_cfg_type_t kvt_cfg_duration = {
    "DURATION", sizeof(uint64_t), false, parse_duration, format_duration, NULL,
};

static kvt_status_t parse_list(void *field, const char *text, char *err, size_t errlen)
{
    kvt_cfg_list_t *l = field;
    char *copy = strdup(text);
    if (copy == NULL)
        goto err_nomem;
    char **items = realloc(l->items, (l->n + 1) * sizeof(*items));
    if (items == NULL)
        goto err_free_copy;
    items[l->n] = copy;
    l->items = items;
    l->n++;
    return KVT_OK;

err_free_copy:
    free(copy);
err_nomem:
    kvt_errf(err, errlen, "out of memory");
    return KVT_ERR_NO_MEM;
}

static int format_list(const void *field, size_t i, char *buf, size_t len)
{
    const kvt_cfg_list_t *l = field;
    if (i >= l->n)
        return -1;
    return snprintf(buf, len, "%s", l->items[i]);
}

static void cleanup_list(void *field)
{
    kvt_cfg_list_t *l = field;
    for (size_t i = 0; i < l->n; i++)
        free(l->items[i]);
    free(l->items);
    l->items = NULL;
    l->n = 0;
}

const kvt_cfg_type_t kvt_cfg_string_list = {
    "STRING", sizeof(kvt_cfg_list_t), true, parse_list, format_list, cleanup_list,
};

static kvt_status_t parse_log_level(void *field, const char *text, char *err, size_t errlen)
{
    kvt_log_level_t level;
    if (kvt_log_parse_level(text, &level) != KVT_OK) {
        kvt_errf(err, errlen, "expected error, warn, info or debug");
        return KVT_ERR_INVAL;
    }
    *(kvt_log_level_t *)field = level;
    return KVT_OK;
}

static int format_log_level(const void *field, size_t i, char *buf, size_t len)
{
    if (i != 0)
        return -1;
    return snprintf(buf, len, "%s", kvt_log_level_name(*(const kvt_log_level_t *)field));
}

const kvt_cfg_type_t kvt_cfg_log_level = {
    "LEVEL", sizeof(kvt_log_level_t), false, parse_log_level, format_log_level, NULL,
};
