/*
 * kvindex/tokens: parser for token-id lists given by people and tools
 * (`kvtier hash --tokens`, files, stdin).
 */
#ifndef KVT_KVINDEX_TOKENS_H
#define KVT_KVINDEX_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Most tokens one list may hold (64 Mi). */
#define KVT_TOKENS_MAX ((size_t)64 * 1024 * 1024)

/*
 * Parses a token list from @s[0..len): unsigned decimal integers in
 * [0, 4294967295] (leading zeros allowed) separated by commas and/or
 * whitespace (space, tab, CR, LF), optionally wrapped in one `[ ... ]`, with
 * optional whitespace around everything. Exactly one comma may sit between
 * two numbers; a comma before the first or after the last number is an error.
 * An empty list ("", "  ", "[]") is valid.
 *
 * Never reads s[len] or beyond: @s need not be NUL-terminated, and a NUL byte
 * inside it is an error. @s may be NULL when @len is 0.
 *
 * On success returns KVT_OK and sets *@tokens_p to a malloc'd array the caller
 * frees with free() (NULL when the list is empty) and *@n_p to its length.
 * On error *@tokens_p and *@n_p are untouched and, when @err is not NULL and
 * @errlen > 0, @err receives one line (no newline) naming the byte offset and
 * what was expected, e.g. "byte 4: expected a digit after ',', got ','".
 * Returns KVT_ERR_PARSE (malformed), KVT_ERR_RANGE (a value above 4294967295),
 * KVT_ERR_TOO_BIG (more than KVT_TOKENS_MAX tokens), KVT_ERR_NO_MEM, or
 * KVT_ERR_INVAL (NULL outputs, or NULL @s with @len > 0).
 */
kvt_status_t kvt_tokens_parse(const char *s, size_t len, uint32_t **tokens_p, size_t *n_p,
                              char *err, size_t errlen);

/*
 * Same as kvt_tokens_parse() with a lower limit: more than @max_tokens tokens
 * (clamped to KVT_TOKENS_MAX; 0 accepts only an empty list) is KVT_ERR_TOO_BIG,
 * the message naming the first byte of the token over the limit. For callers
 * with a smaller bound (a request body, a model's context length).
 */
kvt_status_t kvt_tokens_parse_max(const char *s, size_t len, size_t max_tokens, uint32_t **tokens_p,
                                  size_t *n_p, char *err, size_t errlen);

#endif
