/*
 * router-plugin/cli/kvtier_admin.c: the subcommands that send one request to a running
 * kvtierd and print its JSON answer: `events` (an events file), `subscribe` and
 * `unsubscribe` (engine streams), `drop-model`, `stats`, and `ping` (with its round trip).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/status.h"
#include "kvtier/client.h"
#include "router-plugin/cli/kvtier_int.h"

/* ---- kvtier events / stats / ping ----------------------------------------------------------- */

void kvt_cli_events_usage(FILE *out)
{
    fprintf(
        out,
        "usage: kvtier events [--addr A] [--timeout MS] [--auth-token T] FILE\n"
        "\n"
        "Sends a JSON events file ('-' reads stdin) to a running kvtierd, as\n"
        "POST /v1/events does: {\"pod\",\"model\",\"events\":[{\"type\":\"BlockStored\",..},..]}\n"
        "(docs/api.md), and prints the server's JSON answer on one line.\n"
        "\n"
        "  --addr A        RPC address (default $KVTIER_ADDR, else %s)\n"
        "  --timeout MS    connect and call timeout in milliseconds (default 1000)\n"
        "  --auth-token T  token for HELLO (default $KVTIER_TOKEN)\n"
        "\n"
        "Exit codes: 0 ok, 1 server or connection error (also a refused file),\n"
        "2 bad usage or unreadable file.\n",
        KVT_CLIENT_DEFAULT_ADDR);
}

void kvt_cli_stats_usage(FILE *out)
{
    fprintf(out, "usage: kvtier stats [--addr A] [--timeout MS] [--auth-token T]\n"
                 "\n"
                 "Prints the JSON of GET /v1/stats from a running kvtierd on one line.\n"
                 "Options as for 'kvtier events'. Exit codes: 0 ok, 1 server or connection\n"
                 "error, 2 bad usage.\n");
}

void kvt_cli_ping_usage(FILE *out)
{
    fprintf(out, "usage: kvtier ping [--addr A] [--timeout MS] [--auth-token T]\n"
                 "\n"
                 "Connects to a running kvtierd, says HELLO and PING, and prints\n"
                 "{\"ok\":true,\"rtt_us\":N}. Exit 0 when it answered, 1 when it did not,\n"
                 "2 on bad usage: scripts can wait for a daemon with it.\n");
}

enum { KVT_COPT_ADDR, KVT_COPT_TIMEOUT, KVT_COPT_TOKEN, KVT_COPT_COUNT };

static const char *const kvt_cli_conn_opts[KVT_COPT_COUNT + 1] = {
    [KVT_COPT_ADDR] = "--addr",
    [KVT_COPT_TIMEOUT] = "--timeout",
    [KVT_COPT_TOKEN] = "--auth-token",
    [KVT_COPT_COUNT] = NULL,
};

/* Prints a JSON answer, adding the newline it lacks. */
static int kvt_cli_print_answer(const char *cmd, const char *json)
{
    size_t len = strlen(json);
    fputs(json, stdout);
    if (len == 0 || json[len - 1] != '\n')
        fputc('\n', stdout);
    return kvt_cli_finish(cmd);
}

typedef kvt_status_t (*kvt_cli_json_call_t)(kvt_client_t *c, const char *json, size_t len,
                                            char **answer_p);

/* `kvtier CMD FILE`: sends a JSON file ('-': stdin) with @call and prints the answer. */
static int kvt_cli_json_file_main(const char *cmd, const char *what, int argc, char **argv,
                                  void (*usage)(FILE *), kvt_cli_json_call_t call)
{
    const char *val[KVT_COPT_COUNT] = {NULL};
    const char *pos[1] = {NULL};
    int npos = 0;
    char err[256];
    char *text = NULL, *answer = NULL;
    size_t len = 0;
    kvt_client_t *c = NULL;

    int rc = kvt_cli_opts(cmd, argc, argv, kvt_cli_conn_opts, val, pos, 1, &npos, usage);
    if (rc != 0)
        return rc == 1 ? KVT_CLI_EXIT_OK : rc;
    if (npos != 1)
        return kvt_cli_fail("%s: give the JSON %s ('-' for stdin)", cmd, what);
    if (kvt_cli_read_file(pos[0], what, &text, &len, err, sizeof(err)) != 0)
        return kvt_cli_fail("%s: %s", cmd, err);
    if (len == 0) {
        free(text);
        return kvt_cli_fail("%s: %s '%s' is empty", cmd, what, pos[0]);
    }
    rc = kvt_cli_connect(cmd, val[KVT_COPT_ADDR], val[KVT_COPT_TIMEOUT], val[KVT_COPT_TOKEN], &c);
    if (rc == KVT_CLI_EXIT_OK) {
        kvt_status_t st = call(c, text, len, &answer);
        if (st == KVT_ERR_TOO_BIG)
            rc = (kvt_cli_fail("%s: %s", cmd, kvt_client_last_error(c)), KVT_CLI_EXIT_USAGE);
        else if (st != KVT_OK)
            rc = kvt_cli_call_failed(cmd, c, st);
        else
            rc = kvt_cli_print_answer(cmd, answer);
    }
    free(answer);
    free(text);
    kvt_client_destroy(c);
    return rc;
}

int kvt_cli_events_main(int argc, char **argv)
{
    return kvt_cli_json_file_main("events", "events file", argc, argv, kvt_cli_events_usage,
                                  kvt_client_report_events);
}

/* The connection options of the commands that talk to kvtierd (a %s for the default address). */
#define KVT_CLI_CONN_HELP                                                                          \
    "  --addr A        RPC address (default $KVTIER_ADDR, else %s)\n"                              \
    "  --timeout MS    connect and call timeout in milliseconds (default 1000)\n"                  \
    "  --auth-token T  token for HELLO (default $KVTIER_TOKEN)\n"

void kvt_cli_subscribe_usage(FILE *out)
{
    fprintf(out,
            "usage: kvtier subscribe [--addr A] [--timeout MS] [--auth-token T] FILE\n"
            "\n"
            "Subscribes a running kvtierd to an engine's KV-event stream, as\n"
            "POST /v1/engines does: FILE ('-' reads stdin) holds\n"
            "{\"pod\",\"model\",\"endpoint\",\"replay_endpoint\"?,\"topic\"?,\"format\"?,\n"
            "\"dp_size\"?,\"bind\"?} (docs/api.md); prints the server's JSON answer.\n"
            "\n" KVT_CLI_CONN_HELP "\n"
            "Exit codes: 0 ok, 1 server or connection error (also a refused engine),\n"
            "2 bad usage or unreadable file.\n",
            KVT_CLIENT_DEFAULT_ADDR);
}

int kvt_cli_subscribe_main(int argc, char **argv)
{
    return kvt_cli_json_file_main("subscribe", "engine file", argc, argv, kvt_cli_subscribe_usage,
                                  kvt_client_add_engine);
}

void kvt_cli_unsubscribe_usage(FILE *out)
{
    fprintf(out,
            "usage: kvtier unsubscribe [--addr A] [--timeout MS] [--auth-token T] POD\n"
            "\n"
            "Unsubscribes a running kvtierd from engine POD and drops everything it held,\n"
            "as DELETE /v1/engines/POD does; prints the server's JSON answer.\n"
            "\n" KVT_CLI_CONN_HELP "\n"
            "Exit codes: 0 ok, 1 server or connection error (also an unknown pod),\n"
            "2 bad usage.\n",
            KVT_CLIENT_DEFAULT_ADDR);
}

/* A command that names one thing (a pod, a model) to drop, and prints the JSON answer. */
static int kvt_cli_drop_main(const char *cmd, const char *what, int argc, char **argv,
                             void (*usage)(FILE *),
                             kvt_status_t (*drop)(kvt_client_t *, const char *, char **))
{
    const char *val[KVT_COPT_COUNT] = {NULL};
    const char *pos[1] = {NULL};
    int npos = 0;
    char *answer = NULL;
    kvt_client_t *c = NULL;

    int rc = kvt_cli_opts(cmd, argc, argv, kvt_cli_conn_opts, val, pos, 1, &npos, usage);
    if (rc != 0)
        return rc == 1 ? KVT_CLI_EXIT_OK : rc;
    if (npos != 1)
        return kvt_cli_fail("%s: give the %s", cmd, what);
    rc = kvt_cli_connect(cmd, val[KVT_COPT_ADDR], val[KVT_COPT_TIMEOUT], val[KVT_COPT_TOKEN], &c);
    if (rc == KVT_CLI_EXIT_OK) {
        kvt_status_t st = drop(c, pos[0], &answer);
        rc = st != KVT_OK ? kvt_cli_call_failed(cmd, c, st) : kvt_cli_print_answer(cmd, answer);
    }
    free(answer);
    kvt_client_destroy(c);
    return rc;
}

int kvt_cli_unsubscribe_main(int argc, char **argv)
{
    return kvt_cli_drop_main("unsubscribe", "pod", argc, argv, kvt_cli_unsubscribe_usage,
                             kvt_client_drop_engine);
}

void kvt_cli_drop_model_usage(FILE *out)
{
    fprintf(out,
            "usage: kvtier drop-model [--addr A] [--timeout MS] [--auth-token T] MODEL\n"
            "\n"
            "Drops every namespace of MODEL (its base model and its LoRAs) and all their\n"
            "blocks from a running kvtierd's index, as DELETE /v1/models/MODEL does; prints\n"
            "the server's JSON answer. Engines still publishing for MODEL fill it again.\n"
            "\n" KVT_CLI_CONN_HELP "\n"
            "Exit codes: 0 ok, 1 server or connection error (also an unknown model),\n"
            "2 bad usage.\n",
            KVT_CLIENT_DEFAULT_ADDR);
}

int kvt_cli_drop_model_main(int argc, char **argv)
{
    return kvt_cli_drop_main("drop-model", "model", argc, argv, kvt_cli_drop_model_usage,
                             kvt_client_drop_model);
}

int kvt_cli_stats_main(int argc, char **argv)
{
    const char *val[KVT_COPT_COUNT] = {NULL};
    const char *pos[1];
    int npos = 0;
    char *json = NULL;
    kvt_client_t *c = NULL;

    int rc = kvt_cli_opts("stats", argc, argv, kvt_cli_conn_opts, val, pos, 0, &npos,
                          kvt_cli_stats_usage);
    if (rc != 0)
        return rc == 1 ? KVT_CLI_EXIT_OK : rc;
    rc = kvt_cli_connect("stats", val[KVT_COPT_ADDR], val[KVT_COPT_TIMEOUT], val[KVT_COPT_TOKEN],
                         &c);
    if (rc == KVT_CLI_EXIT_OK) {
        kvt_status_t st = kvt_client_stats(c, &json);
        rc = st != KVT_OK ? kvt_cli_call_failed("stats", c, st)
                          : kvt_cli_print_answer("stats", json);
    }
    free(json);
    kvt_client_destroy(c);
    return rc;
}

int kvt_cli_ping_main(int argc, char **argv)
{
    const char *val[KVT_COPT_COUNT] = {NULL};
    const char *pos[1];
    int npos = 0;
    kvt_client_t *c = NULL;

    int rc =
        kvt_cli_opts("ping", argc, argv, kvt_cli_conn_opts, val, pos, 0, &npos, kvt_cli_ping_usage);
    if (rc != 0)
        return rc == 1 ? KVT_CLI_EXIT_OK : rc;
    rc =
        kvt_cli_connect("ping", val[KVT_COPT_ADDR], val[KVT_COPT_TIMEOUT], val[KVT_COPT_TOKEN], &c);
    if (rc == KVT_CLI_EXIT_OK) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        kvt_status_t st = kvt_client_ping(c);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (st != KVT_OK) {
            rc = kvt_cli_call_failed("ping", c, st);
        } else {
            long long us =
                (long long)(t1.tv_sec - t0.tv_sec) * 1000000 + (t1.tv_nsec - t0.tv_nsec) / 1000;
            printf("{\"ok\":true,\"rtt_us\":%lld}\n", us);
            rc = kvt_cli_finish("ping");
        }
    }
    kvt_client_destroy(c);
    return rc;
}
