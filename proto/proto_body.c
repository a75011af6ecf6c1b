/*
 * proto/proto_body.c: reading and writing the fields of the tier and transfer bodies
 * (proto_int.h): each check says which rule a refused field breaks.
 */
#include "common/errtext.h"
#include "proto/proto_int.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- errors --------------------------------------------------------------------------------- */

/* Writes the message (when there is room for one) and returns @st. */
kvt_status_t proto_fail(char *err, size_t errlen, kvt_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvt_verrf(err, errlen, fmt, ap);
    va_end(ap);
    return st;
}

/* ---- reading -------------------------------------------------------------------------------- */

/* KVT_OK when @bytes are left for @field of @what's body. */
kvt_status_t proto_need(const kvt_proto_rd_t *r, size_t bytes, const char *what, const char *field,
                        char *err, size_t errlen)
{
    size_t left = kvt_proto_rd_left(r);
    if (left >= bytes)
        return KVT_OK;
    return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: body ends %s %s", what,
                      left == 0 ? "before" : "inside", field);
}

/*
 * Reads str @field of @what's body into *@s; @nonempty refuses "". Says which
 * rule a refused str breaks, which kvt_proto_rd_str() does not.
 */
kvt_status_t proto_rd_name(kvt_proto_rd_t *r, const char *what, const char *field, bool nonempty,
                           kvt_proto_str_t *s, char *err, size_t errlen)
{
    kvt_status_t st = proto_need(r, 2, what, field, err, errlen);
    if (st != KVT_OK)
        return st;
    kvt_proto_rd_t peek = *r;
    uint16_t len = kvt_proto_rd_u16(&peek);
    if (len > KVT_PROTO_MAX_STR)
        return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: %s is %u bytes, over %u", what, field,
                          (unsigned)len, KVT_PROTO_MAX_STR);
    const uint8_t *p = kvt_proto_rd_raw(&peek, len);
    if (p == NULL)
        return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: body ends inside %s", what, field);
    if (memchr(p, '\0', len) != NULL)
        return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: %s has a NUL byte", what, field);
    if (len == 0 && nonempty)
        return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: %s is empty", what, field);
    *s = kvt_proto_rd_str(r);
    return KVT_OK;
}

/* model (1..255 bytes) and lora: the head of every tier request. */
kvt_status_t proto_rd_names(kvt_proto_rd_t *r, const char *what, kvt_proto_str_t *model,
                            kvt_proto_str_t *lora, char *err, size_t errlen)
{
    kvt_status_t st = proto_rd_name(r, what, "model", true, model, err, errlen);
    return st == KVT_OK ? proto_rd_name(r, what, "lora", false, lora, err, errlen) : st;
}

/*
 * Reads count @field, then skips the @width-byte items it counts (@items, for
 * messages) and sets *@at_p to them. Refuses 0 when @nonempty, a count over
 * @max (KVT_ERR_TOO_BIG) and a body that ends inside the items.
 */
kvt_status_t proto_rd_count(kvt_proto_rd_t *r, const char *what, const char *field, bool nonempty,
                            uint32_t max, size_t width, const char *items, uint32_t *n_p,
                            const uint8_t **at_p, char *err, size_t errlen)
{
    kvt_status_t st = proto_need(r, 4, what, field, err, errlen);
    if (st != KVT_OK)
        return st;
    uint32_t n = kvt_proto_rd_u32(r);
    if (n == 0 && nonempty)
        return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: %s is 0", what, field);
    if (n > max)
        return proto_fail(err, errlen, KVT_ERR_TOO_BIG,
                          "%s: %s is %" PRIu32 ", more than the %" PRIu32 " taken", what, field, n,
                          max);
    size_t left = kvt_proto_rd_left(r);
    if (left / width < n)
        return proto_fail(err, errlen, KVT_ERR_INVAL,
                          "%s: body ends %s %s (%s %" PRIu32 " needs %" PRIu64 " bytes, %zu left)",
                          what, left == 0 ? "before" : "inside", items, field, n,
                          (uint64_t)n * width, left);
    *n_p = n;
    *at_p = kvt_proto_rd_raw(r, (size_t)n * width);
    return KVT_OK;
}

/* KVT_OK when @r has read its whole body; @last names the field that ends it. */
kvt_status_t proto_rd_end(const kvt_proto_rd_t *r, const char *what, const char *last, char *err,
                          size_t errlen)
{
    size_t left = kvt_proto_rd_left(r);
    if (left == 0)
        return KVT_OK;
    return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: %zu byte%s after %s", what, left,
                      left == 1 ? "" : "s", last);
}

/* Reads a u8 flag (0 or 1) and three pad bytes (0) of @what's body. */
kvt_status_t proto_rd_flag_pad(kvt_proto_rd_t *r, const char *what, const char *flag, bool *v_p,
                               char *err, size_t errlen)
{
    size_t left = kvt_proto_rd_left(r);
    if (left < 4)
        return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: body ends %s %s and pad", what,
                          left == 0 ? "before" : "inside", flag);
    uint8_t v = kvt_proto_rd_u8(r);
    const uint8_t *pad = kvt_proto_rd_raw(r, 3);
    if (v > 1)
        return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: %s must be 0 or 1, not %u", what, flag,
                          (unsigned)v);
    if ((pad[0] | pad[1] | pad[2]) != 0)
        return proto_fail(err, errlen, KVT_ERR_INVAL, "%s: pad bytes after %s must be 0", what,
                          flag);
    *v_p = v == 1;
    return KVT_OK;
}

/* Copies @n little-endian integers of @width bytes (8 or 4) at @p into @out (uint64_t or
 * uint32_t), in host order. */
void proto_get_uints(void *out, const uint8_t *p, uint32_t n, size_t width)
{
    if (n == 0)
        return;
#if WIRE_IS_HOST
    memcpy(out, p, (size_t)n * width);
#else
    kvt_proto_rd_t r;
    kvt_proto_rd_init(&r, p, (size_t)n * width);
    for (uint32_t i = 0; i < n; i++) {
        if (width == 8)
            ((uint64_t *)out)[i] = kvt_proto_rd_u64(&r);
        else
            ((uint32_t *)out)[i] = kvt_proto_rd_u32(&r);
    }
#endif
}

/* ---- writing -------------------------------------------------------------------------------- */

/* Appends @n integers of @width bytes (8 or 4) from @v (uint64_t or uint32_t); @v NULL: @n
 * zeros. */
void proto_put_uints(kvt_proto_wr_t *w, const void *v, uint32_t n, size_t width)
{
    if (v != NULL && WIRE_IS_HOST) {
        kvt_proto_wr_raw(w, v, (size_t)n * width);
        return;
    }
    if (kvt_proto_wr_reserve(w, (size_t)n * width) != KVT_OK)
        return;
    for (uint32_t i = 0; i < n; i++) {
        if (width == 8)
            kvt_proto_wr_u64(w, v != NULL ? ((const uint64_t *)v)[i] : 0);
        else
            kvt_proto_wr_u32(w, v != NULL ? ((const uint32_t *)v)[i] : 0);
    }
}

void proto_put_names(kvt_proto_wr_t *w, kvt_proto_str_t model, kvt_proto_str_t lora)
{
    kvt_proto_wr_str(w, model.p, model.len);
    kvt_proto_wr_str(w, lora.p, lora.len);
}
