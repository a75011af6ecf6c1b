/*
 * tests/support/docblock.h: a code block of a doc (docs/NAME.md), for unit tests that check what a
 * doc shows (header only). A block is found by its marker, the line `<!-- doc-test: NAME -->`
 * before its fence (tests/integration/test_docs.py lists such blocks as run ELSEWHERE).
 */
#ifndef KVT_TESTS_DOCBLOCK_H
#define KVT_TESTS_DOCBLOCK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * The lines of the block marked @name in @doc ("docs/api.md", relative to the
 * source tree: $KVT_SOURCE_DIR, which ctest sets, else found from this
 * file's path), without its fences, each ending in '\n'. malloc'd, the
 * caller frees it; NULL when the file or the block is not there.
 */
static inline char *kvt_doc_block(const char *doc, const char *name)
{
    char path[4096], marker[256];
    const char *src = getenv("KVT_SOURCE_DIR");
    if (src != NULL && src[0] != '\0') {
        snprintf(path, sizeof(path), "%s/%s", src, doc);
    } else {
        const char *tail = strstr(__FILE__, "tests/support/docblock.h");
        if (tail == NULL)
            return NULL;
        snprintf(path, sizeof(path), "%.*s%s", (int)(tail - __FILE__), __FILE__, doc);
    }
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    snprintf(marker, sizeof(marker), "<!-- doc-test: %s -->\n", name);
    char line[4096], *out = NULL;
    size_t len = 0;
    int state = 0; /* 0: looking for the marker, 1: the fence is next, 2: inside */
    while (state < 3 && fgets(line, sizeof(line), f) != NULL) {
        if (state == 0 && strcmp(line, marker) == 0) {
            state = 1;
        } else if (state == 1) {
            state = strncmp(line, "```", 3) == 0 ? 2 : 0;
        } else if (state == 2 && strncmp(line, "```", 3) == 0) {
            state = 3;
        } else if (state == 2) {
            size_t n = strlen(line);
            char *grown = realloc(out, len + n + 1);
            if (grown == NULL)
                break;
            out = grown;
            memcpy(out + len, line, n + 1);
            len += n;
        }
    }
    fclose(f);
    if (state != 3) {
        free(out);
        return NULL;
    }
    if (out == NULL)
        out = calloc(1, 1);
    return out;
}

#endif
