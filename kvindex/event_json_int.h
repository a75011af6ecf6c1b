/*
 * kvindex/event_json_int.h: what the JSON events decoder's files share:
 * event_json.c (the batch, its events and their fields) and event_json_keys.c
 * (vLLM's extra_keys, hashed to block seeds). Private to kvindex.
 */
#ifndef KVT_KVINDEX_EVENT_JSON_INT_H
#define KVT_KVINDEX_EVENT_JSON_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/json.h"
#include "kvindex/event.h"

typedef struct kvt_evj_extra {
    size_t from, to;  /* its text, [from, to) */
    size_t idx;       /* the event's index in "events", for messages */
    bool has_lora_id; /* the event's "lora_id" is an unsigned integer: ... */
    uint64_t lora_id; /* ... this one, which may lead the entries as older vLLM's LoRA key */
} kvt_evj_extra_t;

typedef struct kvt_evj {
    kvt_json_t j;
    char *arena;
    kvt_event_t *ev;        /* ev_cap slots at the start of the arena */
    kvt_evj_extra_t *extra; /* ev_cap slots after them: ev[i]'s extra keys */
    size_t ev_cap;
    size_t nev;
    size_t bump;     /* next free byte of the arena */
    size_t bump_end; /* end of the arena */
    size_t items;    /* hashes and tokens so far */
    size_t max_items;
    size_t unknown;
    size_t idx; /* index of the event being decoded, for messages */
    char *err;
    size_t errlen;
} kvt_evj_t;

/* Writes a one-line reason to the decoder's error buffer and returns @st. Error path only. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
kvt_status_t
kvt_evj_fail(kvt_evj_t *d, kvt_status_t st, const char *fmt, ...);

/* Like kvt_evj_fail(), naming the event being decoded ("events[<idx>]: ..."). */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
kvt_status_t
kvt_evj_ev_fail(kvt_evj_t *d, kvt_status_t st, const char *fmt, ...);

/* Aligns the arena's bump pointer to @align; returns the room left in units of @align. */
size_t kvt_evj_align(kvt_evj_t *d, size_t align);

/*
 * vLLM's "extra_keys" (one entry per block: null or an array of the block's
 * extra hash keys) of event @ev, read once the whole body is (the event's
 * lora_name and parent may follow them in the event, the batch's lora_name
 * may follow "events") from the text span x->from .. x->to of the body: the
 * LoRA leading an entry (the event's lora_name, else the batch's
 * @batch_lora; or its lora_id) is skipped, a lone string left on a chain's
 * first block is the cache salt (unless "cache_salt" gave one), anything
 * else becomes the block's extra seed, hashed in the canonical form the
 * msgpack decoder uses too (event_keys_int.h). Strings are decoded in the
 * arena's free part, past the seeds.
 */
kvt_status_t kvt_evj_extras(kvt_evj_t *d, const kvt_evj_extra_t *xs, kvt_event_t *ev,
                            const char *batch_lora);

#endif
