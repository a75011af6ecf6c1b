/*
 * kvtier: the command-line tool. `kvtier <subcommand> [options]`.
 *
 * Subcommands live in one table (kvt_cli_cmds); each gets argv starting at
 * its own name and returns the process exit code. Every usage or input error
 * ends in exactly one stderr line "kvtier: <message>" and exit code 2, so
 * scripts can tell bad input (2) from runtime failures (1). This file holds the
 * table, main() and the helpers the subcommands share (kvtier_int.h);
 * kvtier_query.c has `hash` and `query`, kvtier_admin.c the rest.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errtext.h"
#include "common/status.h"
#include "common/version.h"
#include "kvtier/client.h"
#include "router-plugin/cli/kvtier_int.h"

/* Biggest tokens file read into memory: KVT_TOKENS_MAX ids of 10 digits plus separators fit. */
#define KVT_CLI_MAX_FILE ((size_t)1 << 30)

typedef struct kvt_cli_cmd {
    const char *name;
    const char *summary;
    int (*main)(int argc, char **argv);
    void (*usage)(FILE *out);
} kvt_cli_cmd_t;

#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
int
kvt_cli_fail(const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* Keep the promise of one line even if a file name carries control bytes. */
    for (char *c = msg; *c != '\0'; c++)
        if ((unsigned char)*c < 0x20)
            *c = '?';
    fprintf(stderr, "kvtier: %s\n", msg);
    return KVT_CLI_EXIT_USAGE;
}

/* Strict unsigned decimal: digits only, no sign, no spaces, no overflow. */
int kvt_cli_parse_u64(const char *s, uint64_t *out_p)
{
    uint64_t v = 0;

    if (*s == '\0')
        return -1;
    for (; *s != '\0'; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out_p = v;
    return 0;
}

/*
 * Reads all of @path ("-" is stdin) into a malloc'd buffer. Returns 0, or -1
 * after writing a message (no newline, naming the file as @what) into @err.
 */
int kvt_cli_read_file(const char *path, const char *what, char **buf_p, size_t *len_p, char *err,
                      size_t errlen)
{
    int is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0, cap = 0;

    if (f == NULL) {
        kvt_errf(err, errlen, "cannot open %s '%s': %s", what, path, strerror(errno));
        return -1;
    }
    for (;;) {
        if (len == cap) {
            if (cap >= KVT_CLI_MAX_FILE) {
                kvt_errf(err, errlen, "%s '%s' is larger than %zu bytes", what, path,
                         KVT_CLI_MAX_FILE);
                goto err_free;
            }
            size_t ncap = cap == 0 ? 65536 : cap * 2;
            char *nbuf = realloc(buf, ncap);
            if (nbuf == NULL) {
                kvt_errf(err, errlen, "out of memory reading %s '%s'", what, path);
                goto err_free;
            }
            buf = nbuf;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                kvt_errf(err, errlen, "cannot read %s '%s': %s", what, path, strerror(errno));
                goto err_free;
            }
            break;
        }
    }
    if (!is_stdin)
        fclose(f);
    *buf_p = buf;
    *len_p = len;
    return 0;

err_free:
    free(buf);
    if (!is_stdin)
        fclose(f);
    return -1;
}

/* ---- options shared by the subcommands that talk to kvtierd --------------------------------- */

/*
 * Parses "--name V" / "--name=V" options listed in @names (NULL-terminated)
 * into @val (same index; each at most once) and collects up to @maxpos
 * positional arguments. Returns 0, 1 for --help (@usage printed), or the
 * usage exit code after printing the error.
 */
int kvt_cli_opts(const char *cmd, int argc, char **argv, const char *const *names, const char **val,
                 const char **pos, int maxpos, int *npos_p, void (*usage)(FILE *out))
{
    int npos = 0;

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            usage(stdout);
            return 1;
        }
        if (strcmp(arg, "-") == 0 || strncmp(arg, "-", 1) != 0) {
            if (npos >= maxpos)
                return kvt_cli_fail("%s: unexpected argument '%s'", cmd, arg);
            pos[npos++] = arg;
            continue;
        }
        if (strncmp(arg, "--", 2) != 0)
            return kvt_cli_fail("%s: unknown option '%s'", cmd, arg);
        const char *eq = strchr(arg, '=');
        size_t name_len = eq != NULL ? (size_t)(eq - arg) : strlen(arg);
        int opt = -1;
        for (int o = 0; names[o] != NULL; o++)
            if (strlen(names[o]) == name_len && strncmp(arg, names[o], name_len) == 0)
                opt = o;
        if (opt < 0)
            return kvt_cli_fail("%s: unknown option '%.*s'", cmd, (int)name_len, arg);
        if (val[opt] != NULL)
            return kvt_cli_fail("%s: option %s given twice", cmd, names[opt]);
        if (eq != NULL) {
            val[opt] = eq + 1;
        } else {
            if (i + 1 >= argc)
                return kvt_cli_fail("%s: option %s needs a value", cmd, names[opt]);
            val[opt] = argv[++i];
        }
    }
    *npos_p = npos;
    return 0;
}

/* Strict decimal in 1..3600000 for millisecond options. */
static int kvt_cli_parse_ms(const char *s, int *ms_p)
{
    uint64_t v;
    if (kvt_cli_parse_u64(s, &v) != 0 || v < 1 || v > 3600000)
        return -1;
    *ms_p = (int)v;
    return 0;
}

/*
 * Makes a client for --addr (else KVTIER_ADDR, else the default) with
 * --timeout and --auth-token (else KVTIER_TOKEN). It connects on its first
 * call, so only local checks happen here. Returns the exit code: 0 with
 * *@c_p set, 2 for a bad address or value, 1 when out of memory.
 */
int kvt_cli_connect(const char *cmd, const char *addr, const char *timeout, const char *token,
                    kvt_client_t **c_p)
{
    kvt_client_opts_t o;
    char err[512];

    kvt_client_opts_default(&o);
    o.lazy_connect = true;
    if (addr == NULL)
        addr = getenv("KVTIER_ADDR");
    if (addr != NULL && addr[0] != '\0')
        o.address = addr;
    if (token == NULL)
        token = getenv("KVTIER_TOKEN");
    o.auth_token = token;
    if (timeout != NULL) {
        if (kvt_cli_parse_ms(timeout, &o.io_timeout_ms) != 0)
            return kvt_cli_fail("%s: --timeout must be milliseconds in 1..3600000, got '%s'", cmd,
                                timeout);
        o.connect_timeout_ms = o.io_timeout_ms;
    }
    kvt_status_t st = kvt_client_create_msg(&o, c_p, err, sizeof(err));
    if (st == KVT_OK)
        return KVT_CLI_EXIT_OK;
    kvt_cli_fail("%s: %s", cmd, err);
    return st == KVT_ERR_INVAL ? KVT_CLI_EXIT_USAGE : KVT_CLI_EXIT_FAIL;
}

/* The failure of a call on @c: one stderr line, exit 1. */
int kvt_cli_call_failed(const char *cmd, kvt_client_t *c, kvt_status_t st)
{
    const char *msg = kvt_client_last_error(c);
    if (msg[0] != '\0')
        kvt_cli_fail("%s: %s", cmd, msg);
    else
        kvt_cli_fail("%s: %s", cmd, kvt_status_str(st));
    return KVT_CLI_EXIT_FAIL;
}

/* Flushes stdout; a write error is a runtime failure. */
int kvt_cli_finish(const char *cmd)
{
    if (fflush(stdout) != 0 || ferror(stdout)) {
        kvt_cli_fail("%s: cannot write output: %s", cmd, strerror(errno));
        return KVT_CLI_EXIT_FAIL;
    }
    return KVT_CLI_EXIT_OK;
}

/* ---- dispatch ------------------------------------------------------------------------------- */

static const kvt_cli_cmd_t kvt_cli_cmds[] = {
    {"hash", "hash a token list into block keys (local and seq hashes)", kvt_cli_hash_main,
     kvt_cli_hash_usage},
    {"query", "ask a running kvtierd which pods hold a prompt's prefix", kvt_cli_query_main,
     kvt_cli_query_usage},
    {"events", "send a JSON events file to a running kvtierd", kvt_cli_events_main,
     kvt_cli_events_usage},
    {"subscribe", "subscribe a running kvtierd to an engine's KV-event stream",
     kvt_cli_subscribe_main, kvt_cli_subscribe_usage},
    {"unsubscribe", "unsubscribe a running kvtierd from an engine, dropping what it held",
     kvt_cli_unsubscribe_main, kvt_cli_unsubscribe_usage},
    {"drop-model", "drop a model (its base and LoRA namespaces) from a running kvtierd's index",
     kvt_cli_drop_model_main, kvt_cli_drop_model_usage},
    {"stats", "print a running kvtierd's statistics (JSON)", kvt_cli_stats_main,
     kvt_cli_stats_usage},
    {"ping", "check that a kvtierd answers", kvt_cli_ping_main, kvt_cli_ping_usage},
};

#define KVT_CLI_NCMDS (sizeof(kvt_cli_cmds) / sizeof(kvt_cli_cmds[0]))

static void kvt_cli_usage(FILE *out)
{
    fprintf(out, "usage: kvtier <subcommand> [options]\n\nsubcommands:\n");
    for (size_t i = 0; i < KVT_CLI_NCMDS; i++)
        fprintf(out, "  %-10s %s\n", kvt_cli_cmds[i].name, kvt_cli_cmds[i].summary);
    fprintf(out, "  %-10s %s\n", "help", "this text, or 'help <subcommand>' for one");
    fprintf(out, "\n'kvtier --version' prints the version and build.\n");
    fprintf(out, "\nexit codes: 0 ok, 1 runtime failure, 2 bad usage or input\n");
}

static const kvt_cli_cmd_t *kvt_cli_find(const char *name)
{
    for (size_t i = 0; i < KVT_CLI_NCMDS; i++)
        if (strcmp(kvt_cli_cmds[i].name, name) == 0)
            return &kvt_cli_cmds[i];
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return kvt_cli_fail("missing subcommand (try 'kvtier --help')");

    const char *name = argv[1];
    if (strcmp(name, "--version") == 0) {
        kvt_version_print(stdout, "kvtier");
        return KVT_CLI_EXIT_OK;
    }
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
        if (argc > 2) {
            const kvt_cli_cmd_t *cmd = kvt_cli_find(argv[2]);
            if (cmd == NULL)
                return kvt_cli_fail("unknown subcommand '%s' (try 'kvtier --help')", argv[2]);
            cmd->usage(stdout);
        } else {
            kvt_cli_usage(stdout);
        }
        return KVT_CLI_EXIT_OK;
    }

    const kvt_cli_cmd_t *cmd = kvt_cli_find(name);
    if (cmd == NULL)
        return kvt_cli_fail("unknown subcommand '%s' (try 'kvtier --help')", name);
    return cmd->main(argc - 1, argv + 1);
}
