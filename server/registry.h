/*
 * server/registry.h: pod and namespace names as the workers resolve them: an
 * immutable snapshot (kvt_srv_reg_t, srv_int.h) the writer republishes when
 * names change, read under the server's EBR (registry.c).
 */
#ifndef KVT_SERVER_REGISTRY_H
#define KVT_SERVER_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include "server/srv_int.h"

/* Writer. Builds a snapshot of the index's pods and namespaces and publishes it (on out of
 * memory the old one stays, with a warning). */
void srv_reg_publish(kvt_srv_t *srv);

/* Worker. The snapshot, valid until srv_reg_exit(). */
kvt_srv_reg_t *srv_reg_enter(kvt_srv_worker_t *w);
void srv_reg_exit(kvt_srv_worker_t *w);

/* The namespace of (@model, @lora) in @r (lora "" for the base model), or NULL. */
const reg_ns_t *srv_reg_ns(const kvt_srv_reg_t *r, const char *model, size_t mlen, const char *lora,
                           size_t llen);

/* Writes to @out (up to @cap) the id of every live pod named @name (all DP ranks); returns how
 * many. */
size_t srv_reg_pods_named(const kvt_srv_reg_t *r, const char *name, size_t len, uint32_t *out,
                          size_t cap);

#endif
