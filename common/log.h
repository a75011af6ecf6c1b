/*
 * Logging: one line per event on a stdio stream (stderr unless set), in text form
 *
 *     2026-11-21T10:00:00.123Z warn  index: pod 3 sent an unknown block hash
 *
 * or in logfmt
 *
 *     ts=2026-11-21T10:00:00.123Z level=warn component=index msg="pod 3 sent ..."
 *
 * The kvt_log_<level>() macros read the global level (one relaxed atomic load) before
 * they evaluate or format their arguments, so a disabled debug line costs a compare.
 * Messages are lowercase, without a trailing period or newline (a convention).
 *
 * The component is KVT_LOG_COMPONENT when a .c file defines it (a string literal)
 * before it includes this header, otherwise the base name of the source file
 * ("kvindex/index.c" gives "index").
 *
 * All functions are thread-safe; each line is written with a single locked fwrite.
 */
#ifndef KVT_COMMON_LOG_H
#define KVT_COMMON_LOG_H

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>

#include "common/status.h"

typedef enum kvt_log_level {
    KVT_LOG_ERROR = 0, /* the operation failed; someone should look */
    KVT_LOG_WARN = 1,  /* something unexpected that kvtier handled */
    KVT_LOG_INFO = 2,  /* lifecycle: start, stop, peers joining and leaving (default) */
    KVT_LOG_DEBUG = 3, /* per-request detail; off in production */
} kvt_log_level_t;

typedef enum kvt_log_format {
    KVT_LOG_TEXT = 0,   /* "<ts> <level> <component>: <message>" (default) */
    KVT_LOG_LOGFMT = 1, /* ts=... level=... component=... msg="..." */
} kvt_log_format_t;

/* The current level; read it through the macros or kvt_log_enabled(), set it with
 * kvt_log_set_level(). */
extern atomic_int kvt_log_level_g;

/* True when a message at @level would be written. */
#define kvt_log_enabled(level)                                                                     \
    ((int)(level) <= atomic_load_explicit(&kvt_log_level_g, memory_order_relaxed))

/* Sets the most verbose level that is written; lines above it are dropped. Out-of-range
 * values are clamped to [KVT_LOG_ERROR, KVT_LOG_DEBUG]. */
void kvt_log_set_level(kvt_log_level_t level);

/* Returns the current level. */
kvt_log_level_t kvt_log_get_level(void);

/* Parses "error", "warn" (or "warning"), "info", "debug", case-insensitively.
 * Returns KVT_OK and sets *level_p, or KVT_ERR_INVAL (NULL or unknown name) and
 * leaves *level_p alone. */
kvt_status_t kvt_log_parse_level(const char *name, kvt_log_level_t *level_p);

/* Returns the static lowercase name of @level ("warn"); "unknown" when out of range. */
const char *kvt_log_level_name(kvt_log_level_t level);

/* Selects text or logfmt output for the following lines. */
void kvt_log_set_format(kvt_log_format_t format);

/* Directs the following lines to @stream (borrowed: it must stay open until another
 * stream is set); NULL restores stderr. Each line is flushed after it is written. */
void kvt_log_set_stream(FILE *stream);

/*
 * Formats one line and writes it. Prefer the macros, which skip disabled levels before
 * they evaluate their arguments. @component may be NULL, then the base name of @file
 * without extension is used; @file may be NULL too ("kvtier"). Messages longer than
 * about 2 KiB are cut and end in "...". Control characters in the message are escaped
 * (\n, \t, \xNN) so that one call is one line. Preserves errno.
 */
void kvt_log_write(kvt_log_level_t level, const char *component, const char *file, const char *fmt,
                   ...) __attribute__((format(printf, 4, 5)));

/* Like kvt_log_write(), then appends ": " and strerror(@errnum) to the message. */
void kvt_log_write_errno(kvt_log_level_t level, const char *component, const char *file, int errnum,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#ifdef KVT_LOG_COMPONENT
#define KVT_LOG_COMPONENT_ KVT_LOG_COMPONENT
#else
#define KVT_LOG_COMPONENT_ NULL
#endif

#define KVT_LOG_AT_(level, ...)                                                                    \
    do {                                                                                           \
        if (kvt_log_enabled(level))                                                                \
            kvt_log_write((level), KVT_LOG_COMPONENT_, __FILE__, __VA_ARGS__);                     \
    } while (0)

/* kvt_log_<level>(fmt, ...): printf-style; arguments are evaluated only when enabled. */
#define kvt_log_error(...) KVT_LOG_AT_(KVT_LOG_ERROR, __VA_ARGS__)
#define kvt_log_warn(...) KVT_LOG_AT_(KVT_LOG_WARN, __VA_ARGS__)
#define kvt_log_info(...) KVT_LOG_AT_(KVT_LOG_INFO, __VA_ARGS__)
#define kvt_log_debug(...) KVT_LOG_AT_(KVT_LOG_DEBUG, __VA_ARGS__)

/* kvt_log_errno(level, fmt, ...): logs at @level with ": strerror(errno)" appended;
 * errno is captured before the arguments are evaluated. For failed syscalls. */
#define kvt_log_errno(level, ...)                                                                  \
    do {                                                                                           \
        if (kvt_log_enabled(level)) {                                                              \
            int kvt_log_errno_saved_ = errno;                                                      \
            kvt_log_write_errno((level), KVT_LOG_COMPONENT_, __FILE__, kvt_log_errno_saved_,       \
                                __VA_ARGS__);                                                      \
        }                                                                                          \
    } while (0)

#endif
