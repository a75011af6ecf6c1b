/*
 * kvtier: the command-line tool. `kvtier <subcommand> [options]`.
 *
 * Subcommands live in one table (kvt_cli_cmds); each gets argv starting at
 * its own name and returns the process exit code. Every usage or input error
 * ends in exactly one stderr line "kvtier: <message>" and exit code 2, so
 * scripts can tell bad input (2) from runtime failures (1).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "kvindex/hash.h"
#include "kvindex/tokens.h"

#define KVT_CLI_EXIT_OK 0
#define KVT_CLI_EXIT_FAIL 1  /* runtime failure: out of memory, write error */
#define KVT_CLI_EXIT_USAGE 2 /* malformed command line or input */

#define KVT_CLI_MAX_BLOCK_SIZE 1048576u
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
static int
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
static int kvt_cli_parse_u64(const char *s, uint64_t *out_p)
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
 * after writing a message (no newline) into @err.
 */
static int kvt_cli_read_file(const char *path, char **buf_p, size_t *len_p, char *err,
                             size_t errlen)
{
    int is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0, cap = 0;

    if (f == NULL) {
        snprintf(err, errlen, "cannot open tokens file '%s': %s", path, strerror(errno));
        return -1;
    }
    for (;;) {
        if (len == cap) {
            if (cap >= KVT_CLI_MAX_FILE) {
                snprintf(err, errlen, "tokens file '%s' is larger than %zu bytes", path,
                         KVT_CLI_MAX_FILE);
                goto err_free;
            }
            size_t ncap = cap == 0 ? 65536 : cap * 2;
            char *nbuf = realloc(buf, ncap);
            if (nbuf == NULL) {
                snprintf(err, errlen, "out of memory reading tokens file '%s'", path);
                goto err_free;
            }
            buf = nbuf;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                snprintf(err, errlen, "cannot read tokens file '%s': %s", path, strerror(errno));
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

static void kvt_cli_print_array(FILE *out, const uint64_t *v, size_t n)
{
    fputc('[', out);
    for (size_t i = 0; i < n; i++)
        fprintf(out, i == 0 ? "%" PRIu64 : ",%" PRIu64, v[i]);
    fputc(']', out);
}

/* ---- kvtier hash ---------------------------------------------------------------------- */

static void kvt_cli_hash_usage(FILE *out)
{
    fprintf(out,
            "usage: kvtier hash --block-size B [--seed S] (--tokens LIST | --tokens-file F)\n"
            "\n"
            "Hashes every full block of a token list with kvtier's hashing standard and\n"
            "prints one JSON line: {\"block_size\":B,\"local\":[...],\"seq\":[...]}.\n"
            "\n"
            "  --block-size B    tokens per block, 1..%u\n"
            "  --seed S          XXH3 seed, an unsigned 64-bit decimal (default %u)\n"
            "  --tokens LIST     token ids: decimals separated by commas and/or\n"
            "                    whitespace, optionally inside [ ]\n"
            "  --tokens-file F   read the list from file F ('-' reads stdin)\n"
            "\n"
            "Options take their value as '--opt V' or '--opt=V'. Exit codes: 0 ok,\n"
            "1 runtime failure, 2 bad usage or input (one 'kvtier: ...' line on stderr).\n",
            KVT_CLI_MAX_BLOCK_SIZE, KVT_HASH_SEED);
}

enum { KVT_HOPT_BLOCK, KVT_HOPT_SEED, KVT_HOPT_TOKENS, KVT_HOPT_FILE, KVT_HOPT_COUNT };

static const char *const kvt_cli_hash_opts[KVT_HOPT_COUNT] = {
    [KVT_HOPT_BLOCK] = "--block-size",
    [KVT_HOPT_SEED] = "--seed",
    [KVT_HOPT_TOKENS] = "--tokens",
    [KVT_HOPT_FILE] = "--tokens-file",
};

static int kvt_cli_hash_main(int argc, char **argv)
{
    const char *val[KVT_HOPT_COUNT] = {NULL};
    uint64_t block_size = 0, seed = KVT_HASH_SEED;
    char *text = NULL;
    size_t text_len = 0;
    uint32_t *tokens = NULL;
    size_t ntokens = 0;
    uint64_t *hashes = NULL;
    char err[256];
    int rc;

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            kvt_cli_hash_usage(stdout);
            return KVT_CLI_EXIT_OK;
        }
        if (strncmp(arg, "--", 2) != 0)
            return kvt_cli_fail("hash: unexpected argument '%s'", arg);
        const char *eq = strchr(arg, '=');
        size_t name_len = eq != NULL ? (size_t)(eq - arg) : strlen(arg);
        int opt = -1;
        for (int o = 0; o < KVT_HOPT_COUNT; o++)
            if (strlen(kvt_cli_hash_opts[o]) == name_len &&
                strncmp(arg, kvt_cli_hash_opts[o], name_len) == 0)
                opt = o;
        if (opt < 0)
            return kvt_cli_fail("hash: unknown option '%.*s'", (int)name_len, arg);
        if (val[opt] != NULL)
            return kvt_cli_fail("hash: option %s given twice", kvt_cli_hash_opts[opt]);
        if (eq != NULL) {
            val[opt] = eq + 1;
        } else {
            if (i + 1 >= argc)
                return kvt_cli_fail("hash: option %s needs a value", kvt_cli_hash_opts[opt]);
            val[opt] = argv[++i];
        }
    }

    if (val[KVT_HOPT_BLOCK] == NULL)
        return kvt_cli_fail("hash: --block-size is required");
    if (kvt_cli_parse_u64(val[KVT_HOPT_BLOCK], &block_size) != 0 || block_size < 1 ||
        block_size > KVT_CLI_MAX_BLOCK_SIZE)
        return kvt_cli_fail("hash: --block-size must be an integer in 1..%u, got '%s'",
                            KVT_CLI_MAX_BLOCK_SIZE, val[KVT_HOPT_BLOCK]);
    if (val[KVT_HOPT_SEED] != NULL && kvt_cli_parse_u64(val[KVT_HOPT_SEED], &seed) != 0)
        return kvt_cli_fail("hash: --seed must be an unsigned 64-bit integer, got '%s'",
                            val[KVT_HOPT_SEED]);
    if ((val[KVT_HOPT_TOKENS] == NULL) == (val[KVT_HOPT_FILE] == NULL))
        return kvt_cli_fail("hash: give exactly one of --tokens and --tokens-file");

    kvt_status_t st;
    if (val[KVT_HOPT_TOKENS] != NULL) {
        const char *list = val[KVT_HOPT_TOKENS];
        st = kvt_tokens_parse(list, strlen(list), &tokens, &ntokens, err, sizeof(err));
        if (st != KVT_OK)
            return kvt_cli_fail("hash: --tokens: %s", err);
    } else {
        const char *path = val[KVT_HOPT_FILE];
        if (kvt_cli_read_file(path, &text, &text_len, err, sizeof(err)) != 0)
            return kvt_cli_fail("hash: %s", err);
        st = kvt_tokens_parse(text, text_len, &tokens, &ntokens, err, sizeof(err));
        free(text);
        if (st != KVT_OK)
            return kvt_cli_fail("hash: tokens file '%s': %s", path, err);
    }

    size_t nblocks = ntokens / block_size;
    uint64_t *local = NULL, *seq = NULL;
    if (nblocks > 0) {
        hashes = malloc(2 * nblocks * sizeof(*hashes));
        if (hashes == NULL) {
            fprintf(stderr, "kvtier: hash: out of memory for %zu blocks\n", nblocks);
            rc = KVT_CLI_EXIT_FAIL;
            goto err_free_tokens;
        }
        local = hashes;
        seq = hashes + nblocks;
        kvt_hash_seq(tokens, ntokens, (uint32_t)block_size, seed, NULL, local, seq);
    }

    printf("{\"block_size\":%" PRIu64 ",\"local\":", block_size);
    kvt_cli_print_array(stdout, local, nblocks);
    fputs(",\"seq\":", stdout);
    kvt_cli_print_array(stdout, seq, nblocks);
    fputs("}\n", stdout);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "kvtier: hash: cannot write output: %s\n", strerror(errno));
        rc = KVT_CLI_EXIT_FAIL;
        goto err_free_hashes;
    }
    rc = KVT_CLI_EXIT_OK;

err_free_hashes:
    free(hashes);
err_free_tokens:
    free(tokens);
    return rc;
}

/* ---- dispatch ------------------------------------------------------------------------- */

/* Later subcommands (query, events, stats against a running kvtierd) add a row here. */
static const kvt_cli_cmd_t kvt_cli_cmds[] = {
    {"hash", "hash a token list into block keys (local and seq hashes)", kvt_cli_hash_main,
     kvt_cli_hash_usage},
};

#define KVT_CLI_NCMDS (sizeof(kvt_cli_cmds) / sizeof(kvt_cli_cmds[0]))

static void kvt_cli_usage(FILE *out)
{
    fprintf(out, "usage: kvtier <subcommand> [options]\n\nsubcommands:\n");
    for (size_t i = 0; i < KVT_CLI_NCMDS; i++)
        fprintf(out, "  %-10s %s\n", kvt_cli_cmds[i].name, kvt_cli_cmds[i].summary);
    fprintf(out, "  %-10s %s\n", "help", "this text, or 'help <subcommand>' for one");
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
