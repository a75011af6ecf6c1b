/*
 * common/errtext.h: how error text travels, everywhere in kvtier, and the one
 * function that writes it.
 *
 * A function that can say why it failed takes the caller's buffer as its last
 * two parameters:
 *
 *     kvt_status_t kvt_foo_decode(..., char *err, size_t errlen);
 *
 * @errlen is the size of @err in bytes. On a failure the function writes one
 * line there: it starts lowercase and has no trailing period or newline; a
 * long text is cut to fit, and it is always NUL-terminated when @errlen > 0.
 * @errlen 0 asks for no text, and then @err may be NULL. On success the buffer
 * says nothing (a function may have cleared it; one that leaves a note there
 * on success, such as the first skipped event of a batch, says so in its
 * comment). The text is the caller's: no static or per-thread buffer, no
 * pointer into the callee's state. Callers own the buffer, typically on the
 * stack (char err[256]); text is formatted only on the error path, so passing
 * it costs a success path two arguments.
 *
 * Not installed: the public API (kvtier/client.h) states the same rule for
 * its own calls.
 */
#ifndef KVT_COMMON_ERRTEXT_H
#define KVT_COMMON_ERRTEXT_H

#include <stdarg.h>
#include <stddef.h>

/*
 * Formats @fmt like snprintf into @err[0..errlen): cut to fit, always
 * NUL-terminated; does nothing when @errlen is 0 (or @err is NULL). Call it
 * only on the error path.
 */
void kvt_errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* kvt_errf() with a va_list, for helpers that add a prefix ("events[3]: ") to their
 * callers' text. */
void kvt_verrf(char *err, size_t errlen, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

#endif
