/* server/auth.c: the bearer token mutating calls must present (auth.h). */
#define KVT_LOG_COMPONENT "srv"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "server/auth.h"

/* ---- auth ------------------------------------------------------------------- */

kvt_status_t srv_auth_load(kvt_srv_t *srv, const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        kvt_log_error("cannot read auth token file %s: %s", path, strerror(errno));
        return KVT_ERR_INVAL;
    }
    char buf[KVT_IDX_MAX_NAME + 2];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
        buf[--n] = '\0';
    if (n == 0 || n > KVT_IDX_MAX_NAME) {
        kvt_log_error("auth token file %s must hold 1..%u bytes", path, KVT_IDX_MAX_NAME);
        return KVT_ERR_INVAL;
    }
    srv->auth_token = strdup(buf);
    return srv->auth_token ? KVT_OK : KVT_ERR_NO_MEM;
}

bool srv_auth_ok(const kvt_srv_t *srv, const char *token, size_t len)
{
    if (srv->auth_token == NULL)
        return true;
    size_t want = strlen(srv->auth_token);
    if (token == NULL)
        return false;
    /* constant time in the token's content */
    unsigned diff = (unsigned)(len ^ want);
    for (size_t i = 0; i < want; i++)
        diff |= (unsigned)(srv->auth_token[i] ^ (i < len ? token[i] : 0));
    return diff == 0;
}
