/*
 * common/hostport.h: the one "host:port" parser: listeners (--http-listen,
 * --rpc-listen), the client library's addresses, the bench. An IPv6 address
 * goes in brackets ("[::1]:7420"); a host that holds ':' without them is
 * refused, so "::1:7420" is never read as host "::1"; so is a stray bracket.
 */
#ifndef KVT_COMMON_HOSTPORT_H
#define KVT_COMMON_HOSTPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/*
 * Splits @text into @host (NUL-terminated, brackets removed; @hcap bytes of
 * room) and *@port_p. The port is decimal, 1..65535, or 0 too with
 * @allow_zero (a listener asking for an ephemeral port). Returns KVT_OK, or
 * KVT_ERR_INVAL with a one-line reason in @err (@errlen bytes, may be 0;
 * common/errtext.h) and @host and *@port_p untouched.
 */
kvt_status_t kvt_hostport_split(const char *text, char *host, size_t hcap, uint16_t *port_p,
                                bool allow_zero, char *err, size_t errlen);

#endif
