/*
 * router-plugin/cli/kvtier_query.c: `kvtier hash` (a token list's block keys, computed
 * here with kvindex's hashing standard) and `kvtier query` (which pods of a running
 * kvtierd hold a prompt's prefix), with the JSON output both print.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "kvindex/hash.h"
#include "kvindex/tokens.h"
#include "kvtier/client.h"
#include "router-plugin/cli/kvtier_int.h"

#define KVT_CLI_MAX_BLOCK_SIZE 1048576u
#define KVT_CLI_MAX_SALT 255u /* longest cache salt kvtierd accepts, bytes */

/* ---- the JSON both print ------------------------------------------------------------------- */

static void kvt_cli_print_array(FILE *out, const uint64_t *v, size_t n)
{
    fputc('[', out);
    for (size_t i = 0; i < n; i++)
        fprintf(out, i == 0 ? "%" PRIu64 : ",%" PRIu64, v[i]);
    fputc(']', out);
}

/* Writes @s as a JSON string (quotes, backslashes and control bytes escaped). */
static void kvt_cli_json_str(FILE *out, const char *s)
{
    fputc('"', out);
    for (; *s != '\0'; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(out, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(out, "\\u%04x", ch);
        else
            fputc(ch, out);
    }
    fputc('"', out);
}

/* Writes a finite double in its shortest form that reads back exactly. */
static void kvt_cli_json_double(FILE *out, double d)
{
    char buf[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, sizeof(buf), "%.*g", prec, d);
        if (strtod(buf, NULL) == d)
            break;
    }
    fputs(buf, out);
}

/* ---- kvtier hash ---------------------------------------------------------------------------- */

void kvt_cli_hash_usage(FILE *out)
{
    fprintf(out,
            "usage: kvtier hash --block-size B [--seed S | --cache-salt SALT]\n"
            "                   [--lora NAME [--lora-keys namespace|dynamo]]\n"
            "                   (--tokens LIST | --tokens-file F)\n"
            "\n"
            "Hashes every full block of a token list with kvtier's hashing standard and\n"
            "prints one JSON line: {\"block_size\":B,\"local\":[...],\"seq\":[...]}.\n"
            "\n"
            "  --block-size B    tokens per block, 1..%u\n"
            "  --seed S          XXH3 seed, an unsigned 64-bit decimal (default %u)\n"
            "  --cache-salt SALT a request's cache salt (vLLM/SGLang cache_salt), up to\n"
            "                    %u bytes: it seeds the first block (\"\": no salt);\n"
            "                    the keys kvtierd uses for that salt\n"
            "  --lora NAME       a request's LoRA adapter, up to %u bytes (\"\": none)\n"
            "  --lora-keys M     how kvtierd keys LoRA blocks (its --lora-keys):\n"
            "                    namespace (default; the LoRA does not change the keys)\n"
            "                    or dynamo (Dynamo's keys: the LoRA seeds every block)\n"
            "  --tokens LIST     token ids: decimals separated by commas and/or\n"
            "                    whitespace, optionally inside [ ]\n"
            "  --tokens-file F   read the list from file F ('-' reads stdin)\n"
            "\n"
            "Options take their value as '--opt V' or '--opt=V'. Exit codes: 0 ok,\n"
            "1 runtime failure, 2 bad usage or input (one 'kvtier: ...' line on stderr).\n",
            KVT_CLI_MAX_BLOCK_SIZE, KVT_HASH_SEED, KVT_CLI_MAX_SALT, KVT_CLI_MAX_SALT);
}

enum {
    KVT_HOPT_BLOCK,
    KVT_HOPT_SEED,
    KVT_HOPT_SALT,
    KVT_HOPT_LORA,
    KVT_HOPT_LORA_KEYS,
    KVT_HOPT_TOKENS,
    KVT_HOPT_FILE,
    KVT_HOPT_COUNT
};

static const char *const kvt_cli_hash_opts[KVT_HOPT_COUNT] = {
    [KVT_HOPT_BLOCK] = "--block-size",    [KVT_HOPT_SEED] = "--seed",
    [KVT_HOPT_SALT] = "--cache-salt",     [KVT_HOPT_LORA] = "--lora",
    [KVT_HOPT_LORA_KEYS] = "--lora-keys", [KVT_HOPT_TOKENS] = "--tokens",
    [KVT_HOPT_FILE] = "--tokens-file",
};

/*
 * Checks a --cache-salt value for @cmd: "" is no salt (as in vLLM), else at
 * most KVT_CLI_MAX_SALT bytes (what kvtierd accepts). Returns 0, or the usage
 * exit code after printing the error.
 */
static int kvt_cli_check_salt(const char *cmd, const char *salt)
{
    if (salt != NULL && strlen(salt) > KVT_CLI_MAX_SALT)
        return kvt_cli_fail("%s: --cache-salt is longer than %u bytes", cmd, KVT_CLI_MAX_SALT);
    return 0;
}

int kvt_cli_hash_main(int argc, char **argv)
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
    const char *salt = val[KVT_HOPT_SALT];
    size_t salt_len = salt != NULL ? strlen(salt) : 0;
    if (kvt_cli_check_salt("hash", salt) != 0)
        return KVT_CLI_EXIT_USAGE;
    /* the salted chain is defined on the standard's seed only (kvindex/hash.h) */
    if (salt_len > 0 && seed != KVT_HASH_SEED)
        return kvt_cli_fail("hash: --cache-salt needs the standard seed %u, not --seed %s",
                            KVT_HASH_SEED, val[KVT_HOPT_SEED]);
    const char *mode = val[KVT_HOPT_LORA_KEYS] != NULL ? val[KVT_HOPT_LORA_KEYS] : "namespace";
    if (strcmp(mode, "namespace") != 0 && strcmp(mode, "dynamo") != 0)
        return kvt_cli_fail("hash: --lora-keys must be namespace or dynamo, got '%s'", mode);
    const char *lora = val[KVT_HOPT_LORA];
    if (lora != NULL && strlen(lora) > KVT_CLI_MAX_SALT)
        return kvt_cli_fail("hash: --lora is longer than %u bytes", KVT_CLI_MAX_SALT);
    /* only Dynamo's keys carry the LoRA; they are defined on the standard's seed */
    size_t lora_len = lora != NULL && strcmp(mode, "dynamo") == 0 ? strlen(lora) : 0;
    if (lora_len > 0 && seed != KVT_HASH_SEED)
        return kvt_cli_fail("hash: --lora with --lora-keys dynamo needs the standard seed %u, "
                            "not --seed %s",
                            KVT_HASH_SEED, val[KVT_HOPT_SEED]);
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
        if (kvt_cli_read_file(path, "tokens file", &text, &text_len, err, sizeof(err)) != 0)
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
        kvt_hash_seeds_t seeds;
        kvt_hash_seeds_lora(salt, salt_len, lora, lora_len, &seeds);
        if (lora_len > 0)
            kvt_hash_seq_seeds(tokens, ntokens, (uint32_t)block_size, &seeds, NULL, local, seq);
        else if (salt_len > 0)
            kvt_hash_seq_salted(tokens, ntokens, (uint32_t)block_size, seeds.first, NULL, local,
                                seq);
        else
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
/* ---- kvtier query --------------------------------------------------------------------------- */

void kvt_cli_query_usage(FILE *out)
{
    fprintf(out,
            "usage: kvtier query [--addr A] [--model M] [--lora L] [--cache-salt SALT]\n"
            "                    (--tokens LIST | --tokens-file F | --keys LIST)\n"
            "                    [--pods P1,P2,...] [--timeout MS] [--auth-token T]\n"
            "\n"
            "Asks a running kvtierd which pods hold the longest prefix of a prompt and\n"
            "prints the answer as one JSON line, like POST /v1/query:\n"
            "{\"block_size\":B,\"num_blocks\":N,\"pods\":[{\"pod\":..,\"dp_rank\":..,\n"
            "\"matched_blocks\":..,\"gpu\":..,\"cpu\":..,\"disk\":..,\"score\":..}]} best first.\n"
            "\n"
            "  --addr A          kvtierd's RPC address, host:port or unix:/path\n"
            "                    (default $KVTIER_ADDR, else %s)\n"
            "  --model M         model name (default $KVTIER_MODEL; required)\n"
            "  --lora L          LoRA adapter name (default: the base model)\n"
            "  --cache-salt SALT the request's cache salt (vLLM/SGLang cache_salt), up to\n"
            "                    255 bytes (\"\": none); only prefixes stored with the same\n"
            "                    salt match. Not with --keys (keys already carry it)\n"
            "  --tokens LIST     token ids, as for 'kvtier hash'\n"
            "  --tokens-file F   read the token ids from file F ('-' reads stdin)\n"
            "  --keys LIST       block sequence keys (unsigned 64-bit decimals, separated\n"
            "                    by commas and/or whitespace) instead of tokens\n"
            "  --pods LIST       only rank these pods (comma-separated names)\n"
            "  --timeout MS      connect and call timeout in milliseconds (default 1000)\n"
            "  --auth-token T    token for HELLO (default $KVTIER_TOKEN)\n"
            "\n"
            "Exit codes: 0 ok, 1 server or connection error, 2 bad usage or input\n"
            "(one 'kvtier: ...' line on stderr).\n",
            KVT_CLIENT_DEFAULT_ADDR);
}

enum {
    KVT_QOPT_ADDR,
    KVT_QOPT_MODEL,
    KVT_QOPT_LORA,
    KVT_QOPT_TOKENS,
    KVT_QOPT_FILE,
    KVT_QOPT_KEYS,
    KVT_QOPT_PODS,
    KVT_QOPT_TIMEOUT,
    KVT_QOPT_TOKEN,
    KVT_QOPT_SALT,
    KVT_QOPT_COUNT
};

static const char *const kvt_cli_query_opts[KVT_QOPT_COUNT + 1] = {
    [KVT_QOPT_ADDR] = "--addr",        [KVT_QOPT_MODEL] = "--model",
    [KVT_QOPT_LORA] = "--lora",        [KVT_QOPT_TOKENS] = "--tokens",
    [KVT_QOPT_FILE] = "--tokens-file", [KVT_QOPT_KEYS] = "--keys",
    [KVT_QOPT_PODS] = "--pods",        [KVT_QOPT_TIMEOUT] = "--timeout",
    [KVT_QOPT_TOKEN] = "--auth-token", [KVT_QOPT_SALT] = "--cache-salt",
    [KVT_QOPT_COUNT] = NULL,
};

/* Parses "k1,k2 k3": unsigned 64-bit decimals separated by commas and/or whitespace. */
static int kvt_cli_parse_keys(const char *s, uint64_t **keys_p, size_t *n_p)
{
    size_t cap = 0, n = 0;
    uint64_t *keys = NULL;
    char tok[32];

    while (*s != '\0') {
        while (*s == ',' || *s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
            s++;
        if (*s == '\0')
            break;
        size_t len = strcspn(s, ", \t\r\n");
        if (len >= sizeof(tok))
            goto err_free;
        memcpy(tok, s, len);
        tok[len] = '\0';
        uint64_t v;
        if (kvt_cli_parse_u64(tok, &v) != 0)
            goto err_free;
        if (n == cap) {
            cap = cap == 0 ? 64 : cap * 2;
            uint64_t *nk = realloc(keys, cap * sizeof(*nk));
            if (nk == NULL)
                goto err_free;
            keys = nk;
        }
        keys[n++] = v;
        s += len;
    }
    *keys_p = keys;
    *n_p = n;
    return 0;

err_free:
    free(keys);
    return -1;
}

/* Splits "a,b,c" into a malloc'd array of pointers into a malloc'd copy (*@buf_p). */
static int kvt_cli_split_pods(const char *s, char **buf_p, const char ***pods_p, size_t *n_p)
{
    size_t n = 1;
    for (const char *p = s; *p != '\0'; p++)
        n += *p == ',';
    char *buf = strdup(s);
    const char **pods = calloc(n, sizeof(*pods));
    if (buf == NULL || pods == NULL) {
        free(buf);
        free(pods);
        return -1;
    }
    size_t i = 0;
    for (char *p = buf;;) {
        char *comma = strchr(p, ',');
        if (comma != NULL)
            *comma = '\0';
        if (*p == '\0' || strlen(p) > 255) {
            free(buf);
            free(pods);
            return -2;
        }
        pods[i++] = p;
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    *buf_p = buf;
    *pods_p = pods;
    *n_p = n;
    return 0;
}

int kvt_cli_query_main(int argc, char **argv)
{
    const char *val[KVT_QOPT_COUNT] = {NULL};
    const char *pos[1];
    int npos = 0;
    uint32_t *tokens = NULL;
    uint64_t *keys = NULL;
    size_t n = 0, npods = 0;
    char *podbuf = NULL;
    const char **pods = NULL;
    kvt_client_t *c = NULL;
    kvt_client_result_t res;
    char err[256];
    int rc;

    rc = kvt_cli_opts("query", argc, argv, kvt_cli_query_opts, val, pos, 0, &npos,
                      kvt_cli_query_usage);
    if (rc != 0)
        return rc == 1 ? KVT_CLI_EXIT_OK : rc;
    const char *model = val[KVT_QOPT_MODEL] != NULL ? val[KVT_QOPT_MODEL] : getenv("KVTIER_MODEL");
    if (model == NULL || model[0] == '\0')
        return kvt_cli_fail("query: --model is required (or set KVTIER_MODEL)");
    if (strlen(model) > 255)
        return kvt_cli_fail("query: --model is longer than 255 bytes");
    if (val[KVT_QOPT_LORA] != NULL && strlen(val[KVT_QOPT_LORA]) > 255)
        return kvt_cli_fail("query: --lora is longer than 255 bytes");
    int given = (val[KVT_QOPT_TOKENS] != NULL) + (val[KVT_QOPT_FILE] != NULL) +
                (val[KVT_QOPT_KEYS] != NULL);
    if (given != 1)
        return kvt_cli_fail("query: give exactly one of --tokens, --tokens-file and --keys");
    const char *salt = val[KVT_QOPT_SALT];
    if (kvt_cli_check_salt("query", salt) != 0)
        return KVT_CLI_EXIT_USAGE;
    if (salt != NULL && salt[0] != '\0' && val[KVT_QOPT_KEYS] != NULL)
        return kvt_cli_fail("query: --cache-salt goes with --tokens or --tokens-file: "
                            "--keys already carry their salt");

    if (val[KVT_QOPT_TOKENS] != NULL) {
        const char *list = val[KVT_QOPT_TOKENS];
        if (kvt_tokens_parse(list, strlen(list), &tokens, &n, err, sizeof(err)) != KVT_OK)
            return kvt_cli_fail("query: --tokens: %s", err);
    } else if (val[KVT_QOPT_FILE] != NULL) {
        const char *path = val[KVT_QOPT_FILE];
        char *text = NULL;
        size_t text_len = 0;
        if (kvt_cli_read_file(path, "tokens file", &text, &text_len, err, sizeof(err)) != 0)
            return kvt_cli_fail("query: %s", err);
        kvt_status_t st = kvt_tokens_parse(text, text_len, &tokens, &n, err, sizeof(err));
        free(text);
        if (st != KVT_OK)
            return kvt_cli_fail("query: tokens file '%s': %s", path, err);
    } else if (kvt_cli_parse_keys(val[KVT_QOPT_KEYS], &keys, &n) != 0) {
        return kvt_cli_fail("query: --keys must be unsigned 64-bit decimals separated by "
                            "commas or spaces");
    }
    if (val[KVT_QOPT_PODS] != NULL) {
        int r = kvt_cli_split_pods(val[KVT_QOPT_PODS], &podbuf, &pods, &npods);
        if (r != 0) {
            rc = r == -1 ? KVT_CLI_EXIT_FAIL : KVT_CLI_EXIT_USAGE;
            kvt_cli_fail("query: %s", r == -1
                                          ? "out of memory"
                                          : "--pods names must be 1..255 bytes, comma-separated");
            goto out;
        }
    }

    rc = kvt_cli_connect("query", val[KVT_QOPT_ADDR], val[KVT_QOPT_TIMEOUT], val[KVT_QOPT_TOKEN],
                         &c);
    if (rc != KVT_CLI_EXIT_OK)
        goto out;
    const char *lora = val[KVT_QOPT_LORA];
    kvt_status_t st =
        val[KVT_QOPT_KEYS] != NULL
            ? kvt_client_query_keys(c, model, lora, keys, n, pods, npods, &res)
            : kvt_client_query_salted(c, model, lora, salt, tokens, n, pods, npods, &res);
    if (st != KVT_OK) {
        rc = kvt_cli_call_failed("query", c, st);
        goto out;
    }
    printf("{\"block_size\":%" PRIu32 ",\"num_blocks\":%" PRIu32 ",\"pods\":[", res.block_size,
           res.num_blocks);
    for (size_t i = 0; i < res.npods; i++) {
        const kvt_client_pod_t *p = &res.pods[i];
        fputs(i == 0 ? "{\"pod\":" : ",{\"pod\":", stdout);
        kvt_cli_json_str(stdout, p->pod);
        printf(",\"dp_rank\":%" PRIu32 ",\"matched_blocks\":%" PRIu32 ",\"gpu\":%" PRIu32
               ",\"cpu\":%" PRIu32 ",\"disk\":%" PRIu32 ",\"score\":",
               p->dp_rank, p->matched, p->gpu, p->cpu, p->disk);
        kvt_cli_json_double(stdout, p->score);
        fputc('}', stdout);
    }
    fputs("]}\n", stdout);
    kvt_client_result_free(&res);
    rc = kvt_cli_finish("query");
out:
    kvt_client_destroy(c);
    free(pods);
    free(podbuf);
    free(tokens);
    free(keys);
    return rc;
}
