/*
 * libFuzzer target for kvt_hostport_split() (common/hostport.c). The first
 * byte picks allow_zero and the host buffer's size; the rest is the text
 * (NUL-terminated copy, exactly sized). Invariants: a refusal writes nothing
 * and gives a reason; an accepted text's host fits, holds no NUL, and holds a
 * ':' only when the text was bracketed; writing host and port back out
 * ("[host]:port" when the host has a ':') parses to the same host and port.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hostport.h"

#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    bool zero = data[0] & 1;
    size_t hcap = 1 + (data[0] >> 1); /* 1..128 */
    char *text = malloc(size);        /* size - 1 bytes and a NUL */
    char *host = malloc(hcap);
    if (text == NULL || host == NULL) {
        free(text);
        free(host);
        return 0;
    }
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    memset(host, 'u', hcap);
    uint16_t port = 4242;
    char why[128];
    why[0] = '\0';
    kvt_status_t st = kvt_hostport_split(text, host, hcap, &port, zero, why, sizeof(why));
    if (st != KVT_OK) {
        CHECK(st == KVT_ERR_INVAL && why[0] != '\0');
        CHECK(port == 4242);
        for (size_t i = 0; i < hcap; i++)
            CHECK(host[i] == 'u');
    } else {
        size_t hl = strnlen(host, hcap);
        CHECK(hl < hcap && hl > 0);
        CHECK(zero || port != 0);
        CHECK(strchr(host, ':') == NULL || text[0] == '[');
        char again[320], h2[129];
        uint16_t p2;
        snprintf(again, sizeof(again), strchr(host, ':') ? "[%s]:%u" : "%s:%u", host, port);
        CHECK(kvt_hostport_split(again, h2, sizeof(h2), &p2, zero, NULL, 0) == KVT_OK);
        CHECK(strcmp(h2, host) == 0 && p2 == port);
    }
    free(text);
    free(host);
    return 0;
}
