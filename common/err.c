#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int err_set(struct err *e, int code, const char *fmt, ...)
{
    va_list ap;
    e->code = code;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return code;
}

int err_append(struct err *e, const char *fmt, ...)
{
    size_t used = strlen(e->msg);
    va_list ap;
    if (used + 2 >= sizeof e->msg)
        return e->code;
    if (used > 0)
        e->msg[used++] = '\n';
    va_start(ap, fmt);
    vsnprintf(e->msg + used, sizeof e->msg - used, fmt, ap);
    va_end(ap);
    return e->code;
}

void err_clear(struct err *e)
{
    e->code = ERR_OK;
    e->msg[0] = '\0';
}
