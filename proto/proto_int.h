/*
 * proto/proto_int.h: private to the codec. The field readers and writers the
 * tier and transfer bodies share (proto_body.c). Their names have no kvt_
 * prefix, so libkvtier does not export them.
 *
 * Readers take the body's name (@what, "keys", "xfer_pin answer") for their
 * messages, which read "@what: <field> is 0"; each returns KVT_OK or, after
 * writing the message (when errlen > 0), the status it names, and sets its
 * outputs only on KVT_OK.
 */
#ifndef KVT_PROTO_PROTO_INT_H
#define KVT_PROTO_PROTO_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

/* The wire's byte order is the host's: arrays are copied in one piece. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define WIRE_IS_HOST 1
#else
#define WIRE_IS_HOST 0
#endif

/* Writes the message (when there is room for one) and returns @st. */
__attribute__((format(printf, 4, 5))) kvt_status_t
proto_fail(char *err, size_t errlen, kvt_status_t st, const char *fmt, ...);

/* KVT_OK when @bytes are left for @field of @what's body. */
kvt_status_t proto_need(const kvt_proto_rd_t *r, size_t bytes, const char *what, const char *field,
                        char *err, size_t errlen);

/* Reads str @field into *@s; @nonempty refuses "". Says which rule a refused str breaks
 * (over 255 bytes, a NUL byte, cut short, empty). */
kvt_status_t proto_rd_name(kvt_proto_rd_t *r, const char *what, const char *field, bool nonempty,
                           kvt_proto_str_t *s, char *err, size_t errlen);

/* model (1..255 bytes) and lora (0..255). */
kvt_status_t proto_rd_names(kvt_proto_rd_t *r, const char *what, kvt_proto_str_t *model,
                            kvt_proto_str_t *lora, char *err, size_t errlen);

/*
 * Reads u32 count @field, then skips the @width-byte items it counts (@items,
 * for messages) and sets *@at_p to them. Refuses 0 when @nonempty, a count
 * over @max (KVT_ERR_TOO_BIG) and a body that ends inside the items.
 */
kvt_status_t proto_rd_count(kvt_proto_rd_t *r, const char *what, const char *field, bool nonempty,
                            uint32_t max, size_t width, const char *items, uint32_t *n_p,
                            const uint8_t **at_p, char *err, size_t errlen);

/* KVT_OK when @r has read its whole body; @last names the field that ends it. */
kvt_status_t proto_rd_end(const kvt_proto_rd_t *r, const char *what, const char *last, char *err,
                          size_t errlen);

/* Reads a u8 flag (0 or 1) and three pad bytes (0). */
kvt_status_t proto_rd_flag_pad(kvt_proto_rd_t *r, const char *what, const char *flag, bool *v_p,
                               char *err, size_t errlen);

/* Copies @n little-endian integers of @width bytes (8 or 4) at @p into @out (uint64_t or
 * uint32_t), in host order. */
void proto_get_uints(void *out, const uint8_t *p, uint32_t n, size_t width);

/* Appends @n integers of @width bytes (8 or 4) from @v (uint64_t or uint32_t); @v NULL: @n
 * zeros. */
void proto_put_uints(kvt_proto_wr_t *w, const void *v, uint32_t n, size_t width);

/* Appends model and lora. */
void proto_put_names(kvt_proto_wr_t *w, kvt_proto_str_t model, kvt_proto_str_t lora);

#endif
