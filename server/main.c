/*
 * kvtierd: the kvtier sidecar daemon. Options come from the config table
 * below (defaults < --config file < KVTIER_* environment < flags); see
 * docs/configuration.md. SIGTERM or SIGINT stops it cleanly.
 */
#define KVT_LOG_COMPONENT "kvtierd"

#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "common/config.h"
#include "common/errtext.h"
#include "common/log.h"
#include "common/version.h"
#include "server/srv.h"

typedef struct daemon_cfg {
    kvt_srv_config_t srv;
    char *log_format;
} daemon_cfg_t;

/* --lora-keys: namespace or dynamo (kvt_srv_lora_keys_t). */
static const char *const lora_keys_names[] = {"namespace", "dynamo"};

static kvt_status_t parse_lora_keys(void *field, const char *text, char *err, size_t errlen)
{
    for (size_t i = 0; i < sizeof(lora_keys_names) / sizeof(lora_keys_names[0]); i++)
        if (strcmp(text, lora_keys_names[i]) == 0) {
            *(kvt_srv_lora_keys_t *)field = (kvt_srv_lora_keys_t)i;
            return KVT_OK;
        }
    kvt_errf(err, errlen, "expected namespace or dynamo");
    return KVT_ERR_INVAL;
}

static int format_lora_keys(const void *field, size_t i, char *buf, size_t len)
{
    kvt_srv_lora_keys_t v = *(const kvt_srv_lora_keys_t *)field;
    if (i != 0 || (size_t)v >= sizeof(lora_keys_names) / sizeof(lora_keys_names[0]))
        return -1;
    return snprintf(buf, len, "%s", lora_keys_names[v]);
}

static const kvt_cfg_type_t lora_keys_type = {
    "MODE", sizeof(kvt_srv_lora_keys_t), false, parse_lora_keys, format_lora_keys, NULL,
};

#define O(f) offsetof(daemon_cfg_t, srv.f)
static const kvt_cfg_opt_t opts[] = {
    {"http-listen", "127.0.0.1:7421", "HTTP/JSON API address (host:port; empty: off)",
     &kvt_cfg_string, O(http_listen), 0},
    {"rpc-listen", "127.0.0.1:7420", "binary RPC address (host:port; empty: off)", &kvt_cfg_string,
     O(rpc_listen), 0},
    {"rpc-unix", "", "binary RPC on this Unix socket path too (empty: off)", &kvt_cfg_string,
     O(rpc_unix), 0},
    {"allow-remote", "false", "allow listening on addresses other than loopback", &kvt_cfg_bool,
     O(allow_remote), 0},
    {"data-dir", "./var/kvtier", "directory for kvtierd's files (created if missing)",
     &kvt_cfg_string, O(data_dir), 0},
    {"auth-token-file", "", "file holding a shared token every mutating call must present",
     &kvt_cfg_string, O(auth_token_file), 0},
    {"workers", "0", "query threads (0: one per core)", &kvt_cfg_u32, O(workers), 0},
    {"max-connections", "1024", "open client connections at most", &kvt_cfg_u32, O(max_connections),
     0},
    {"max-body", "8MiB", "largest HTTP request body", &kvt_cfg_size, O(max_body), 0},
    {"max-header", "16KiB", "largest HTTP request head", &kvt_cfg_size, O(max_header), 0},
    {"rpc-max-frame", "4MiB", "largest RPC frame body (1KiB..64MiB)", &kvt_cfg_size,
     O(rpc_max_frame), 0},
    {"rpc-max-inflight", "64", "RPC writes per connection waiting for the writer", &kvt_cfg_u32,
     O(rpc_max_inflight), 0},
    {"conn-buffer", "4MiB", "unsent answer bytes per connection before its reads pause",
     &kvt_cfg_size, O(conn_buffer), 0},
    {"request-timeout", "10s", "a started request must arrive whole within this", &kvt_cfg_duration,
     O(request_timeout_ms), 0},
    {"idle-timeout", "120s", "close connections idle this long (0: never)", &kvt_cfg_duration,
     O(idle_timeout_ms), 0},
    {"index-budget", "0", "index memory budget in bytes (0: unbounded)", &kvt_cfg_size,
     O(index_budget), 0},
    {"block-size", "16", "tokens per block for models whose events do not say", &kvt_cfg_u32,
     O(block_size), 0},
    {"lora-keys", "namespace",
     "LoRA block keys: namespace (the standard's) or dynamo (Dynamo's: the LoRA seeds every block)",
     &lora_keys_type, O(lora_keys), 0},
    {"max-query-tokens", "131072", "tokens or keys in one query", &kvt_cfg_u32, O(max_query_tokens),
     0},
    {"max-event-items", "4194304", "block hashes plus token ids in one event batch", &kvt_cfg_u32,
     O(max_event_items), 0},
    {"writer-queue", "4096", "write requests waiting for the index writer before 503", &kvt_cfg_u32,
     O(writer_queue), 0},
    {"stats-period", "100ms", "how often /v1/stats and /metrics counters are refreshed",
     &kvt_cfg_duration, O(stats_period_ms), 0},
    {"writer-stall", "5s", "GET /readyz fails when the index writer is stuck this long",
     &kvt_cfg_duration, O(writer_stall_ms), 0},
    {"ipc-dir", "", "directory of the ipc:// sockets kvtierd binds (0700; empty: <data-dir>/ipc)",
     &kvt_cfg_string, O(ipc_dir), 0},
    {"engine", NULL, "subscribe to an engine's KV events at start: a POST /v1/engines JSON object",
     &kvt_cfg_string_list, O(engines), 0},
    {"forget-idle", "10m",
     "forget pods with no entries (not subscribed) and namespaces with no blocks, idle this long "
     "(0: never)",
     &kvt_cfg_duration, O(forget_idle_ms), 0},
    {"removed-map", "8MiB",
     "memory for engine-hash mappings of recently removed blocks (resolves vLLM's CPU stores)",
     &kvt_cfg_size, O(removed_map_bytes), 0},
    {"replay-timeout", "2s", "a replay of missed event batches must end within this",
     &kvt_cfg_duration, O(replay_timeout_ms), 0},
    {"replay-hold", "10000", "live event batches held per stream while a replay runs; more fail it",
     &kvt_cfg_u32, O(replay_hold), 0},
    {"event-max-message", "64MiB", "largest engine event message (ZMQ); larger ones are dropped",
     &kvt_cfg_size, O(event_max_message), 0},
    {"publish", "", "publish kvtierd's own KV events (vLLM format) on this ZMQ endpoint",
     &kvt_cfg_string, O(publish), 0},
    {"publish-replay", "", "ZMQ ROUTER endpoint answering replays of published batches",
     &kvt_cfg_string, O(publish_replay), 0},
    {"publish-buffer", "10000", "published batches kept for replay", &kvt_cfg_u32,
     O(publish_buffer), 0},
    {"pod", "", "this sidecar's engine pod, whose entries its tiers update (empty: the host name)",
     &kvt_cfg_string, O(pod), 0},
    {"ram-bytes", "0", "host-RAM arena for KV blocks (0: no tiers; docs/tiers.md)", &kvt_cfg_size,
     O(ram_bytes), 0},
    {"block-bytes", "2MiB", "largest KV block the tiers hold (a slot is this rounded up to 4KiB)",
     &kvt_cfg_size, O(block_bytes), 0},
    {"arena-name", "",
     "the arena's file: empty for a memfd, NAME for /dev/shm/NAME, or an absolute path "
     "(hugetlbfs)",
     &kvt_cfg_string, O(arena_name), 0},
    {"disk-path", "", "NVMe store: a file (created, preallocated) or a block device (empty: none)",
     &kvt_cfg_string, O(disk_path), 0},
    {"disk-bytes", "0", "size of the NVMe store file when kvtierd creates it", &kvt_cfg_size,
     O(disk_bytes), 0},
    {"disk-format", "false",
     "a --disk-path block device that does not carry kvtier's header may be formatted (its "
     "contents are lost)",
     &kvt_cfg_bool, O(disk_format), 0},
    {"io-depth", "32", "NVMe reads and writes in flight", &kvt_cfg_u32, O(io_depth), 0},
    {"sqpoll", "false", "io_uring with a kernel submission thread (SQPOLL)", &kvt_cfg_bool,
     O(sqpoll), 0},
    {"disk-admit", "seen-twice", "which blocks go to NVMe: always, seen-twice or tinylfu",
     &kvt_cfg_string, O(disk_admit), 0},
    {"lease", "30s", "pins and reservations an engine does not release expire after this",
     &kvt_cfg_duration, O(lease_ms), 0},
    {"release-grace", "1s",
     "pins and reservations a connection left behind (closed, or expired) hold their slots "
     "this much longer, for copies still in flight",
     &kvt_cfg_duration, O(release_grace_ms), 0},
    {"ucx", "true",
     "take part in block transfers between sidecars over UCX (on|off; needs --ram-bytes)",
     &kvt_cfg_bool, O(ucx), 0},
    {"shm", "true",
     "a transfer with a peer on this host maps the peer's arena (through its --rpc-unix socket) "
     "and copies, instead of UCX (on|off)",
     &kvt_cfg_bool, O(shm), 0},
    {"log-level", "info", "error, warn, info or debug", &kvt_cfg_log_level, O(log_level), 0},
    {"log-format", "text", "text or logfmt", &kvt_cfg_string, offsetof(daemon_cfg_t, log_format),
     0},
};
#undef O
#define NOPTS (sizeof(opts) / sizeof(opts[0]))

static kvt_srv_t *g_srv;

static void on_signal(int sig)
{
    (void)sig;
    if (g_srv != NULL)
        kvt_srv_stop(g_srv);
}

int main(int argc, char **argv)
{
    daemon_cfg_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    kvt_cfg_result_t res;
    char err[512];
    if (kvt_version_asked(argc, argv)) {
        kvt_version_print(stdout, "kvtierd");
        return 0;
    }
    if (kvt_cfg_load(opts, NOPTS, &cfg, sizeof(cfg), argc, argv, NULL, &res, err, sizeof(err)) !=
        KVT_OK) {
        fprintf(stderr, "kvtierd: %s\n", err);
        return 2;
    }
    int rc = 0;
    if (res.help) {
        kvt_cfg_usage(stdout, "kvtierd", opts, NOPTS);
        goto out;
    }
    if (res.first_arg < argc) {
        fprintf(stderr, "kvtierd: unexpected argument '%s'\n", argv[res.first_arg]);
        rc = 2;
        goto out;
    }
    if (strcmp(cfg.log_format, "text") != 0 && strcmp(cfg.log_format, "logfmt") != 0) {
        fprintf(stderr, "kvtierd: --log-format must be text or logfmt, got '%s'\n", cfg.log_format);
        rc = 2;
        goto out;
    }
    if (res.dump) {
        rc = kvt_cfg_dump(stdout, opts, NOPTS, &cfg) == KVT_OK ? 0 : 1;
        goto out;
    }
    kvt_log_set_level(cfg.srv.log_level);
    kvt_log_set_format(strcmp(cfg.log_format, "logfmt") == 0 ? KVT_LOG_LOGFMT : KVT_LOG_TEXT);
    if (res.file)
        kvt_log_info("config file %s", res.file);

    kvt_srv_t *srv;
    kvt_status_t st = kvt_srv_create(&cfg.srv, &srv);
    if (st != KVT_OK) {
        fprintf(stderr, "kvtierd: cannot start: %s (see the log above)\n", kvt_status_str(st));
        rc = 1;
        goto out;
    }
    g_srv = srv;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* tests and scripts read the ports from this line */
    printf("kvtierd listening http=%u rpc=%u\n", kvt_srv_http_port(srv), kvt_srv_rpc_port(srv));
    fflush(stdout);
    st = kvt_srv_run(srv);
    g_srv = NULL;
    kvt_srv_destroy(srv);
    kvt_log_info("stopped");
    rc = st == KVT_OK ? 0 : 1;
out:
    kvt_cfg_cleanup(opts, NOPTS, &cfg);
    kvt_cfg_result_cleanup(&res);
    return rc;
}
