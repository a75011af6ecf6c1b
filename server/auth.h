/* server/auth.h: the bearer token of --auth-token-file (auth.c). */
#ifndef KVT_SERVER_AUTH_H
#define KVT_SERVER_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include "server/srv_int.h"

/* Reads the token (first line, surrounding whitespace cut) from @path into srv->auth_token. */
kvt_status_t srv_auth_load(kvt_srv_t *srv, const char *path);

/* Whether @token (@len bytes) is the token, compared in constant time; true when none is set. */
bool srv_auth_ok(const kvt_srv_t *srv, const char *token, size_t len);

#endif
