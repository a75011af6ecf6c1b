/*
 * kvindex/event private: what kvt_ev_apply() (event.c) asks of the context
 * that outlives a batch (event_ctx.c). Every function takes a NULL context
 * and then behaves as if it knew nothing.
 */
#ifndef KVT_KVINDEX_EVENT_INT_H
#define KVT_KVINDEX_EVENT_INT_H

#include "kvindex/event.h"

/* Makes room for pod id @pod's state. KVT_OK or KVT_ERR_NO_MEM. */
kvt_status_t ev_ctx_pod(kvt_ev_ctx_t *ctx, uint32_t pod);

/* Records whether group @group of @pod is one kvtier does not index (@other). */
void ev_ctx_group_learn(kvt_ev_ctx_t *ctx, uint32_t pod, int64_t group, bool other);

/* Whether group @group of @pod is known not to be indexed. */
bool ev_ctx_group_other(const kvt_ev_ctx_t *ctx, uint32_t pod, int64_t group);

/* Forgets @pod's removed mappings (its state was dropped: they may be stale). */
void ev_ctx_forget_removed(kvt_ev_ctx_t *ctx, uint32_t pod);

/*
 * A token-less BlockStored (vLLM's CPU offload placeholder): adds e->tier to
 * the blocks @pod knows by engine hash, or removed recently. Counts
 * unresolved and recovered hashes in @c.
 */
kvt_status_t ev_ctx_placeholder(kvt_ev_ctx_t *ctx, kvt_idx_t *idx, uint32_t pod,
                                const kvt_event_t *e, kvt_ev_counters_t *c);

/* A BlockRemoved: drops e->tier, remembering the mappings of blocks @pod no longer holds. */
kvt_status_t ev_ctx_remove(kvt_ev_ctx_t *ctx, kvt_idx_t *idx, uint32_t pod, const kvt_event_t *e,
                           kvt_ev_counters_t *c);

#endif
