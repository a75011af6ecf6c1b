/* bench/live_engine: one simulated vLLM engine publishing KV events (live_engine.h). */
#include "bench/live_engine.h"

#include <errno.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/bytes.h"
#include "common/clock.h"
#include "common/errtext.h"

void kvt_live_block_tokens(uint64_t id, uint32_t bs, uint32_t *out)
{
    /* ids of one trace are small; a token is a word of a 50k vocabulary */
    for (uint32_t j = 0; j < bs; j++)
        out[j] = (uint32_t)(kvt_sim_mix(id * 1024u + j) % 50000u);
}

void kvt_live_engine_cleanup(kvt_live_engine_t *e)
{
    if (e->pub != NULL)
        zmq_close(e->pub);
    if (e->router != NULL)
        zmq_close(e->router);
    for (size_t i = 0; i < e->nbatches; i++)
        free(e->batches[i].data);
    free(e->batches);
    free(e->evicted);
    free(e->tokens);
    kvt_sim_cache_cleanup(&e->cache);
    memset(e, 0, sizeof(*e));
}

/* Binds @s on an ephemeral loopback port and writes the endpoint to @ep. */
static int engine_bind(void *s, char *ep)
{
    int zero = 0;
    size_t n = KVT_LIVE_ENDPOINT_MAX;
    /* never drop: a lost batch would be a gap (the test hook makes its own) */
    zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof(zero));
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
    if (zmq_bind(s, "tcp://127.0.0.1:*") != 0 || zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &n) != 0)
        return -1;
    return 0;
}

kvt_status_t kvt_live_engine_init(kvt_live_engine_t *e, void *zctx, const char *topic,
                                  uint64_t capacity, uint32_t room, uint32_t block_size, char *why,
                                  size_t whylen)
{
    memset(e, 0, sizeof(*e));
    e->block_size = block_size;
    snprintf(e->topic, sizeof(e->topic), "%s", topic);
    kvt_status_t st = kvt_sim_cache_init(&e->cache, capacity, room);
    if (st != KVT_OK) {
        kvt_errf(why, whylen, "engine cache: %s", kvt_status_str(st));
        return st;
    }
    e->evicted = malloc((room ? room : 1) * sizeof(*e->evicted));
    e->tokens = malloc(((size_t)room * block_size + 1) * sizeof(*e->tokens));
    if (e->evicted == NULL || e->tokens == NULL) {
        kvt_errf(why, whylen, "out of memory");
        kvt_live_engine_cleanup(e);
        return KVT_ERR_NO_MEM;
    }
    e->pub = zmq_socket(zctx, ZMQ_PUB);
    e->router = zmq_socket(zctx, ZMQ_ROUTER);
    if (e->pub == NULL || e->router == NULL || engine_bind(e->pub, e->endpoint) != 0 ||
        engine_bind(e->router, e->replay_endpoint) != 0) {
        kvt_errf(why, whylen, "engine sockets: %s", zmq_strerror(errno));
        kvt_live_engine_cleanup(e);
        return KVT_ERR_IO;
    }
    return KVT_OK;
}

/* ---- batches ------------------------------------------------------------------------------ */

static void pack_str(msgpack_packer *p, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(p, n);
    msgpack_pack_str_body(p, s, n);
}

/* Appends @sb's bytes as the next batch, due at @due_ns (the buffer is taken over). */
static kvt_status_t engine_queue(kvt_live_engine_t *e, msgpack_sbuffer *sb, uint64_t due_ns)
{
    if (e->nbatches == e->cap) {
        size_t cap = e->cap ? 2 * e->cap : 256;
        kvt_live_batch_t *b = realloc(e->batches, cap * sizeof(*b));
        if (b == NULL) {
            msgpack_sbuffer_destroy(sb);
            return KVT_ERR_NO_MEM;
        }
        e->batches = b;
        e->cap = cap;
    }
    e->batches[e->nbatches++] = (kvt_live_batch_t){due_ns, (uint8_t *)sb->data, sb->size};
    return KVT_OK;
}

kvt_status_t kvt_live_engine_ping(kvt_live_engine_t *e)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer p;
    msgpack_packer_init(&p, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&p, 3);
    msgpack_pack_double(&p, kvt_clock_wall());
    msgpack_pack_array(&p, 0);
    msgpack_pack_uint32(&p, 0);
    if (sb.data == NULL)
        return KVT_ERR_NO_MEM;
    kvt_status_t st = engine_queue(e, &sb, 0);
    return st == KVT_OK ? kvt_live_engine_flush(e, kvt_clock_ns(), true) : st;
}

/*
 * The batch of a request: [ts, [BlockStored, BlockRemoved?], dp_rank 0] in
 * vLLM's positional form (<= v0.25, array_like): BlockStored is
 * [type, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium].
 */
static kvt_status_t engine_pack(kvt_live_engine_t *e, const uint64_t *ids, uint32_t n, uint32_t hit,
                                uint32_t nev, msgpack_sbuffer *sb)
{
    uint32_t bs = e->block_size, nst = n - hit;
    msgpack_sbuffer_init(sb);
    msgpack_packer p;
    msgpack_packer_init(&p, sb, msgpack_sbuffer_write);
    msgpack_pack_array(&p, 3);
    msgpack_pack_double(&p, kvt_clock_wall());
    msgpack_pack_array(&p, (nst > 0) + (nev > 0));
    if (nst > 0) {
        msgpack_pack_array(&p, 7);
        pack_str(&p, "BlockStored");
        msgpack_pack_array(&p, nst);
        for (uint32_t b = hit; b < n; b++)
            msgpack_pack_uint64(&p, kvt_sim_key(ids[b]));
        if (hit > 0)
            msgpack_pack_uint64(&p, kvt_sim_key(ids[hit - 1]));
        else
            msgpack_pack_nil(&p);
        msgpack_pack_array(&p, nst * bs);
        for (uint32_t b = hit; b < n; b++) {
            kvt_live_block_tokens(ids[b], bs, e->tokens);
            for (uint32_t j = 0; j < bs; j++)
                msgpack_pack_uint32(&p, e->tokens[j]);
        }
        msgpack_pack_uint32(&p, bs);
        msgpack_pack_nil(&p);
        pack_str(&p, "GPU");
    }
    if (nev > 0) {
        msgpack_pack_array(&p, 3);
        pack_str(&p, "BlockRemoved");
        msgpack_pack_array(&p, nev);
        for (uint32_t k = 0; k < nev; k++)
            msgpack_pack_uint64(&p, kvt_sim_key(e->evicted[k]));
        pack_str(&p, "GPU");
    }
    msgpack_pack_uint32(&p, 0);
    return sb->data != NULL ? KVT_OK : KVT_ERR_NO_MEM;
}

kvt_status_t kvt_live_engine_admit(kvt_live_engine_t *e, const kvt_sim_model_t *m,
                                   const uint64_t *ids, uint32_t n, double arrival_us,
                                   uint64_t t0_ns, double speedup, kvt_live_admit_t *out)
{
    uint32_t hit = kvt_sim_cache_hit(&e->cache, ids, n);
    double start = arrival_us > e->busy_until_us ? arrival_us : e->busy_until_us;
    double done = start + kvt_sim_prefill_us(m, n, hit, 0, 0);
    uint32_t nev = 0;
    e->busy_until_us = done;
    if (n > 0)
        kvt_sim_cache_insert(&e->cache, ids, n, e->evicted, &nev);
    *out = (kvt_live_admit_t){hit, done - arrival_us, done, nev, false};
    e->prefilled += n - hit;
    e->routed += n;
    e->evicted_blocks += nev;
    if (hit == n && nev == 0)
        return KVT_OK; /* nothing changed: vLLM sends no batch */
    msgpack_sbuffer sb;
    kvt_status_t st = engine_pack(e, ids, n, hit, nev, &sb);
    if (st != KVT_OK) {
        msgpack_sbuffer_destroy(&sb);
        return st;
    }
    out->batch = true;
    return engine_queue(e, &sb, t0_ns + (uint64_t)(done * 1000.0 / speedup));
}

/* ---- the sockets -------------------------------------------------------------------------- */

static int engine_send(void *s, const void *id, size_t idlen, uint64_t seq, const void *data,
                       size_t len)
{
    uint8_t s8[8];
    kvt_store_be64(s8, seq);
    if (id != NULL && zmq_send(s, id, idlen, ZMQ_SNDMORE) < 0)
        return -1;
    if (zmq_send(s, "", 0, ZMQ_SNDMORE) < 0 || zmq_send(s, s8, 8, ZMQ_SNDMORE) < 0 ||
        zmq_send(s, data, len, 0) < 0)
        return -1;
    return 0;
}

/* Answers the replay requests waiting on the ROUTER: [id, b"", start_seq(8)]. */
static void engine_serve_replays(kvt_live_engine_t *e)
{
    for (;;) {
        zmq_msg_t f[3];
        int nf = 0, more = 1;
        while (more) {
            zmq_msg_t junk, *m = nf < 3 ? &f[nf] : &junk;
            zmq_msg_init(m);
            if (zmq_msg_recv(m, e->router, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(m);
                for (int i = 0; i < nf && i < 3; i++)
                    zmq_msg_close(&f[i]);
                return; /* nothing (more) waiting */
            }
            more = zmq_msg_more(m);
            if (m == &junk)
                zmq_msg_close(m);
            nf++;
        }
        if (nf == 3 && zmq_msg_size(&f[2]) == 8) {
            uint64_t start = kvt_load_be(zmq_msg_data(&f[2]), 8);
            const void *id = zmq_msg_data(&f[0]);
            size_t idlen = zmq_msg_size(&f[0]);
            e->replays++;
            for (size_t s = start; s < e->next_pub; s++)
                if (e->batches[s].data != NULL)
                    engine_send(e->router, id, idlen, s, e->batches[s].data, e->batches[s].len);
            engine_send(e->router, id, idlen, UINT64_MAX, "", 0);
        }
        for (int i = 0; i < nf && i < 3; i++)
            zmq_msg_close(&f[i]);
    }
}

kvt_status_t kvt_live_engine_flush(kvt_live_engine_t *e, uint64_t now_ns, bool all)
{
    engine_serve_replays(e);
    while (e->next_pub < e->nbatches && (all || e->batches[e->next_pub].due_ns <= now_ns)) {
        size_t s = e->next_pub++;
        kvt_live_batch_t *b = &e->batches[s];
        e->last_lost = e->lose_every != 0 && s > 0 && s % e->lose_every == 0;
        if (e->last_lost) {
            e->withheld++; /* the subscriber sees a gap and asks the replay socket */
        } else {
            uint8_t s8[8];
            kvt_store_be64(s8, s);
            if (zmq_send(e->pub, e->topic, strlen(e->topic), ZMQ_SNDMORE) < 0 ||
                zmq_send(e->pub, s8, 8, ZMQ_SNDMORE) < 0 ||
                zmq_send(e->pub, b->data, b->len, 0) < 0)
                return KVT_ERR_IO;
        }
        if (s >= KVT_LIVE_REPLAY_STEPS) { /* out of the replay window */
            free(e->batches[s - KVT_LIVE_REPLAY_STEPS].data);
            e->batches[s - KVT_LIVE_REPLAY_STEPS].data = NULL;
        }
    }
    return KVT_OK;
}

uint64_t kvt_live_engine_next_due(const kvt_live_engine_t *e)
{
    return e->next_pub < e->nbatches ? e->batches[e->next_pub].due_ns : UINT64_MAX;
}

int64_t kvt_live_engine_last_seq(const kvt_live_engine_t *e)
{
    return (int64_t)e->next_pub - 1;
}

double kvt_live_engine_load(const kvt_live_engine_t *e, const kvt_sim_model_t *m, double now_us)
{
    double left = e->busy_until_us - now_us;
    double per_block = (double)m->block_tokens * m->prefill_us_per_token;
    return left > 0 && per_block > 0 ? left / per_block : 0.0;
}
