/*
 * kvindex/zsub_pub.c: kvtierd's own KV-event stream: the events it applied,
 * republished in vLLM's form on a PUB socket, with a ROUTER that replays the
 * last batches on request.
 */
#include "kvindex/zsub.h"

#include <errno.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/bytes.h"
#include "common/clock.h"
#include "common/errtext.h"
#include "common/ipcdir.h"
#include "common/log.h"
#include "kvindex/zsub_int.h"

void kvt_zsub_pub_free(zs_pub_t *p)
{
    if (p == NULL)
        return;
    kvt_zsub_sock_close(&p->pub);
    kvt_zsub_sock_close(&p->router);
    kvt_ipcdir_release(p->info.endpoint); /* "" until bound */
    kvt_ipcdir_release(p->info.replay_endpoint);
    for (uint32_t i = 0; i < p->info.buffered; i++)
        free(p->ring[(p->head + i) % p->cap].data);
    free(p->ring);
    msgpack_sbuffer_destroy(&p->sb);
    free(p);
}

/* ---- the publisher --------------------------------------------------------------------------- */

/* Frees the half-open publisher @p; the status of the ZMQ error @e. */
static kvt_status_t zs_open_failed(zs_pub_t *p, int e)
{
    kvt_zsub_pub_free(p);
    return e == EINVAL || e == EPROTONOSUPPORT ? KVT_ERR_INVAL : KVT_ERR_IO;
}

kvt_status_t kvt_zsub_publish_open(kvt_zsub_t *z, const char *endpoint, const char *replay_endpoint,
                                   uint32_t buffer_steps, char *err, size_t errlen)
{
    if (z->pub != NULL) {
        kvt_errf(err, errlen, "the publisher is already open");
        return KVT_ERR_EXISTS;
    }
    if (kvt_zsub_check_endpoint("publish endpoint", endpoint, 1, err, errlen) != KVT_OK ||
        (replay_endpoint[0] != '\0' &&
         kvt_zsub_check_endpoint("publish replay endpoint", replay_endpoint, 1, err, errlen) !=
             KVT_OK))
        return KVT_ERR_INVAL;
    if (buffer_steps == 0) {
        kvt_errf(err, errlen, "the replay buffer needs at least 1 batch");
        return KVT_ERR_INVAL;
    }
    /* ipc binds: inside the ipc dir, never over a file that is not a dead socket of ours */
    char ep[2][KVT_ZSUB_MAX_ENDPOINT + 1];
    const char *want[2] = {endpoint, replay_endpoint};
    for (int i = 0; i < 2; i++) {
        snprintf(ep[i], sizeof(ep[i]), "%s", want[i]);
        if (!kvt_ipcdir_is_ipc(ep[i]))
            continue;
        if (kvt_ipcdir_bind_endpoint(z->cfg.ipc_dir, ep[i], ep[i], sizeof(ep[i]), err, errlen) !=
            KVT_OK)
            return KVT_ERR_INVAL;
        if (i == 1 && strcmp(ep[0], ep[1]) == 0) { /* the second bind would take the first's file */
            kvt_errf(err, errlen, "the publisher and its replay need two ipc names");
            return KVT_ERR_INVAL;
        }
        if (kvt_ipcdir_check_free(ep[i], err, errlen) != KVT_OK)
            return KVT_ERR_INVAL;
    }
    endpoint = ep[0];
    replay_endpoint = ep[1];
    zs_pub_t *p = calloc(1, sizeof(*p));
    if (p == NULL || (p->ring = calloc(buffer_steps, sizeof(*p->ring))) == NULL) {
        free(p);
        kvt_errf(err, errlen, "out of memory");
        return KVT_ERR_NO_MEM;
    }
    msgpack_sbuffer_init(&p->sb);
    p->cap = buffer_steps;
    int zero = 0;
    p->pub = zmq_socket(z->ctx, ZMQ_PUB);
    if (p->pub == NULL)
        goto err_zmq;
    zmq_setsockopt(p->pub, ZMQ_LINGER, &zero, sizeof(zero));
    if (zmq_bind(p->pub, endpoint) != 0) {
        kvt_errf(err, errlen, "bind %s: %s", endpoint, zmq_strerror(errno));
        goto err_io;
    }
    size_t n = sizeof(p->info.endpoint);
    zmq_getsockopt(p->pub, ZMQ_LAST_ENDPOINT, p->info.endpoint, &n);
    if (replay_endpoint[0] != '\0') {
        p->router = zmq_socket(z->ctx, ZMQ_ROUTER);
        if (p->router == NULL)
            goto err_zmq;
        zmq_setsockopt(p->router, ZMQ_LINGER, &zero, sizeof(zero));
        zmq_setsockopt(p->router, ZMQ_SNDHWM, &zero, sizeof(zero)); /* a replay is sent whole */
        if (zmq_bind(p->router, replay_endpoint) != 0) {
            kvt_errf(err, errlen, "bind %s: %s", replay_endpoint, zmq_strerror(errno));
            goto err_io;
        }
        n = sizeof(p->info.replay_endpoint);
        zmq_getsockopt(p->router, ZMQ_LAST_ENDPOINT, p->info.replay_endpoint, &n);
    }
    p->info.open = true;
    z->pub = p;
    kvt_log_info("publishing kv events on %s (replay %s, %u batches kept)", p->info.endpoint,
                 p->router ? p->info.replay_endpoint : "none", buffer_steps);
    return KVT_OK;
err_zmq:
    kvt_errf(err, errlen, "zmq_socket: %s", zmq_strerror(errno));
err_io:
    return zs_open_failed(p, errno); /* errno is read before the frees can change it */
}

static const char *const zs_medium[] = {"GPU", "CPU", "DISK"};

/* Whether event @e is republished: what kvtier could not read or does not model is not. */
static bool zs_publishes(const kvt_event_t *e)
{
    return e->type != KVT_EV_BAD && e->skip == KVT_EV_SKIP_NONE;
}

/* kv_cache_spec_kind names for KVT_EV_GROUP_* (ANY: nil). */
static const char *const zs_kind[] = {NULL, "full_attention", "sliding_window"};

/* The msgpack_pack_* calls below return 0, or -1 when the buffer could not grow: or-ed. */

static int zs_pack_str(msgpack_packer *pk, const char *s)
{
    return msgpack_pack_str_with_body(pk, s, strlen(s));
}

/*
 * Event @e's extra_keys as vLLM would send them: the first block's cache salt
 * where the chain starts (no parent: vLLM's place for it), and each block's
 * extra seed (an opaque key that seeds the block again downstream); nil where
 * a block has none.
 */
static int zs_encode_extra_keys(msgpack_packer *pk, const kvt_event_t *e)
{
    bool salt = e->cache_salt != NULL && !e->has_parent;
    int rc = msgpack_pack_array(pk, e->nhashes);
    for (uint32_t k = 0; k < e->nhashes; k++) {
        bool s = k == 0 && salt;
        bool x = e->extra_seeds != NULL && e->extra_seeds[k] != 0;
        if (!s && !x) {
            rc |= msgpack_pack_nil(pk);
            continue;
        }
        rc |= msgpack_pack_array(pk, (uint32_t)s + (uint32_t)x);
        if (s)
            rc |= msgpack_pack_str_with_body(pk, e->cache_salt, e->cache_salt_len);
        if (x)
            rc |= msgpack_pack_uint64(pk, e->extra_seeds[k]);
    }
    return rc;
}

/*
 * Stored event @e of @b, positional. It runs to lora_name, and on to
 * extra_keys, group_idx and kv_cache_spec_kind when they carry anything. A
 * cache salt on an event with a parent cannot go in extra_keys (after a
 * parent a lone string there is a multimodal key): it goes in SGLang's
 * metadata map {"cache_salt"} past vLLM's last field, which kvtier's decoder
 * reads in either format, so a subscriber salts the event's first block when
 * it does not know the parent, as kvt_ev_apply() did here.
 */
static int zs_encode_stored(msgpack_packer *pk, const kvt_evbatch_t *b, const kvt_event_t *e,
                            const char *medium)
{
    bool group = e->group >= 0;
    bool meta = e->cache_salt != NULL && e->has_parent;
    bool extras = (e->cache_salt != NULL && !e->has_parent) || e->extra_seeds != NULL;
    const char *lora = e->lora_name != NULL ? e->lora_name : b->lora;
    uint32_t n = meta ? 15 : group ? 11 : extras ? 9 : 8;
    int rc = msgpack_pack_array(pk, n);
    rc |= zs_pack_str(pk, "BlockStored");
    rc |= msgpack_pack_array(pk, e->nhashes);
    for (uint32_t k = 0; k < e->nhashes; k++)
        rc |= msgpack_pack_uint64(pk, e->hashes[k]);
    rc |= e->has_parent ? msgpack_pack_uint64(pk, e->parent) : msgpack_pack_nil(pk);
    rc |= msgpack_pack_array(pk, e->ntokens);
    for (uint32_t k = 0; k < e->ntokens; k++)
        rc |= msgpack_pack_uint32(pk, e->tokens[k]);
    rc |= msgpack_pack_uint32(pk, e->block_size);
    rc |= msgpack_pack_nil(pk); /* lora_id */
    rc |= zs_pack_str(pk, medium);
    rc |= lora != NULL ? zs_pack_str(pk, lora) : msgpack_pack_nil(pk);
    if (n > 8)
        rc |= extras ? zs_encode_extra_keys(pk, e) : msgpack_pack_nil(pk);
    if (n > 9) {
        const char *kind = group ? zs_kind[e->group_kind < 3 ? e->group_kind : 0] : NULL;
        rc |= group ? msgpack_pack_uint64(pk, (uint64_t)e->group) : msgpack_pack_nil(pk);
        rc |= kind != NULL ? zs_pack_str(pk, kind) : msgpack_pack_nil(pk);
    }
    if (n > 11) {
        for (int k = 0; k < 3; k++) /* kv_cache_spec_sliding_window, locality, ownership */
            rc |= msgpack_pack_nil(pk);
        rc |= msgpack_pack_map(pk, 1);
        rc |= zs_pack_str(pk, "cache_salt");
        rc |= msgpack_pack_str_with_body(pk, e->cache_salt, e->cache_salt_len);
    }
    return rc;
}

/*
 * @b as a positional vLLM batch [ts, events, dp_rank] into p->sb: its events
 * but those kvtier skipped (zs_publishes()); removals run to group_idx when
 * they have one. KVT_OK, or KVT_ERR_NO_MEM when the buffer could not grow
 * (p->sb then holds a truncated payload, never to be sent).
 */
static kvt_status_t zs_encode(zs_pub_t *p, const kvt_evbatch_t *b)
{
    msgpack_packer pk;
    msgpack_sbuffer_clear(&p->sb);
    msgpack_packer_init(&pk, &p->sb, msgpack_sbuffer_write);
    int rc = msgpack_pack_array(&pk, 3);
    rc |= msgpack_pack_double(&pk, kvt_clock_wall());
    uint32_t n = 0;
    for (size_t i = 0; i < b->nev; i++)
        n += zs_publishes(&b->ev[i]);
    rc |= msgpack_pack_array(&pk, n);
    for (size_t i = 0; i < b->nev && rc == 0; i++) {
        const kvt_event_t *e = &b->ev[i];
        if (!zs_publishes(e))
            continue;
        const char *medium = zs_medium[e->tier == KVT_TIER_CPU    ? 1
                                       : e->tier == KVT_TIER_DISK ? 2
                                                                  : 0];
        if (e->type == KVT_EV_CLEARED) {
            rc |= msgpack_pack_array(&pk, 1);
            rc |= zs_pack_str(&pk, "AllBlocksCleared");
        } else if (e->type == KVT_EV_STORED) {
            rc |= zs_encode_stored(&pk, b, e, medium);
        } else {
            bool group = e->group >= 0;
            rc |= msgpack_pack_array(&pk, group ? 4 : 3);
            rc |= zs_pack_str(&pk, "BlockRemoved");
            rc |= msgpack_pack_array(&pk, e->nhashes);
            for (uint32_t k = 0; k < e->nhashes; k++)
                rc |= msgpack_pack_uint64(&pk, e->hashes[k]);
            rc |= zs_pack_str(&pk, medium);
            if (group)
                rc |= msgpack_pack_uint64(&pk, (uint64_t)e->group);
        }
    }
    rc |= msgpack_pack_uint32(&pk, b->dp_rank);
    return rc == 0 ? KVT_OK : KVT_ERR_NO_MEM;
}

kvt_status_t kvt_zsub_publish(kvt_zsub_t *z, const kvt_evbatch_t *b)
{
    zs_pub_t *p = z->pub;
    if (p == NULL)
        return KVT_OK;
    void *copy = NULL;
    if (zs_encode(p, b) == KVT_OK)
        copy = malloc(p->sb.size ? p->sb.size : 1);
    if (copy == NULL) {
        /* Nothing is sent, but the seq is spent: subscribers see a gap that no replay fills
         * and drop the pod's state, rather than miss what was applied here. */
        p->info.batches++;
        p->info.send_failures++;
        kvt_log_warn("batch seq %llu not published: out of memory",
                     (unsigned long long)p->info.batches - 1);
        return KVT_ERR_NO_MEM;
    }
    memcpy(copy, p->sb.data, p->sb.size);
    uint64_t seq = p->info.batches++;
    if (p->info.buffered == p->cap) {
        free(p->ring[p->head].data);
        p->head = (p->head + 1) % p->cap;
        p->info.buffered--;
    }
    p->ring[(p->head + p->info.buffered) % p->cap] = (zs_held_t){seq, p->sb.size, copy};
    p->info.buffered++;
    char topic[2 * KVT_IDX_MAX_NAME + 8];
    int tl = snprintf(topic, sizeof(topic), "kv@%s@%s", b->pod, b->model ? b->model : "");
    uint8_t s8[8];
    kvt_store_be64(s8, seq);
    if (zmq_send(p->pub, topic, (size_t)tl, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(p->pub, s8, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(p->pub, copy, p->sb.size, ZMQ_DONTWAIT) < 0) {
        p->info.send_failures++;
        return KVT_ERR_IO;
    }
    return KVT_OK;
}

void kvt_zsub_publish_info(const kvt_zsub_t *z, kvt_zsub_pub_info_t *info)
{
    if (z->pub == NULL)
        memset(info, 0, sizeof(*info));
    else
        *info = z->pub->info;
}

void kvt_zsub_pub_serve(zs_pub_t *p)
{
    zmq_msg_t f[4];
    for (int k = 0; k < ZS_BUDGET; k++) {
        bool extra;
        int n = kvt_zsub_msg_recv(p->router, f, 4, &extra);
        if (n < 0)
            return;
        uint64_t start;
        if (n != 3 || extra || zmq_msg_size(&f[1]) != 0 || !kvt_zsub_msg_seq(&f[2], &start)) {
            p->info.bad_requests++;
        } else {
            p->info.replays++;
            const void *id = zmq_msg_data(&f[0]);
            size_t idlen = zmq_msg_size(&f[0]);
            uint8_t s8[8];
            bool ok = true;
            for (uint32_t i = 0; i < p->info.buffered && ok; i++) {
                const zs_held_t *h = &p->ring[(p->head + i) % p->cap];
                if (h->seq < start)
                    continue;
                kvt_store_be64(s8, h->seq);
                ok = zmq_send(p->router, id, idlen, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
                     zmq_send(p->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
                     zmq_send(p->router, s8, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
                     zmq_send(p->router, h->data, h->len, ZMQ_DONTWAIT) >= 0;
                p->info.replayed += ok;
            }
            kvt_store_be64(s8, ZS_END_SEQ);
            if (ok && zmq_send(p->router, id, idlen, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
                zmq_send(p->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
                zmq_send(p->router, s8, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0)
                zmq_send(p->router, "", 0, ZMQ_DONTWAIT);
        }
        for (int i = 0; i < n; i++)
            zmq_msg_close(&f[i]);
    }
}
