/*
 * router-plugin/cli/kvtier_int.h: what the files of the kvtier CLI share. kvtier.c: the
 * subcommand table, main(), and the helpers below (errors, numbers, files, the
 * connection options); kvtier_query.c: `hash` and `query`; kvtier_admin.c: `events`,
 * `subscribe`, `unsubscribe`, `drop-model`, `stats` and `ping`. Private to the CLI.
 */
#ifndef KVT_ROUTER_CLI_KVTIER_INT_H
#define KVT_ROUTER_CLI_KVTIER_INT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvtier/client.h"

#define KVT_CLI_EXIT_OK 0
#define KVT_CLI_EXIT_FAIL 1  /* runtime failure: server or connection error, out of memory */
#define KVT_CLI_EXIT_USAGE 2 /* malformed command line or input */

/* ---- helpers (kvtier.c) --------------------------------------------------------------------- */

/* Prints one stderr line "kvtier: <message>" (control bytes as '?'); returns the usage code. */
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
int kvt_cli_fail(const char *fmt, ...);

/* Strict unsigned decimal: digits only, no sign, no spaces, no overflow. Returns 0 or -1. */
int kvt_cli_parse_u64(const char *s, uint64_t *out_p);

/*
 * Reads all of @path ("-" is stdin) into a malloc'd buffer. Returns 0, or -1
 * after writing a message (no newline, naming the file as @what) into @err.
 */
int kvt_cli_read_file(const char *path, const char *what, char **buf_p, size_t *len_p, char *err,
                      size_t errlen);

/*
 * Parses "--name V" / "--name=V" options listed in @names (NULL-terminated)
 * into @val (same index; each at most once) and collects up to @maxpos
 * positional arguments. Returns 0, 1 for --help (@usage printed), or the
 * usage exit code after printing the error.
 */
int kvt_cli_opts(const char *cmd, int argc, char **argv, const char *const *names, const char **val,
                 const char **pos, int maxpos, int *npos_p, void (*usage)(FILE *out));

/*
 * Makes a client for --addr (else KVTIER_ADDR, else the default) with
 * --timeout and --auth-token (else KVTIER_TOKEN). It connects on its first
 * call, so only local checks happen here. Returns the exit code: 0 with
 * *@c_p set, 2 for a bad address or value, 1 when out of memory.
 */
int kvt_cli_connect(const char *cmd, const char *addr, const char *timeout, const char *token,
                    kvt_client_t **c_p);

/* The failure of a call on @c: one stderr line, exit 1. */
int kvt_cli_call_failed(const char *cmd, kvt_client_t *c, kvt_status_t st);

/* Flushes stdout; a write error is a runtime failure. Returns the exit code. */
int kvt_cli_finish(const char *cmd);

/* ---- subcommands: each takes argv from its own name and returns the exit code ---------------- */

/* kvtier_query.c */
int kvt_cli_hash_main(int argc, char **argv);
void kvt_cli_hash_usage(FILE *out);
int kvt_cli_query_main(int argc, char **argv);
void kvt_cli_query_usage(FILE *out);

/* kvtier_admin.c */
int kvt_cli_events_main(int argc, char **argv);
void kvt_cli_events_usage(FILE *out);
int kvt_cli_subscribe_main(int argc, char **argv);
void kvt_cli_subscribe_usage(FILE *out);
int kvt_cli_unsubscribe_main(int argc, char **argv);
void kvt_cli_unsubscribe_usage(FILE *out);
int kvt_cli_drop_model_main(int argc, char **argv);
void kvt_cli_drop_model_usage(FILE *out);
int kvt_cli_stats_main(int argc, char **argv);
void kvt_cli_stats_usage(FILE *out);
int kvt_cli_ping_main(int argc, char **argv);
void kvt_cli_ping_usage(FILE *out);

#endif
