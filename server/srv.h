/*
 * server/srv: the kvtierd daemon as a library: create it from a config, run
 * it until stopped, destroy it. main.c adds the config table and signals.
 */
#ifndef KVT_SERVER_SRV_H
#define KVT_SERVER_SRV_H

#include <stdbool.h>
#include <stdint.h>

#include "common/config.h"
#include "common/log.h"
#include "common/status.h"

/*
 * How kvtierd keys the blocks of a LoRA request (--lora-keys, docs/configuration.md).
 * Either way each (model, LoRA) is a namespace of its own in the index.
 */
typedef enum kvt_srv_lora_keys {
    KVT_SRV_LORA_KEYS_NAMESPACE = 0, /* the standard's keys, as for the base model */
    KVT_SRV_LORA_KEYS_DYNAMO = 1,    /* Dynamo's: the LoRA seeds every block (kvindex/hash.h) */
} kvt_srv_lora_keys_t;

typedef struct kvt_srv_config {
    char *http_listen;           /* "host:port"; "" disables HTTP */
    char *rpc_listen;            /* "host:port"; "" disables the TCP RPC */
    char *rpc_unix;              /* Unix socket path for the RPC; "" or NULL: none */
    bool allow_remote;           /* permit binding addresses other than loopback */
    char *data_dir;              /* created if missing; the Unix socket may live there */
    char *auth_token_file;       /* "" or NULL: mutating calls need no token */
    uint32_t workers;            /* query threads; 0: one per online core */
    uint32_t max_connections;    /* across all listeners */
    uint64_t max_body;           /* HTTP body bytes */
    uint64_t max_header;         /* HTTP request head bytes */
    uint64_t rpc_max_frame;      /* RPC body bytes */
    uint32_t rpc_max_inflight;   /* RPC requests waiting on the writer per connection */
    uint64_t conn_buffer;        /* output bytes buffered per connection before reads pause */
    uint64_t request_timeout_ms; /* a started request must arrive whole within this */
    uint64_t idle_timeout_ms;    /* an idle connection is closed after this */
    uint64_t index_budget;       /* bytes; 0: unbounded */
    uint32_t block_size;         /* default tokens per block for models that do not say */
    uint32_t max_query_tokens;   /* tokens (or keys) per query */
    uint32_t max_event_items;    /* hashes plus tokens per event batch */
    uint32_t writer_queue;       /* jobs waiting for the writer before 503 */
    uint64_t stats_period_ms;    /* how often counters are published */
    uint64_t writer_stall_ms;    /* /readyz fails when the writer's loop stalls this long */
    char *ipc_dir;               /* ipc:// binds live here; "" or NULL: <data_dir>/ipc */
    kvt_log_level_t log_level;   /* applied by main.c */
    kvt_cfg_list_t engines;      /* POST /v1/engines bodies subscribed at start; borrowed */
    uint64_t replay_timeout_ms;  /* a replay of missed event batches must end within this */
    uint32_t replay_hold;        /* live batches held per stream during a replay */
    uint64_t event_max_message;  /* largest ZMQ event message, bytes */
    char *publish;               /* ZMQ PUB endpoint for kvtierd's own events; "": off */
    char *publish_replay;        /* its ROUTER replay endpoint; "": none */
    uint32_t publish_buffer;     /* batches kept for replay */
    uint64_t removed_map_bytes;  /* engine-hash -> key mappings of removed blocks, bytes */
    uint64_t forget_idle_ms;     /* pods and namespaces empty and idle this long go; 0: never */
    /* how LoRA requests are keyed (--lora-keys) */
    kvt_srv_lora_keys_t lora_keys;
    /* the sidecar's own tiers (docs/tiers.md); ram_bytes 0: none */
    char *pod;            /* this sidecar's engine pod; "" or NULL: the host name */
    uint64_t ram_bytes;   /* host-RAM arena bytes */
    uint64_t block_bytes; /* largest block */
    char *arena_name;     /* "", NAME (/dev/shm/NAME) or an absolute path */
    char *disk_path;      /* NVMe store file or device; "" or NULL: no NVMe tier */
    uint64_t disk_bytes;  /* store size when it is created */
    bool disk_format;     /* a --disk-path block device without kvtier's header is formatted */
    uint32_t io_depth;    /* NVMe I/Os in flight */
    bool sqpoll;          /* io_uring SQPOLL */
    char *disk_admit;     /* always, seen-twice, tinylfu */
    uint64_t lease_ms;    /* pins and reservations expire after this */
    uint64_t release_grace_ms; /* ... and, left behind, hold their slots this much longer */
    bool ucx;             /* take part in transfers between sidecars (UCX) */
    bool shm;             /* transfers with a same-host peer map its arena instead of UCX */
} kvt_srv_config_t;

typedef struct kvt_srv kvt_srv_t;

/*
 * Binds the listeners (so ports are known at return), creates the data and
 * ipc directories (the ipc one 0700), the index and threads' state, and
 * subscribes to @cfg's engines. @cfg is copied (strings duplicated; the
 * engine list is read here only). Returns KVT_OK, KVT_ERR_INVAL (bad address,
 * a non-loopback address without allow_remote, unreadable token file, a bad
 * --engine, an ipc dir that is not this user's directory; a line is logged),
 * KVT_ERR_IO (bind or mkdir failed) or KVT_ERR_NO_MEM.
 */
kvt_status_t kvt_srv_create(const kvt_srv_config_t *cfg, kvt_srv_t **srv_p);

/* Ports actually bound (useful with port 0); 0 when that listener is off. */
uint16_t kvt_srv_http_port(const kvt_srv_t *srv);
uint16_t kvt_srv_rpc_port(const kvt_srv_t *srv);

/* Starts the threads and blocks until kvt_srv_stop(); then joins them. */
kvt_status_t kvt_srv_run(kvt_srv_t *srv);

/* Async-signal-safe: asks kvt_srv_run() to return (connections are closed, queued writes applied).
 */
void kvt_srv_stop(kvt_srv_t *srv);

/* Frees everything. The server must not be running. NULL is a no-op. */
void kvt_srv_destroy(kvt_srv_t *srv);

#endif
