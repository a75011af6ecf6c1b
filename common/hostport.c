/* common/hostport.c: "host:port" and "[v6]:port" (hostport.h). */
#include "common/hostport.h"

#include <string.h>

#include "common/errtext.h"

/* Refuses @text with @why: every caller has (err, errlen) in scope. */
#define HP_FAIL(why)                                                                               \
    do {                                                                                           \
        kvt_errf(err, errlen, "%s", why);                                                          \
        return KVT_ERR_INVAL;                                                                      \
    } while (0)

kvt_status_t kvt_hostport_split(const char *text, char *host, size_t hcap, uint16_t *port_p,
                                bool allow_zero, char *err, size_t errlen)
{
    const char *h = text, *colon;
    size_t hlen;
    if (text[0] == '[') {
        const char *close = strchr(text, ']');
        if (close == NULL || close[1] != ':')
            HP_FAIL("expected [ipv6]:port");
        h = text + 1;
        hlen = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(text, ':');
        if (colon == NULL)
            HP_FAIL("expected host:port");
        hlen = (size_t)(colon - text);
        if (memchr(text, ':', hlen) != NULL)
            HP_FAIL("an ipv6 address needs brackets: [addr]:port");
    }
    if (hlen == 0)
        HP_FAIL("empty host");
    if (memchr(h, '[', hlen) != NULL || memchr(h, ']', hlen) != NULL)
        HP_FAIL("stray bracket in the host");
    if (hlen >= hcap)
        HP_FAIL("host name too long");
    const char *p = colon + 1;
    size_t plen = strlen(p);
    const char *bad =
        allow_zero ? "port must be a number in 0..65535" : "port must be a number in 1..65535";
    if (plen == 0 || plen > 5)
        HP_FAIL(bad);
    unsigned long port = 0;
    for (size_t i = 0; i < plen; i++) {
        if (p[i] < '0' || p[i] > '9')
            HP_FAIL(bad);
        port = port * 10 + (unsigned long)(p[i] - '0');
    }
    if (port > 65535 || (port == 0 && !allow_zero))
        HP_FAIL(bad);
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    *port_p = (uint16_t)port;
    return KVT_OK;
}
