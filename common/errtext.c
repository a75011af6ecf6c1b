/* common/errtext.c: the error-text formatter (errtext.h). */
#include "common/errtext.h"

#include <stdio.h>

void kvt_verrf(char *err, size_t errlen, const char *fmt, va_list ap)
{
    if (err == NULL || errlen == 0)
        return;
    if (vsnprintf(err, errlen, fmt, ap) < 0)
        err[0] = '\0'; /* an encoding error leaves the buffer undefined */
}

void kvt_errf(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvt_verrf(err, errlen, fmt, ap);
    va_end(ap);
}
