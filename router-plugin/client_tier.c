/*
 * router-plugin/client_tier.c: libkvtier's tier calls (client.h, "tiers"):
 * ATTACH and the arena's mapping, the engine's data plane (LOOKUP, RESERVE,
 * COMMIT, PIN, UNPIN, PREFETCH) and the block API (BLOCK_PUT, _GET,
 * _DELETE). Each is one blocking round trip through kvt_cl_call(), encoded
 * and decoded by proto/proto_tier.h.
 *
 * Only ATTACH needs more of the connection than a frame: its answer brings
 * the arena's descriptor (SCM_RIGHTS), which the read path keeps in
 * c->pass_fd while c->want_fd is set (client.c, cl_recv_fd()).
 */
#include "kvtier/client.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "router-plugin/client_int.h"

_Static_assert(KVT_CLIENT_LOC_RAM == KVT_PROTO_LOC_RAM && KVT_CLIENT_LOC_DISK == KVT_PROTO_LOC_DISK,
               "client.h's locations are the protocol's");
_Static_assert(KVT_CLIENT_SLOT_NONE == KVT_PROTO_SLOT_NONE, "client.h's no-slot is the protocol's");

/* PIN answers of up to this many keys decode on the stack. */
#define CL_PIN_STACK 64

/* The namespace of a tier call as the codec takes it; KVT_ERR_INVAL (message set) for an empty
 * model or a name over 255 bytes. */
static kvt_status_t tier_names(kvt_client_t *c, const char *what, const char *model,
                               const char *lora, kvt_proto_str_t *m_p, kvt_proto_str_t *l_p)
{
    size_t mlen = model != NULL ? strlen(model) : 0, llen = lora != NULL ? strlen(lora) : 0;
    if (mlen == 0 || mlen > KVT_PROTO_MAX_STR)
        return kvt_cl_fail(c, KVT_ERR_INVAL, "%s: model name empty or longer than %u bytes", what,
                           KVT_PROTO_MAX_STR);
    if (llen > KVT_PROTO_MAX_STR)
        return kvt_cl_fail(c, KVT_ERR_INVAL, "%s: lora name longer than %u bytes", what,
                           KVT_PROTO_MAX_STR);
    *m_p = (kvt_proto_str_t){model, (uint16_t)mlen};
    *l_p = (kvt_proto_str_t){lora, (uint16_t)llen};
    return KVT_OK;
}

/* Checks a key list: 1..UINT32_MAX keys, not NULL. */
static kvt_status_t tier_keys(kvt_client_t *c, const char *what, const uint64_t *keys, size_t n)
{
    if (n == 0)
        return kvt_cl_fail(c, KVT_ERR_INVAL, "%s: no keys", what);
    if (keys == NULL)
        return kvt_cl_fail(c, KVT_ERR_INVAL, "%s: NULL keys with n %zu", what, n);
    if (n > UINT32_MAX)
        return kvt_cl_fail(c, KVT_ERR_TOO_BIG, "%s: %zu keys, more than a request carries", what,
                           n);
    return KVT_OK;
}

/* The message of a failed encode (the arguments were checked: only size and memory remain). */
static kvt_status_t tier_encode_failed(kvt_client_t *c, const char *what, kvt_status_t st)
{
    if (st == KVT_ERR_TOO_BIG)
        return kvt_cl_fail(c, st, "%s: request larger than the protocol allows", what);
    return kvt_cl_fail(c, st, "%s: cannot encode the request: %s", what, kvt_status_str(st));
}

void kvt_client_set_engine_keys(kvt_client_t *c, bool on)
{
    c->engine_keys = on;
}

/* Sets KVT_PROTO_F_ENGINE_KEYS in the encoded request @req when the client asks for it. */
static void tier_flags(const kvt_client_t *c, kvt_proto_wr_t *req)
{
    if (c->engine_keys && !req->oom && req->len >= KVT_PROTO_HDR_SIZE) {
        kvt_proto_hdr_t h;
        kvt_proto_hdr_peek(req->buf, &h);
        h.flags |= KVT_PROTO_F_ENGINE_KEYS;
        kvt_proto_hdr_encode(&h, req->buf);
    }
}

/* An answer the codec refused: the stream cannot be trusted, so the connection goes. */
static kvt_status_t tier_bad_answer(kvt_client_t *c, const char *why)
{
    kvt_cl_close(c);
    return kvt_cl_fail(c, KVT_ERR_PROTO, "%s", why);
}

/*
 * Sends a KEYS request (LOOKUP, RESERVE, PIN, UNPIN, PREFETCH: @op; @what
 * names it in messages) and waits for its answer into *@ans (valid until
 * the client's next read).
 */
static kvt_status_t tier_keys_call(kvt_client_t *c, uint8_t op, const char *what, const char *model,
                                   const char *lora, const uint64_t *keys, size_t n,
                                   bool idempotent, cl_answer_t *ans)
{
    kvt_proto_wr_t req;
    kvt_proto_keys_t k;

    c->err[0] = '\0';
    kvt_status_t st = tier_names(c, what, model, lora, &k.model, &k.lora);
    if (st == KVT_OK)
        st = tier_keys(c, what, keys, n);
    if (st != KVT_OK)
        return st;
    k.n = (uint32_t)n;
    kvt_proto_wr_init(&req);
    st = kvt_proto_keys_req_encode(&req, op, 0, &k, keys);
    tier_flags(c, &req);
    if (st != KVT_OK)
        st = tier_encode_failed(c, what, st);
    else
        st = kvt_cl_call(c, &req, idempotent, ans);
    kvt_proto_wr_cleanup(&req);
    return st;
}

/* Decodes the one-count answer of COMMIT, UNPIN or PREFETCH into *@count_p (may be NULL). */
static kvt_status_t tier_count(kvt_client_t *c, const cl_answer_t *ans, uint32_t *count_p)
{
    char why[128];
    uint32_t count;
    if (kvt_proto_count_ans_decode(ans->body, ans->h.body_len, &count, why, sizeof(why)) != KVT_OK)
        return tier_bad_answer(c, why);
    if (count_p != NULL)
        *count_p = count;
    return KVT_OK;
}

/* ---- ATTACH and the mapping ----------------------------------------------------------------- */

/* Maps @fd as the arena of geometry @g into *@a_p; takes ownership of @fd only on KVT_OK. */
static kvt_status_t tier_map(kvt_client_t *c, int fd, const kvt_proto_attach_ans_t *g,
                             kvt_client_arena_t *a_p)
{
    struct stat sb;
    if (g->map_bytes == 0 || g->map_bytes > (uint64_t)SIZE_MAX / 2)
        return tier_bad_answer(c, "attach: the arena's size cannot be mapped");
    if (fstat(fd, &sb) != 0)
        return kvt_cl_fail(c, KVT_ERR_IO, "attach: fstat of the arena: %s", strerror(errno));
    /* Touching a page past the end of the file would be SIGBUS, not an error. */
    if (S_ISREG(sb.st_mode) && (uint64_t)sb.st_size < g->map_bytes)
        return tier_bad_answer(c, "attach: the arena's file is shorter than its map_bytes");
    void *base = mmap(NULL, (size_t)g->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED)
        return kvt_cl_fail(c, KVT_ERR_IO, "attach: mmap of %llu bytes: %s",
                           (unsigned long long)g->map_bytes, strerror(errno));
    *a_p = (kvt_client_arena_t){.base = base,
                                .map_bytes = (size_t)g->map_bytes,
                                .slot_off = (size_t)g->slot_off,
                                .slot_bytes = g->slot_bytes,
                                .nslots = g->nslots,
                                .block_bytes = g->block_bytes,
                                .disk_slots = g->disk_slots,
                                .fd = fd};
    return KVT_OK;
}

kvt_status_t kvt_client_attach(kvt_client_t *c, kvt_client_arena_t *a_p)
{
    kvt_proto_wr_t req;
    cl_answer_t ans;

    if (c == NULL)
        return KVT_ERR_INVAL;
    c->err[0] = '\0';
    if (a_p == NULL)
        return kvt_cl_fail(c, KVT_ERR_INVAL, "attach: NULL output");
    if (!c->is_unix)
        return kvt_cl_fail(c, KVT_ERR_INVAL,
                           "attach: the arena's descriptor travels only over a Unix socket "
                           "(unix:/path); over TCP use the block calls");
    kvt_proto_wr_init(&req);
    kvt_status_t st = kvt_proto_raw_encode(&req, KVT_PROTO_OP_ATTACH, 0, 0, NULL, 0);
    if (st != KVT_OK) {
        st = tier_encode_failed(c, "attach", st);
        goto out;
    }
    c->want_fd = true;
    st = kvt_cl_call(c, &req, true, &ans);
    c->want_fd = false;
    int fd = c->pass_fd; /* ours now, whatever happens */
    c->pass_fd = -1;
    if (st == KVT_OK) {
        kvt_proto_attach_ans_t g;
        char why[160];
        if (kvt_proto_attach_ans_decode(ans.body, ans.h.body_len, &g, why, sizeof(why)) != KVT_OK)
            st = tier_bad_answer(c, why);
        else if (fd < 0)
            st = tier_bad_answer(c, "attach: the answer came without the arena's descriptor");
        else if ((st = tier_map(c, fd, &g, a_p)) == KVT_OK)
            fd = -1; /* the arena's */
    }
    if (fd >= 0)
        close(fd);
out:
    kvt_proto_wr_cleanup(&req);
    return st;
}

void *kvt_client_arena_slot(const kvt_client_arena_t *a, uint32_t slot)
{
    if (a == NULL || a->base == NULL || slot >= a->nslots)
        return NULL;
    return (uint8_t *)a->base + a->slot_off + (size_t)slot * a->slot_bytes;
}

void kvt_client_detach(kvt_client_arena_t *a)
{
    if (a == NULL || a->base == NULL)
        return;
    (void)munmap(a->base, a->map_bytes);
    if (a->fd >= 0)
        close(a->fd);
    memset(a, 0, sizeof(*a));
    a->fd = -1;
}

/* ---- the data plane ------------------------------------------------------------------------- */

kvt_status_t kvt_client_lookup(kvt_client_t *c, const char *model, const char *lora,
                               const uint64_t *keys, size_t n, uint8_t *loc_out, uint32_t *hit_p)
{
    cl_answer_t ans;

    if (c == NULL)
        return KVT_ERR_INVAL;
    if (loc_out == NULL || hit_p == NULL)
        return kvt_cl_fail(c, KVT_ERR_INVAL, "lookup: NULL output");
    kvt_status_t st =
        tier_keys_call(c, KVT_PROTO_OP_LOOKUP, "lookup", model, lora, keys, n, true, &ans);
    if (st != KVT_OK)
        return st;
    char why[128];
    if (kvt_proto_lookup_ans_decode(ans.body, ans.h.body_len, loc_out, (uint32_t)n, hit_p, why,
                                    sizeof(why)) != KVT_OK)
        return tier_bad_answer(c, why);
    return KVT_OK;
}

kvt_status_t kvt_client_reserve(kvt_client_t *c, const char *model, const char *lora,
                                const uint64_t *keys, size_t n, uint32_t *slots_out,
                                uint64_t *evicted, size_t evicted_cap, size_t *nevicted_p)
{
    cl_answer_t ans;
    kvt_proto_reserve_ans_t a;
    char why[128];

    if (c == NULL)
        return KVT_ERR_INVAL;
    if (slots_out == NULL || (evicted == NULL && evicted_cap > 0))
        return kvt_cl_fail(c, KVT_ERR_INVAL, "reserve: NULL output");
    kvt_status_t st =
        tier_keys_call(c, KVT_PROTO_OP_RESERVE, "reserve", model, lora, keys, n, false, &ans);
    if (st != KVT_OK)
        return st;
    /* The slots are taken by now: more evicted keys than the caller has room for are counted,
     * not an error (they are decoded aside and the first evicted_cap kept). */
    uint32_t cap = evicted_cap > UINT32_MAX ? UINT32_MAX : (uint32_t)evicted_cap;
    st = kvt_proto_reserve_ans_decode(ans.body, ans.h.body_len, slots_out, (uint32_t)n, evicted,
                                      cap, &a, why, sizeof(why));
    if (st == KVT_ERR_TOO_BIG) {
        size_t room = ans.h.body_len / 8 + 1; /* each evicted key takes 8 bytes */
        uint64_t *all = malloc(room * sizeof(*all));
        if (all == NULL)
            return kvt_cl_fail(c, KVT_ERR_NO_MEM, "reserve: out of memory for %zu evicted keys",
                               room);
        st = kvt_proto_reserve_ans_decode(ans.body, ans.h.body_len, slots_out, (uint32_t)n, all,
                                          (uint32_t)room, &a, why, sizeof(why));
        if (st == KVT_OK && cap > 0)
            memcpy(evicted, all, cap * sizeof(*all));
        free(all);
    }
    if (st != KVT_OK)
        return tier_bad_answer(c, why);
    if (a.n != n) {
        kvt_cl_close(c);
        return kvt_cl_fail(c, KVT_ERR_PROTO, "reserve: %u slots for %zu keys", a.n, n);
    }
    if (nevicted_p != NULL)
        *nevicted_p = a.nevicted;
    return KVT_OK;
}

kvt_status_t kvt_client_commit(kvt_client_t *c, const char *model, const char *lora,
                               const uint64_t *keys, size_t n, const uint32_t *lens, bool ok,
                               uint32_t *done_p)
{
    kvt_proto_wr_t req;
    kvt_proto_commit_t cm = {.ok = ok};
    cl_answer_t ans;

    if (c == NULL)
        return KVT_ERR_INVAL;
    c->err[0] = '\0';
    kvt_status_t st = tier_names(c, "commit", model, lora, &cm.model, &cm.lora);
    if (st == KVT_OK)
        st = tier_keys(c, "commit", keys, n);
    if (st != KVT_OK)
        return st;
    cm.n = (uint32_t)n;
    kvt_proto_wr_init(&req);
    st = kvt_proto_commit_req_encode(&req, 0, &cm, keys, lens);
    tier_flags(c, &req);
    if (st != KVT_OK)
        st = tier_encode_failed(c, "commit", st);
    else if ((st = kvt_cl_call(c, &req, false, &ans)) == KVT_OK)
        st = tier_count(c, &ans, done_p);
    kvt_proto_wr_cleanup(&req);
    return st;
}

kvt_status_t kvt_client_pin(kvt_client_t *c, const char *model, const char *lora,
                            const uint64_t *keys, size_t n, kvt_client_pinned_t *out)
{
    cl_answer_t ans;
    kvt_proto_pinned_t stack[CL_PIN_STACK], *pins = stack;
    uint32_t got;
    char why[128];

    if (c == NULL)
        return KVT_ERR_INVAL;
    if (out == NULL)
        return kvt_cl_fail(c, KVT_ERR_INVAL, "pin: NULL output");
    kvt_status_t st = tier_keys_call(c, KVT_PROTO_OP_PIN, "pin", model, lora, keys, n, false, &ans);
    if (st != KVT_OK)
        return st;
    if (n > CL_PIN_STACK && (pins = malloc(n * sizeof(*pins))) == NULL) {
        /* The pins are held now; the connection's end releases them. */
        kvt_cl_close(c);
        return kvt_cl_fail(c, KVT_ERR_NO_MEM, "pin: out of memory for %zu pins", n);
    }
    if (kvt_proto_pin_ans_decode(ans.body, ans.h.body_len, pins, (uint32_t)n, &got, why,
                                 sizeof(why)) != KVT_OK) {
        st = tier_bad_answer(c, why);
    } else if (got != n) {
        kvt_cl_close(c);
        st = kvt_cl_fail(c, KVT_ERR_PROTO, "pin: %u pins for %zu keys", got, n);
    } else {
        for (size_t i = 0; i < n; i++)
            out[i] = (kvt_client_pinned_t){pins[i].slot, pins[i].len};
    }
    if (pins != stack)
        free(pins);
    return st;
}

/* UNPIN and PREFETCH: a KEYS request answered with one count. */
static kvt_status_t tier_keys_count(kvt_client_t *c, uint8_t op, const char *what,
                                    const char *model, const char *lora, const uint64_t *keys,
                                    size_t n, bool idempotent, uint32_t *count_p)
{
    cl_answer_t ans;
    if (c == NULL)
        return KVT_ERR_INVAL;
    kvt_status_t st = tier_keys_call(c, op, what, model, lora, keys, n, idempotent, &ans);
    return st == KVT_OK ? tier_count(c, &ans, count_p) : st;
}

kvt_status_t kvt_client_unpin(kvt_client_t *c, const char *model, const char *lora,
                              const uint64_t *keys, size_t n, uint32_t *done_p)
{
    return tier_keys_count(c, KVT_PROTO_OP_UNPIN, "unpin", model, lora, keys, n, false, done_p);
}

kvt_status_t kvt_client_prefetch(kvt_client_t *c, const char *model, const char *lora,
                                 const uint64_t *keys, size_t n, uint32_t *started_p)
{
    return tier_keys_count(c, KVT_PROTO_OP_PREFETCH, "prefetch", model, lora, keys, n, true,
                           started_p);
}

/* ---- the block API -------------------------------------------------------------------------- */

kvt_status_t kvt_client_block_put(kvt_client_t *c, const char *model, const char *lora,
                                  uint64_t key, const void *data, size_t len, bool durable)
{
    kvt_proto_wr_t req;
    kvt_proto_block_put_t p = {.key = key, .durable = durable, .data = data};
    cl_answer_t ans;
    char why[128];

    if (c == NULL)
        return KVT_ERR_INVAL;
    c->err[0] = '\0';
    kvt_status_t st = tier_names(c, "block put", model, lora, &p.model, &p.lora);
    if (st != KVT_OK)
        return st;
    if (len == 0 || data == NULL)
        return kvt_cl_fail(c, KVT_ERR_INVAL, "block put: %s",
                           len == 0 ? "empty block" : "NULL data");
    if (len > KVT_PROTO_MAX_BODY_LIMIT)
        return kvt_cl_fail(c, KVT_ERR_TOO_BIG,
                           "block put: a block of %zu bytes is over the "
                           "protocol's %u",
                           len, KVT_PROTO_MAX_BODY_LIMIT);
    p.len = (uint32_t)len;
    kvt_proto_wr_init(&req);
    st = kvt_proto_block_put_req_encode(&req, 0, &p);
    tier_flags(c, &req);
    if (st != KVT_OK)
        st = tier_encode_failed(c, "block put", st);
    else if ((st = kvt_cl_call(c, &req, true, &ans)) == KVT_OK &&
             kvt_proto_empty_decode(KVT_PROTO_OP_BLOCK_PUT, ans.h.body_len, why, sizeof(why)) !=
                 KVT_OK)
        st = tier_bad_answer(c, why);
    kvt_proto_wr_cleanup(&req);
    return st;
}

/* BLOCK_GET or BLOCK_DELETE (@op, named @what) of @key: sends the KEY request; the answer in
 * *@ans. */
static kvt_status_t tier_key_call(kvt_client_t *c, uint8_t op, const char *what, const char *model,
                                  const char *lora, uint64_t key, bool idempotent, cl_answer_t *ans)
{
    kvt_proto_wr_t req;
    kvt_proto_block_key_t k = {.key = key};

    c->err[0] = '\0';
    kvt_status_t st = tier_names(c, what, model, lora, &k.model, &k.lora);
    if (st != KVT_OK)
        return st;
    kvt_proto_wr_init(&req);
    st = kvt_proto_block_key_req_encode(&req, op, 0, &k);
    tier_flags(c, &req);
    if (st != KVT_OK)
        st = tier_encode_failed(c, what, st);
    else
        st = kvt_cl_call(c, &req, idempotent, ans);
    kvt_proto_wr_cleanup(&req);
    return st;
}

kvt_status_t kvt_client_block_get(kvt_client_t *c, const char *model, const char *lora,
                                  uint64_t key, void *buf, size_t cap, size_t *len_p)
{
    cl_answer_t ans;
    char why[128];

    if (c == NULL)
        return KVT_ERR_INVAL;
    if (len_p == NULL || (buf == NULL && cap > 0))
        return kvt_cl_fail(c, KVT_ERR_INVAL, "block get: NULL output");
    kvt_status_t st =
        tier_key_call(c, KVT_PROTO_OP_BLOCK_GET, "block get", model, lora, key, true, &ans);
    if (st != KVT_OK)
        return st;
    if (kvt_proto_block_get_ans_decode(ans.body, ans.h.body_len, why, sizeof(why)) != KVT_OK)
        return tier_bad_answer(c, why);
    *len_p = ans.h.body_len; /* also on KVT_ERR_TOO_BIG (client.h) */
    if (ans.h.body_len > cap)
        return kvt_cl_fail(c, KVT_ERR_TOO_BIG, "block get: the block has %u bytes, the buffer %zu",
                           ans.h.body_len, cap);
    memcpy(buf, ans.body, ans.h.body_len);
    return KVT_OK;
}

kvt_status_t kvt_client_block_delete(kvt_client_t *c, const char *model, const char *lora,
                                     uint64_t key)
{
    cl_answer_t ans;
    char why[128];

    if (c == NULL)
        return KVT_ERR_INVAL;
    kvt_status_t st =
        tier_key_call(c, KVT_PROTO_OP_BLOCK_DELETE, "block delete", model, lora, key, false, &ans);
    if (st == KVT_OK && kvt_proto_empty_decode(KVT_PROTO_OP_BLOCK_DELETE, ans.h.body_len, why,
                                               sizeof(why)) != KVT_OK)
        st = tier_bad_answer(c, why);
    return st;
}
