/*
 * The config table: one array of options describes every setting of a program. Each
 * option "block-size" can be given as
 *
 *     default      the table's default text
 *     file         a line "block-size = 16" (or "block_size = 16") in the config file
 *     environment  KVTIER_BLOCK_SIZE=16
 *     flag         --block-size 16  or  --block-size=16
 *
 * and later sources win (defaults < file < env < flags). The file is named by
 * --config FILE, else by $KVTIER_CONFIG, else by the caller's default path (skipped when
 * that file does not exist). Values are parsed by the option's type into a field of
 * the caller's struct at the option's offset. docs/configuration.md has the user's view.
 *
 *     typedef struct { uint32_t block_size; char *listen; } my_cfg_t;
 *     static const kvt_cfg_opt_t opts[] = {
 *         {"block-size", "16", "tokens per block", &kvt_cfg_u32,
 *          offsetof(my_cfg_t, block_size), 0},
 *         {"listen", "127.0.0.1:7421", "http address", &kvt_cfg_string,
 *          offsetof(my_cfg_t, listen), 0},
 *     };
 *     my_cfg_t cfg; kvt_cfg_result_t res; char err[256];
 *     if (kvt_cfg_load(opts, 2, &cfg, sizeof(cfg), argc, argv, NULL, &res, err, sizeof(err)))
 *         { fprintf(stderr, "%s\n", err); return 2; }
 *     ...
 *     kvt_cfg_cleanup(opts, 2, &cfg);
 *     kvt_cfg_result_cleanup(&res);
 */
#ifndef KVT_COMMON_CONFIG_H
#define KVT_COMMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/log.h" /* kvt_log_level_t, for kvt_cfg_log_level */
#include "common/status.h"

/*
 * A value type: how text becomes a field and back. The types below cover kvtier's
 * needs; a program may define its own (scalar) types the same way.
 */
typedef struct kvt_cfg_type {
    const char *metavar; /* placeholder in --help: "N", "SIZE", "STRING" */
    size_t size;         /* bytes of the field; a missing default leaves them zero */
    bool list;           /* repeatable: each value appends (field is kvt_cfg_list_t) */
    /*
     * Parses @text into @field (replacing a scalar, appending to a list). On error
     * returns KVT_ERR_INVAL (KVT_ERR_NO_MEM when memory runs out), leaves @field
     * unchanged and writes a short reason ("expected a size such as 4096, 64KiB or
     * 2GiB") to @err (@errlen bytes, common/errtext.h); kvt_cfg_load() prefixes it with
     * the source and the value.
     */
    kvt_status_t (*parse)(void *field, const char *text, char *err, size_t errlen);
    /*
     * Writes item @i of @field as text that parse() reads back into an equal value
     * (for scalars @i is 0). Returns the length it needed, like snprintf, or -1 when
     * the field holds no value (a NULL string, or @i past a list's end).
     */
    int (*format)(const void *field, size_t i, char *buf, size_t len);
    /* Frees what the field owns and zeroes it; NULL when it owns nothing. */
    void (*cleanup)(void *field);
} kvt_cfg_type_t;

/* A repeatable string option's value: @n strdup'd strings, freed by kvt_cfg_cleanup(). */
typedef struct kvt_cfg_list {
    char **items;
    size_t n;
} kvt_cfg_list_t;

/* Field types (C type in brackets). */
extern const kvt_cfg_type_t kvt_cfg_string;      /* char *: strdup'd; NULL when no default */
extern const kvt_cfg_type_t kvt_cfg_bool;        /* bool: true/false/1/0/yes/no/on/off */
extern const kvt_cfg_type_t kvt_cfg_u32;         /* uint32_t: decimal or 0x hex */
extern const kvt_cfg_type_t kvt_cfg_u64;         /* uint64_t: decimal or 0x hex */
extern const kvt_cfg_type_t kvt_cfg_i64;         /* int64_t: optional sign, decimal */
extern const kvt_cfg_type_t kvt_cfg_double;      /* double: finite, strtod syntax */
extern const kvt_cfg_type_t kvt_cfg_size;        /* uint64_t bytes: 4096, 64k, 64KiB, 2G, 1TiB */
extern const kvt_cfg_type_t kvt_cfg_duration;    /* uint64_t milliseconds: 250, 250ms, 30s, 5m */
extern const kvt_cfg_type_t kvt_cfg_string_list; /* kvt_cfg_list_t: repeatable string */
extern const kvt_cfg_type_t kvt_cfg_log_level;   /* kvt_log_level_t: error/warn/info/debug */

/* Option flags. */
#define KVT_CFG_HIDDEN 0x1u /* left out of kvt_cfg_usage() */
#define KVT_CFG_NODUMP 0x2u /* left out of kvt_cfg_dump() (secrets) */

/* One row of the table. */
typedef struct kvt_cfg_opt {
    const char *name;           /* lowercase with dashes: "block-size"; unique */
    const char *def;            /* default as text; NULL: zero, NULL string or empty list */
    const char *help;           /* one line for --help */
    const kvt_cfg_type_t *type; /* borrowed; must outlive every call */
    size_t offset;              /* offsetof() the field in the caller's struct */
    unsigned flags;             /* KVT_CFG_* */
} kvt_cfg_opt_t;

/* What kvt_cfg_load() found besides option values. */
typedef struct kvt_cfg_result {
    int first_arg; /* argv index of the first positional argument; argc when none */
    bool help;     /* -h or --help was given: nothing else was loaded */
    bool dump;     /* --dump-config was given (the caller prints and exits) */
    char *file;    /* the config file that was read (strdup'd), NULL when none */
} kvt_cfg_result_t;

/*
 * Fills the table's fields of @cfg (@cfg_size bytes) from defaults, then the config
 * file, then KVTIER_* variables, then the flags in argv[1..argc). Parsing stops at the
 * first argument that is not an option ("-" counts as positional) or after "--"; its
 * index is res_p->first_arg, so a subcommand CLI can load its global options, then call
 * again with argc - first_arg, argv + first_arg for the subcommand's table.
 * Built-in flags: --config FILE, --dump-config, -h/--help. A bool option also takes
 * "--name" (true) and "--no-name" (false); "--name V" is only for other types.
 * @default_file (may be NULL) is read when neither --config nor $KVTIER_CONFIG is set,
 * if it exists. Fields outside the table are kept; the table's fields are overwritten
 * without being freed (clean up an earlier load first).
 *
 * Returns KVT_OK and fills *res_p (free res_p->file with free(), or kvt_cfg_result_cleanup);
 * with res_p->help set, @cfg is untouched. Returns KVT_ERR_INVAL for an unknown flag or
 * key, a missing or bad value, an unreadable file or a bad table, KVT_ERR_NO_MEM when
 * memory runs out; then @cfg and *res_p are untouched and @err (@errlen bytes, may be
 * 0; common/errtext.h) holds one line naming the source: "flag --block-size: ...",
 * "file F line 3: ...", "env KVTIER_BLOCK_SIZE: ...".
 */
kvt_status_t kvt_cfg_load(const kvt_cfg_opt_t *table, size_t n, void *cfg, size_t cfg_size,
                          int argc, char **argv, const char *default_file, kvt_cfg_result_t *res_p,
                          char *err, size_t errlen);

/* Frees res->file. */
void kvt_cfg_result_cleanup(kvt_cfg_result_t *res);

/* Frees what the table's fields of @cfg own (strings, lists) and zeroes those fields. */
void kvt_cfg_cleanup(const kvt_cfg_opt_t *table, size_t n, void *cfg);

/*
 * Prints the table's fields of @cfg as "name = value" lines, in table order, in the
 * file syntax (quoted where needed, one line per list item), so that loading the
 * output as a config file gives equal values. Options flagged KVT_CFG_NODUMP and
 * strings that are NULL are left out. Returns KVT_OK, or KVT_ERR_IO if writing failed.
 */
kvt_status_t kvt_cfg_dump(FILE *out, const kvt_cfg_opt_t *table, size_t n, const void *cfg);

/* Prints --help text: a usage line for @prog, each option with its value placeholder,
 * help and default, the built-in flags, and how files and KVTIER_* variables map. */
void kvt_cfg_usage(FILE *out, const char *prog, const kvt_cfg_opt_t *table, size_t n);

/* Writes the environment variable name of option @name ("block-size" ->
 * "KVTIER_BLOCK_SIZE") into @buf. Returns KVT_OK, or KVT_ERR_TOO_BIG if it does not fit. */
kvt_status_t kvt_cfg_env_name(const char *name, char *buf, size_t len);

#endif
