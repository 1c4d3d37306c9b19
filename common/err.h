/* Status codes and messages. Library code returns a code and fills a struct err; only main()
 * exits. Messages read `file: field: what is wrong`. */
#ifndef BALLAST_ERR_H
#define BALLAST_ERR_H

/* The values are the process exit statuses (docs/commands.md). */
enum err_code {
    ERR_OK = 0,
    ERR_FAIL = 1,  /* failure while running */
    ERR_INPUT = 2, /* bad input or usage */
    ERR_NOFIT = 3, /* no plan fits */
};

#define ERR_MSG_MAX 4096

struct err {
    int code;
    char msg[ERR_MSG_MAX];
};

/* Sets code and message (printf-style) and returns code. */
int err_set(struct err *e, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Appends a line to the message, keeping the code; returns the code. */
int err_append(struct err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void err_clear(struct err *e);

/* Returns the status of `call` from the enclosing function when it is not ERR_OK (the
 * message is already in the struct err the call was given). */
#define ERR_TRY(call)                                                                        \
    do {                                                                                     \
        int err_try_rc_ = (call);                                                            \
        if (err_try_rc_ != ERR_OK)                                                           \
            return err_try_rc_;                                                              \
    } while (0)

#endif
