#include "common/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* Longest message before escaping; longer ones are cut and end in "...". */
#define LOG_MSG_MAX 2048
/* Escaping grows a byte to at most 4 ("\xNN"); the rest is timestamp, level, component. */
#define LOG_LINE_MAX (4 * LOG_MSG_MAX + 256)
#define LOG_COMPONENT_MAX 48

atomic_int kvt_log_level_g = KVT_LOG_INFO;
static atomic_int log_format = KVT_LOG_TEXT;
static _Atomic(FILE *) log_stream = NULL; /* NULL means stderr (not a constant) */

/* Orders whole lines between threads. flockfile() alone would do for glibc, but
 * ThreadSanitizer cannot see that lock; a line costs far more than the mutex. */
static pthread_mutex_t log_write_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void kvt_log_set_level(kvt_log_level_t level)
{
    int l = (int)level;
    if (l < KVT_LOG_ERROR)
        l = KVT_LOG_ERROR;
    if (l > KVT_LOG_DEBUG)
        l = KVT_LOG_DEBUG;
    atomic_store_explicit(&kvt_log_level_g, l, memory_order_relaxed);
}

kvt_log_level_t kvt_log_get_level(void)
{
    return (kvt_log_level_t)atomic_load_explicit(&kvt_log_level_g, memory_order_relaxed);
}

kvt_status_t kvt_log_parse_level(const char *name, kvt_log_level_t *level_p)
{
    if (name == NULL)
        return KVT_ERR_INVAL;
    for (int l = KVT_LOG_ERROR; l <= KVT_LOG_DEBUG; l++) {
        if (strcasecmp(name, level_names[l]) == 0) {
            *level_p = (kvt_log_level_t)l;
            return KVT_OK;
        }
    }
    if (strcasecmp(name, "warning") == 0) {
        *level_p = KVT_LOG_WARN;
        return KVT_OK;
    }
    return KVT_ERR_INVAL;
}

const char *kvt_log_level_name(kvt_log_level_t level)
{
    if ((int)level < KVT_LOG_ERROR || (int)level > KVT_LOG_DEBUG)
        return "unknown";
    return level_names[level];
}

void kvt_log_set_format(kvt_log_format_t format)
{
    atomic_store_explicit(&log_format, format == KVT_LOG_LOGFMT ? KVT_LOG_LOGFMT : KVT_LOG_TEXT,
                          memory_order_relaxed);
}

void kvt_log_set_stream(FILE *stream)
{
    atomic_store_explicit(&log_stream, stream, memory_order_release);
}

/* A bounded string builder over a caller's buffer; appends past the end are dropped. */
typedef struct line {
    char *buf;
    size_t len;
    size_t cap; /* bytes in buf; appends stop one short, keeping room for the newline */
} line_t;

static void line_putc(line_t *l, char c)
{
    if (l->len + 1 < l->cap)
        l->buf[l->len++] = c;
}

static void line_puts(line_t *l, const char *s)
{
    while (*s != '\0')
        line_putc(l, *s++);
}

/*
 * Appends @s with control characters escaped so the line stays one line; in quoted
 * (logfmt) form also escapes '"' and '\'.
 */
static void line_put_escaped(line_t *l, const char *s, bool quoted)
{
    static const char hex[] = "0123456789abcdef";

    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        switch (c) {
        case '\n': line_puts(l, "\\n"); break;
        case '\r': line_puts(l, "\\r"); break;
        case '\t': line_puts(l, "\\t"); break;
        case '"':
        case '\\':
            if (quoted)
                line_putc(l, '\\');
            line_putc(l, (char)c);
            break;
        default:
            if (c < 0x20 || c == 0x7f) {
                line_puts(l, "\\x");
                line_putc(l, hex[c >> 4]);
                line_putc(l, hex[c & 0xf]);
            } else {
                line_putc(l, (char)c);
            }
        }
    }
}

/* A logfmt value is written bare when it has no space, '=', '"', '\' or control byte. */
static bool logfmt_needs_quotes(const char *s)
{
    if (*s == '\0')
        return true;
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (c <= ' ' || c == '=' || c == '"' || c == '\\' || c == 0x7f)
            return true;
    }
    return false;
}

static void line_put_logfmt_value(line_t *l, const char *s)
{
    if (logfmt_needs_quotes(s)) {
        line_putc(l, '"');
        line_put_escaped(l, s, true);
        line_putc(l, '"');
    } else {
        line_puts(l, s);
    }
}

/* "kvindex/index.c" -> "index"; NULL -> "kvtier". */
static void component_from_file(const char *file, char *out, size_t cap)
{
    if (file == NULL) {
        snprintf(out, cap, "kvtier");
        return;
    }
    const char *base = strrchr(file, '/');
    base = base != NULL ? base + 1 : file;
    const char *dot = strrchr(base, '.');
    size_t n = dot != NULL && dot != base ? (size_t)(dot - base) : strlen(base);
    snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), base);
}

/* "2026-11-21T10:00:00.123Z" (UTC, milliseconds). */
static void format_timestamp(char *out, size_t cap)
{
    struct timespec ts;
    struct tm tm;

    clock_gettime(CLOCK_REALTIME, &ts);
    if (gmtime_r(&ts.tv_sec, &tm) == NULL) {
        snprintf(out, cap, "-");
        return;
    }
    size_t n = strftime(out, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, cap - n, ".%03dZ", (int)(ts.tv_nsec / 1000000));
}

static const char *errno_text(int errnum, char *buf, size_t cap)
{
#if defined(_GNU_SOURCE)
    return strerror_r(errnum, buf, cap); /* GNU form: may return a static string */
#else
    if (strerror_r(errnum, buf, cap) != 0)
        snprintf(buf, cap, "errno %d", errnum);
    return buf;
#endif
}

/* Formats and writes one line; @errnum < 0 means no strerror suffix. */
__attribute__((format(printf, 5, 0))) static void log_vwrite(kvt_log_level_t level,
                                                             const char *component,
                                                             const char *file, int errnum,
                                                             const char *fmt, va_list ap)
{
    int saved_errno = errno;
    char msg[LOG_MSG_MAX];
    char comp[LOG_COMPONENT_MAX];
    char ts[40];
    char buf[LOG_LINE_MAX];
    line_t l = {buf, 0, sizeof(buf)};

    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    if (n < 0) {
        snprintf(msg, sizeof(msg), "(bad log format \"%s\")", fmt);
    } else if (errnum >= 0) {
        size_t used = (size_t)n < sizeof(msg) ? (size_t)n : sizeof(msg) - 1;
        char ebuf[128];
        n = (int)used + snprintf(msg + used, sizeof(msg) - used, ": %s",
                                 errno_text(errnum, ebuf, sizeof(ebuf)));
    }
    if (n >= (int)sizeof(msg))
        memcpy(msg + sizeof(msg) - 4, "...", 4);

    if (component != NULL)
        snprintf(comp, sizeof(comp), "%s", component);
    else
        component_from_file(file, comp, sizeof(comp));
    format_timestamp(ts, sizeof(ts));
    const char *lname = kvt_log_level_name(level);

    if (atomic_load_explicit(&log_format, memory_order_relaxed) == KVT_LOG_LOGFMT) {
        line_puts(&l, "ts=");
        line_puts(&l, ts);
        line_puts(&l, " level=");
        line_puts(&l, lname);
        line_puts(&l, " component=");
        line_put_logfmt_value(&l, comp);
        line_puts(&l, " msg=\"");
        line_put_escaped(&l, msg, true);
        line_putc(&l, '"');
    } else {
        char head[96];
        snprintf(head, sizeof(head), "%s %-5s ", ts, lname);
        line_puts(&l, head);
        line_put_escaped(&l, comp, false);
        line_puts(&l, ": ");
        line_put_escaped(&l, msg, false);
    }
    /* The buffer always has room for the newline: cap keeps one byte spare. */
    l.buf[l.len++] = '\n';

    FILE *out = atomic_load_explicit(&log_stream, memory_order_acquire);
    if (out == NULL)
        out = stderr;
    pthread_mutex_lock(&log_write_lock);
    flockfile(out); /* also whole against other writers of the same FILE */
    fwrite(l.buf, 1, l.len, out);
    fflush(out);
    funlockfile(out);
    pthread_mutex_unlock(&log_write_lock);
    errno = saved_errno;
}

void kvt_log_write(kvt_log_level_t level, const char *component, const char *file, const char *fmt,
                   ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_vwrite(level, component, file, -1, fmt, ap);
    va_end(ap);
}

void kvt_log_write_errno(kvt_log_level_t level, const char *component, const char *file, int errnum,
                         const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_vwrite(level, component, file, errnum, fmt, ap);
    va_end(ap);
}
