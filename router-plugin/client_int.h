/*
 * router-plugin/client_int.h: what the files of libkvtier share: the client
 * struct and the helpers one file defines and the others call. client.c:
 * errors, address, connection, buffered I/O, results; client_call.c: blocking
 * calls; client_tier.c: the tier calls (ATTACH, the data plane, the block
 * API); client_async.c: submitted queries and progress; client_fanout.c:
 * one query over several sidecars. Private to the library (the kvt_cl_
 * names are hidden in libkvtier.so by its version script).
 */
#ifndef KVT_ROUTER_CLIENT_INT_H
#define KVT_ROUTER_CLIENT_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/un.h>

#include "kvtier/client.h"
#include "proto/proto.h"

#ifndef KVT_VERSION
#define KVT_VERSION "0.1.0"
#endif

#define CL_DEFAULT_TIMEOUT_MS 1000
#define CL_READ_CHUNK 65536u
#define CL_ERR_SIZE 512

/* A submitted query: waiting for its answer (st KVT_OK) or failed, to be reported. */
typedef struct cl_flight {
    uint64_t id;
    kvt_status_t st;
} cl_flight_t;

/*
 * What one query sends, as the public calls take it (all borrowed): every
 * query variant (sync, submit, fan-out; tokens, keys, salted) goes through
 * kvt_cl_build_query() with one of these.
 */
typedef struct cl_q {
    const char *model, *lora; /* lora NULL or "": the base model */
    const char *salt;         /* token queries: the cache salt; NULL or "": none (kind 0) */
    uint8_t kind;             /* KVT_PROTO_Q_TOKENS or KVT_PROTO_Q_KEYS */
    const void *vals;         /* n u32 tokens or n u64 keys */
    size_t n;
    const char *const *pods; /* filter; NULL/0: every pod */
    size_t npods;
} cl_q_t;

struct kvt_client {
    bool is_unix;
    char host[256]; /* TCP: host name or address literal (no brackets) */
    char port[8];
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char addr[300]; /* as given, for messages */
    int connect_ms, io_ms;
    char token[KVT_PROTO_MAX_STR + 1];
    uint16_t token_len;

    int fd;             /* -1: not connected */
    uint64_t nconnects; /* connections made (HELLO answered) */
    uint32_t max_body; /* the server's request limit, from HELLO */
    uint64_t next_id;

    kvt_proto_wr_t out; /* bytes not yet written */
    uint8_t *in;        /* bytes read: [in_off, in_len) not parsed yet */
    size_t in_off, in_len, in_cap;

    /* An ATTACH in flight: reads use recvmsg() and keep the first descriptor that comes with
     * the bytes (SCM_RIGHTS) in pass_fd, -1 until one does; closed with the connection. */
    bool want_fd;
    int pass_fd;

    bool engine_keys; /* tier calls carry KVT_PROTO_F_ENGINE_KEYS */

    cl_flight_t *fl; /* submitted queries */
    size_t nfl, fl_cap;

    kvt_client_result_t cbres; /* handed to callbacks */
    size_t cbcap;

    char err[CL_ERR_SIZE];
};

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
/* Sets the client's last error ("<addr>: <message>", one line) and returns @st. */
kvt_status_t
kvt_cl_fail(kvt_client_t *c, kvt_status_t st, const char *fmt, ...);

/* Forgets the connection and every buffered byte (in-flight entries are the caller's). */
void kvt_cl_close(kvt_client_t *c);

/* Milliseconds left until @deadline (a kvt_clock_ms() value), at least 0. */
int kvt_cl_left(uint64_t deadline);

/* Connects and says HELLO, everything within the connect timeout (and @limit, when not 0). */
kvt_status_t kvt_cl_connect(kvt_client_t *c, uint64_t limit);

/*
 * False when an idle connection is known to be dead (the server closed it or
 * it failed), so that a call does not learn it the hard way. Only meaningful
 * with nothing in flight: then any byte waiting is stale.
 */
bool kvt_cl_alive(kvt_client_t *c);

/* Writes c->out; with @block waits up to @deadline, else returns once the socket is full. */
kvt_status_t kvt_cl_flush(kvt_client_t *c, uint64_t deadline, bool block);

/*
 * Reads what the socket has into c->in; with @block waits for at least one
 * byte until @deadline. Without @block, KVT_OK may mean nothing arrived.
 */
kvt_status_t kvt_cl_read(kvt_client_t *c, uint64_t deadline, bool block);

/*
 * Takes the next whole answer frame out of c->in: *@got_p says whether there
 * was one; *@body_p points into c->in and stays valid until the next kvt_cl_read.
 * A header that breaks the protocol is KVT_ERR_PROTO (the stream is lost).
 */
kvt_status_t kvt_cl_next_frame(kvt_client_t *c, bool *got_p, kvt_proto_hdr_t *h_p,
                               const uint8_t **body_p);

/* An answer to a blocking call: the frame stays in c->in until the next read. */
typedef struct cl_answer {
    kvt_proto_hdr_t h;
    const uint8_t *body;
} cl_answer_t;

/*
 * Sends the frame @req (req_id patched in) and waits for its answer, within
 * the io timeout. Retries once on a fresh connection when @idempotent and a
 * reused connection broke. On KVT_OK *@ans holds a non-error answer of the
 * request's opcode; an error answer returns the server's status (connection
 * kept); any other failure closes the connection.
 */
kvt_status_t kvt_cl_call(kvt_client_t *c, kvt_proto_wr_t *req, bool idempotent, cl_answer_t *ans);

/* Turns an error answer into its status and message. A malformed one is a protocol error. */
kvt_status_t kvt_cl_error_answer(kvt_client_t *c, const kvt_proto_hdr_t *h, const uint8_t *body);

/*
 * Decodes a QUERY answer into @r, whose pods array has room for *@cap entries
 * (grown with realloc as needed). KVT_OK, KVT_ERR_PROTO, KVT_ERR_NO_MEM.
 */
kvt_status_t kvt_cl_decode_result(kvt_client_t *c, const uint8_t *body, uint32_t len,
                                  kvt_client_result_t *r, size_t *cap);

/* Builds the QUERY request frame of @q into @w (the blocking calls patch req_id in later). */
kvt_status_t kvt_cl_build_query(kvt_client_t *c, kvt_proto_wr_t *w, uint64_t req_id,
                                const cl_q_t *q);

/* Queues @q on @c (connecting first, within @limit when not 0) and writes what the socket takes. */
kvt_status_t kvt_cl_submit(kvt_client_t *c, const cl_q_t *q, uint64_t limit, uint64_t *req_id_p);

#endif
