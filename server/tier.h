/*
 * server/tier.h: kvtierd's own tiers (tiers/tiers.h) in the daemon: opened
 * from the config, their changes applied to the index as the sidecar's own
 * pod and published, their figures in /v1/stats and /metrics.
 */
#ifndef KVT_SERVER_TIER_H
#define KVT_SERVER_TIER_H

#include <stddef.h>

#include "common/json.h"
#include "server/srv_int.h"

/* Opens the tiers when --ram-bytes is set (the metadata in <data-dir>/tiers); the reloaded
 * blocks' changes are queued for the writer. Logs why it failed. */
kvt_status_t srv_tier_open(kvt_srv_t *srv);
void srv_tier_close(kvt_srv_t *srv);

/* Bytes of the longest tier namespace srv_tier_ns() makes. */
#define SRV_TIER_NS_MAX (2 * KVT_IDX_MAX_NAME + 2)

/*
 * A tier namespace from a model and LoRA: the model, or model NUL lora, for
 * the standard's sequence keys; model NUL lora NUL (lora may be empty) for
 * engine-hash keys (@engine): the two never meet, as no name holds a NUL.
 * @out has room for SRV_TIER_NS_MAX bytes. Returns its length.
 */
size_t srv_tier_ns(const char *model, size_t mlen, const char *lora, size_t llen, bool engine,
                   char *out);

/* Writer: applies a JOB_TIER_CHANGES batch to the sidecar's pod and publishes it. */
void srv_tier_apply(kvt_srv_t *srv, srv_job_t *job);

#define SRV_TIER_RETRY_NS 200000000ull /* engine keys not in the index: looked at again this often */
#define SRV_TIER_RETRY_SLOTS 65536u     /* ... this many slots of their table at a time */

/*
 * Writer, every loop: the engine-key blocks whose hash --pod had not reported
 * (no event stream yet, its event not applied yet, or blocks reloaded from
 * NVMe after a restart) join the pod's entries once it has; at most every
 * SRV_TIER_RETRY_NS, a slice of them at a time.
 */
void srv_tier_retry(kvt_srv_t *srv, uint64_t now_ns);

/* The "tiers" member of /v1/stats ("tiers":null without tiers). */
void srv_tier_stats_json(kvt_srv_t *srv, kvt_jbuf_t *o);
/* The tiers' lines of /metrics (nothing without tiers). */
void srv_tier_metrics(kvt_srv_t *srv, kvt_jbuf_t *o);

#endif
