/*
 * common/config.c: the config table's loader: checks the table, applies defaults, the
 * config file, KVTIER_* environment variables and flags in that order, and writes
 * --dump-config and the usage text. The value types (parse, format, cleanup) are in
 * config_parse.c.
 */
#include "common/config.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/errtext.h"

/* Where a value came from, in increasing precedence. */
enum cfg_src { SRC_NONE, SRC_DEFAULT, SRC_FILE, SRC_ENV, SRC_FLAG };

#define WHY_MAX 160
#define ENV_NAME_MAX 128

/* ---------------------------------------------------------------- table helpers */

kvt_status_t kvt_cfg_env_name(const char *name, char *buf, size_t len)
{
    static const char prefix[] = "KVTIER_";
    size_t need = sizeof(prefix) + strlen(name); /* includes the NUL */
    if (need > len)
        return KVT_ERR_TOO_BIG;
    memcpy(buf, prefix, sizeof(prefix) - 1);
    char *w = buf + sizeof(prefix) - 1;
    for (const char *p = name; *p != '\0'; p++)
        *w++ = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
    *w = '\0';
    return KVT_OK;
}

/* Finds the option called @name[0..len); with @loose, '_' in @name matches '-'. */
static const kvt_cfg_opt_t *find_opt(const kvt_cfg_opt_t *table, size_t n, const char *name,
                                     size_t len, bool loose)
{
    for (size_t i = 0; i < n; i++) {
        const char *o = table[i].name;
        size_t j = 0;
        for (; j < len && o[j] != '\0'; j++) {
            char c = name[j];
            if (loose && c == '_')
                c = '-';
            if (c != o[j])
                break;
        }
        if (j == len && o[j] == '\0')
            return &table[i];
    }
    return NULL;
}

static bool is_reserved(const char *name)
{
    return strcmp(name, "config") == 0 || strcmp(name, "help") == 0 ||
           strcmp(name, "dump-config") == 0;
}

static kvt_status_t check_table(const kvt_cfg_opt_t *table, size_t n, size_t cfg_size, char *err,
                                size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        const kvt_cfg_opt_t *o = &table[i];
        if (o->name == NULL || o->name[0] == '\0' || o->name[0] == '-') {
            kvt_errf(err, errlen, "config table: option %zu has no name", i);
            return KVT_ERR_INVAL;
        }
        const kvt_cfg_type_t *t = o->type;
        if (t == NULL || t->parse == NULL || t->format == NULL ||
            (t->list && t->size != sizeof(kvt_cfg_list_t))) {
            kvt_errf(err, errlen, "config table: option %s has no usable type", o->name);
            return KVT_ERR_INVAL;
        }
        if (o->offset > cfg_size || t->size > cfg_size - o->offset) {
            kvt_errf(err, errlen, "config table: option %s lies outside the struct", o->name);
            return KVT_ERR_INVAL;
        }
        if (is_reserved(o->name) || find_opt(table, i, o->name, strlen(o->name), false) != NULL) {
            kvt_errf(err, errlen, "config table: option name %s is reserved or repeated", o->name);
            return KVT_ERR_INVAL;
        }
    }
    return KVT_OK;
}

/* Copies @value for an error message: at most 64 bytes, control bytes shown as '?'. */
static void shown_value(const char *value, char *buf, size_t len)
{
    size_t i = 0;
    for (; value[i] != '\0' && i + 1 < len && i < 64; i++)
        buf[i] = iscntrl((unsigned char)value[i]) ? '?' : value[i];
    buf[i] = '\0';
    if (value[i] != '\0' && i >= 3)
        memcpy(buf + i - 3, "...", 3);
}

/* A load in progress: the scratch copy of the caller's struct and who set each field. */
typedef struct load {
    const kvt_cfg_opt_t *table;
    size_t n;
    char *cfg;            /* scratch copy; committed to the caller only on success */
    enum cfg_src *set_by; /* per option: the source that last set it */
    char *err;
    size_t errlen;
} load_t;

/*
 * Applies one value. A list option starts over when a higher source first sets it, so
 * repeats within one source append while the file's list replaces the default's and
 * the flags' list replaces the file's.
 */
static kvt_status_t apply(load_t *ld, const kvt_cfg_opt_t *opt, enum cfg_src src, const char *value,
                          const char *where)
{
    size_t idx = (size_t)(opt - ld->table);
    void *field = ld->cfg + opt->offset;
    char why[WHY_MAX] = "";

    if (opt->type->list && ld->set_by[idx] != src && opt->type->cleanup != NULL)
        opt->type->cleanup(field);
    kvt_status_t st = opt->type->parse(field, value, why, sizeof(why));
    if (st != KVT_OK) {
        char shown[80];
        shown_value(value, shown, sizeof(shown));
        kvt_errf(ld->err, ld->errlen, "%s: bad value '%s': %s", where, shown, why);
        return st == KVT_ERR_NO_MEM ? st : KVT_ERR_INVAL;
    }
    ld->set_by[idx] = src;
    return KVT_OK;
}

/* ---------------------------------------------------------------- file syntax */

static bool is_blank(char c)
{
    return c == ' ' || c == '\t';
}

static bool is_key_char(char c)
{
    return isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.';
}

/*
 * Splits one line (newline already removed) in place. Returns KVT_OK with *key_p NULL
 * for a blank or comment line, KVT_OK with key and value set, or KVT_ERR_INVAL with a
 * reason in @err (@errlen bytes).
 */
static kvt_status_t split_line(char *line, char **key_p, char **value_p, char *err, size_t errlen)
{
    char *p = line;
    *key_p = NULL;
    while (is_blank(*p))
        p++;
    if (*p == '\0' || *p == '#')
        return KVT_OK;

    char *key = p;
    while (is_key_char(*p))
        p++;
    char *key_end = p;
    while (is_blank(*p))
        p++;
    if (key_end == key || *p != '=') {
        kvt_errf(err, errlen, "expected 'key = value'");
        return KVT_ERR_INVAL;
    }
    *key_end = '\0';
    p++;
    while (is_blank(*p))
        p++;

    char *value = p;
    if (*p == '"') {
        char *w = p; /* unescape in place; the text only shrinks */
        for (p++;; p++) {
            if (*p == '\0') {
                kvt_errf(err, errlen, "unterminated quoted value");
                return KVT_ERR_INVAL;
            }
            if (*p == '"')
                break;
            if (*p == '\\') {
                p++;
                switch (*p) {
                case '"': *w++ = '"'; break;
                case '\\': *w++ = '\\'; break;
                case 'n': *w++ = '\n'; break;
                case 't': *w++ = '\t'; break;
                case 'r': *w++ = '\r'; break;
                default:
                    kvt_errf(err, errlen,
                             "unknown escape in quoted value (use \\\" \\\\ \\n \\t \\r)");
                    return KVT_ERR_INVAL;
                }
            } else {
                *w++ = *p;
            }
        }
        *w = '\0';
        for (p++; is_blank(*p); p++)
            ;
        if (*p != '\0' && *p != '#') {
            kvt_errf(err, errlen, "unexpected text after the closing quote");
            return KVT_ERR_INVAL;
        }
    } else {
        /* A '#' first or after a blank starts a comment; quote values that need one. */
        char *end = p;
        for (; *p != '\0'; p++) {
            if (*p == '#' && (p == value || is_blank(p[-1])))
                break;
            end = p + 1;
        }
        while (end > value && is_blank(end[-1]))
            end--;
        *end = '\0';
    }
    *key_p = key;
    *value_p = value;
    return KVT_OK;
}

static kvt_status_t load_file(load_t *ld, const char *path, bool must_exist, bool *read_p)
{
    kvt_status_t st = KVT_OK;
    char *line = NULL;
    size_t cap = 0;
    unsigned lineno = 0;

    *read_p = false;
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        if (!must_exist && errno == ENOENT)
            return KVT_OK;
        kvt_errf(ld->err, ld->errlen, "file %s: cannot open: %s", path, strerror(errno));
        return KVT_ERR_INVAL;
    }

    ssize_t len;
    errno = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (len > 0 && line[len - 1] == '\n')
            line[--len] = '\0';
        if (len > 0 && line[len - 1] == '\r')
            line[--len] = '\0';
        if (strlen(line) != (size_t)len) {
            kvt_errf(ld->err, ld->errlen, "file %s line %u: contains a NUL byte", path, lineno);
            st = KVT_ERR_INVAL;
            goto out;
        }

        char *key, *value;
        char why[WHY_MAX] = "";
        if (split_line(line, &key, &value, why, sizeof(why)) != KVT_OK) {
            kvt_errf(ld->err, ld->errlen, "file %s line %u: %s", path, lineno, why);
            st = KVT_ERR_INVAL;
            goto out;
        }
        if (key == NULL)
            continue;
        const kvt_cfg_opt_t *opt = find_opt(ld->table, ld->n, key, strlen(key), true);
        if (opt == NULL) {
            kvt_errf(ld->err, ld->errlen, "file %s line %u: unknown key '%.64s'", path, lineno,
                     key);
            st = KVT_ERR_INVAL;
            goto out;
        }
        char where[512];
        snprintf(where, sizeof(where), "file %s line %u: %s", path, lineno, opt->name);
        st = apply(ld, opt, SRC_FILE, value, where);
        if (st != KVT_OK)
            goto out;
        errno = 0;
    }
    if (ferror(f)) {
        kvt_errf(ld->err, ld->errlen, "file %s: read failed: %s", path, strerror(errno));
        st = KVT_ERR_INVAL;
        goto out;
    }
    *read_p = true;
out:
    free(line);
    fclose(f);
    return st;
}

/* ---------------------------------------------------------------- flags */

/* A flag that names a table option, kept until the file and environment are applied. */
typedef struct flag_val {
    const kvt_cfg_opt_t *opt;
    const char *value;
    const char *arg; /* the argument as typed, for messages */
} flag_val_t;

typedef struct flag_scan {
    flag_val_t *vals;
    size_t nvals;
    const char *config; /* --config FILE, or NULL */
    bool help;
    bool dump;
    int first_arg;
} flag_scan_t;

static kvt_status_t scan_flags(const kvt_cfg_opt_t *table, size_t n, int argc, char **argv,
                               flag_scan_t *fs, char *err, size_t errlen)
{
    int i = argc > 0 ? 1 : 0; /* argv[0] is the program */
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-' || a[1] == '\0')
            break; /* the first positional argument */
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fs->help = true;
            return KVT_OK;
        }
        if (a[1] != '-') {
            kvt_errf(err, errlen, "flag %.64s: unknown option", a);
            return KVT_ERR_INVAL;
        }
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq != NULL ? (size_t)(eq - name) : strlen(name);

        if (len == 11 && strncmp(name, "dump-config", len) == 0) {
            if (eq != NULL) {
                kvt_errf(err, errlen, "flag --dump-config: takes no value");
                return KVT_ERR_INVAL;
            }
            fs->dump = true;
            continue;
        }

        const char *value = NULL;
        const kvt_cfg_opt_t *opt = NULL;
        bool is_config = len == 6 && strncmp(name, "config", len) == 0;
        if (!is_config)
            opt = find_opt(table, n, name, len, false);
        if (opt == NULL && !is_config && len > 3 && strncmp(name, "no-", 3) == 0) {
            const kvt_cfg_opt_t *neg = find_opt(table, n, name + 3, len - 3, false);
            if (neg != NULL && neg->type == &kvt_cfg_bool) {
                if (eq != NULL) {
                    kvt_errf(err, errlen, "flag --%.*s: takes no value", (int)len, name);
                    return KVT_ERR_INVAL;
                }
                opt = neg;
                value = "false";
            }
        }
        if (opt == NULL && !is_config) {
            kvt_errf(err, errlen, "flag --%.*s: unknown option", (int)(len < 64 ? len : 64), name);
            return KVT_ERR_INVAL;
        }
        if (value == NULL) {
            if (eq != NULL)
                value = eq + 1;
            else if (opt != NULL && opt->type == &kvt_cfg_bool)
                value = "true";
            else if (i + 1 < argc)
                value = argv[++i];
            else {
                kvt_errf(err, errlen, "flag --%.*s: missing value", (int)len, name);
                return KVT_ERR_INVAL;
            }
        }
        if (is_config) {
            fs->config = value;
            continue;
        }
        fs->vals[fs->nvals++] = (flag_val_t){opt, value, a};
    }
    fs->first_arg = i;
    return KVT_OK;
}

/* ---------------------------------------------------------------- load */

kvt_status_t kvt_cfg_load(const kvt_cfg_opt_t *table, size_t n, void *cfg, size_t cfg_size,
                          int argc, char **argv, const char *default_file, kvt_cfg_result_t *res_p,
                          char *err, size_t errlen)
{
    kvt_status_t st;
    flag_scan_t fs = {0};
    load_t ld = {table, n, NULL, NULL, err, errlen};
    char *file_used = NULL;

    if ((table == NULL && n > 0) || cfg == NULL || res_p == NULL || argc < 0 ||
        (argc > 0 && argv == NULL)) {
        kvt_errf(err, errlen, "config: bad arguments");
        return KVT_ERR_INVAL;
    }
    st = check_table(table, n, cfg_size, err, errlen);
    if (st != KVT_OK)
        return st;

    fs.vals = calloc((size_t)argc + 1, sizeof(*fs.vals));
    ld.cfg = malloc(cfg_size + 1);
    ld.set_by = calloc(n + 1, sizeof(*ld.set_by));
    if (fs.vals == NULL || ld.cfg == NULL || ld.set_by == NULL) {
        kvt_errf(err, errlen, "config: out of memory");
        st = KVT_ERR_NO_MEM;
        goto err_free;
    }

    st = scan_flags(table, n, argc, argv, &fs, err, errlen);
    if (st != KVT_OK)
        goto err_free;
    if (fs.help) {
        *res_p = (kvt_cfg_result_t){.first_arg = argc, .help = true};
        st = KVT_OK;
        goto err_free; /* nothing to commit: the scratch copy is still empty */
    }

    /* Keep the fields outside the table; the table's fields start from zero. */
    memcpy(ld.cfg, cfg, cfg_size);
    for (size_t i = 0; i < n; i++)
        memset(ld.cfg + table[i].offset, 0, table[i].type->size);

    for (size_t i = 0; i < n; i++) {
        if (table[i].def == NULL)
            continue;
        char where[128];
        snprintf(where, sizeof(where), "default of %s", table[i].name);
        st = apply(&ld, &table[i], SRC_DEFAULT, table[i].def, where);
        if (st != KVT_OK)
            goto err_cleanup;
    }

    const char *path = fs.config;
    bool must_exist = true;
    if (path == NULL) {
        const char *env = getenv("KVTIER_CONFIG");
        path = env != NULL && env[0] != '\0' ? env : NULL;
    }
    if (path == NULL) {
        path = default_file;
        must_exist = false;
    }
    if (path != NULL) {
        bool was_read = false;
        st = load_file(&ld, path, must_exist, &was_read);
        if (st != KVT_OK)
            goto err_cleanup;
        if (was_read && (file_used = strdup(path)) == NULL) {
            kvt_errf(err, errlen, "config: out of memory");
            st = KVT_ERR_NO_MEM;
            goto err_cleanup;
        }
    }

    for (size_t i = 0; i < n; i++) {
        char env_name[ENV_NAME_MAX];
        if (kvt_cfg_env_name(table[i].name, env_name, sizeof(env_name)) != KVT_OK)
            continue; /* a name this long has no variable */
        const char *v = getenv(env_name);
        if (v == NULL || v[0] == '\0')
            continue; /* an empty variable counts as unset */
        char where[ENV_NAME_MAX + 8];
        snprintf(where, sizeof(where), "env %s", env_name);
        st = apply(&ld, &table[i], SRC_ENV, v, where);
        if (st != KVT_OK)
            goto err_cleanup;
    }

    for (size_t i = 0; i < fs.nvals; i++) {
        char where[96];
        const char *arg = fs.vals[i].arg;
        size_t alen = strcspn(arg, "=");
        snprintf(where, sizeof(where), "flag %.*s", (int)(alen < 64 ? alen : 64), arg);
        st = apply(&ld, fs.vals[i].opt, SRC_FLAG, fs.vals[i].value, where);
        if (st != KVT_OK)
            goto err_cleanup;
    }

    memcpy(cfg, ld.cfg, cfg_size);
    *res_p = (kvt_cfg_result_t){
        .first_arg = fs.first_arg, .help = false, .dump = fs.dump, .file = file_used};
    free(ld.cfg);
    free(ld.set_by);
    free(fs.vals);
    return KVT_OK;

err_cleanup:
    kvt_cfg_cleanup(table, n, ld.cfg);
    free(file_used);
err_free:
    free(ld.cfg);
    free(ld.set_by);
    free(fs.vals);
    return st;
}

void kvt_cfg_result_cleanup(kvt_cfg_result_t *res)
{
    if (res == NULL)
        return;
    free(res->file);
    res->file = NULL;
}

void kvt_cfg_cleanup(const kvt_cfg_opt_t *table, size_t n, void *cfg)
{
    if (table == NULL || cfg == NULL)
        return;
    for (size_t i = 0; i < n; i++) {
        void *field = (char *)cfg + table[i].offset;
        if (table[i].type->cleanup != NULL)
            table[i].type->cleanup(field);
        memset(field, 0, table[i].type->size);
    }
}

/* ---------------------------------------------------------------- dump and usage */

static bool needs_quotes(const char *s)
{
    if (*s == '\0' || is_blank(*s) || *s == '"')
        return true;
    for (const char *p = s; *p != '\0'; p++) {
        if (*p == '#' || *p == '\\' || *p == '\n' || *p == '\r' || *p == '\t')
            return true;
    }
    return is_blank(s[strlen(s) - 1]);
}

static void put_value(FILE *out, const char *s)
{
    if (!needs_quotes(s)) {
        fputs(s, out);
        return;
    }
    fputc('"', out);
    for (const char *p = s; *p != '\0'; p++) {
        switch (*p) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\r': fputs("\\r", out); break;
        case '\t': fputs("\\t", out); break;
        default: fputc(*p, out);
        }
    }
    fputc('"', out);
}

/* Formats item @i of @opt's field; returns a string to free with free_value(), or NULL
 * when there is no such item (or memory ran out, reported through *nomem_p). */
static char *format_value(const kvt_cfg_opt_t *opt, const void *cfg, size_t i, char *buf,
                          size_t len, bool *nomem_p)
{
    const void *field = (const char *)cfg + opt->offset;
    int need = opt->type->format(field, i, buf, len);
    if (need < 0)
        return NULL;
    if ((size_t)need < len)
        return buf;
    char *big = malloc((size_t)need + 1);
    if (big == NULL) {
        *nomem_p = true;
        return NULL;
    }
    opt->type->format(field, i, big, (size_t)need + 1);
    return big;
}

kvt_status_t kvt_cfg_dump(FILE *out, const kvt_cfg_opt_t *table, size_t n, const void *cfg)
{
    bool nomem = false;
    for (size_t o = 0; o < n; o++) {
        const kvt_cfg_opt_t *opt = &table[o];
        if (opt->flags & KVT_CFG_NODUMP)
            continue;
        for (size_t i = 0;; i++) {
            char buf[256];
            char *v = format_value(opt, cfg, i, buf, sizeof(buf), &nomem);
            if (v == NULL)
                break;
            fprintf(out, "%s = ", opt->name);
            put_value(out, v);
            fputc('\n', out);
            if (v != buf)
                free(v);
            if (!opt->type->list)
                break;
        }
    }
    if (fflush(out) != 0 || ferror(out))
        return KVT_ERR_IO;
    return nomem ? KVT_ERR_NO_MEM : KVT_OK;
}

static void usage_line(FILE *out, const char *left, const char *help)
{
    const int col = 30;
    int w = fprintf(out, "  %s", left);
    if (w >= col - 1)
        fprintf(out, "\n%*s", col, "");
    else
        fprintf(out, "%*s", col - w, "");
    fprintf(out, "%s\n", help);
}

void kvt_cfg_usage(FILE *out, const char *prog, const kvt_cfg_opt_t *table, size_t n)
{
    const kvt_cfg_opt_t *example = NULL;

    fprintf(out, "usage: %s [options]\n\noptions:\n", prog);
    for (size_t i = 0; i < n; i++) {
        const kvt_cfg_opt_t *o = &table[i];
        if (o->flags & KVT_CFG_HIDDEN)
            continue;
        if (example == NULL)
            example = o;
        char left[128];
        char help[512];
        if (o->type == &kvt_cfg_bool)
            snprintf(left, sizeof(left), "--[no-]%s", o->name);
        else
            snprintf(left, sizeof(left), "--%s %s", o->name, o->type->metavar);
        int h = snprintf(help, sizeof(help), "%s", o->help != NULL ? o->help : "");
        if (o->type->list && h >= 0 && (size_t)h < sizeof(help))
            h += snprintf(help + h, sizeof(help) - (size_t)h, " (repeatable)");
        if (o->def != NULL && o->def[0] != '\0' && h >= 0 && (size_t)h < sizeof(help))
            snprintf(help + h, sizeof(help) - (size_t)h, " [default: %s]", o->def);
        usage_line(out, left, help);
    }
    usage_line(out, "--config FILE", "read options from FILE (also $KVTIER_CONFIG)");
    usage_line(out, "--dump-config", "print the effective configuration and exit");
    usage_line(out, "-h, --help", "print this help and exit");

    if (example != NULL) {
        char env[ENV_NAME_MAX];
        if (kvt_cfg_env_name(example->name, env, sizeof(env)) != KVT_OK)
            snprintf(env, sizeof(env), "KVTIER_...");
        fprintf(out,
                "\nEvery option is also a config-file key (\"%s = VALUE\") and an environment\n"
                "variable (%s=VALUE). Flags override the environment, which overrides\n"
                "the file, which overrides the defaults.\n",
                example->name, env);
    }
}
