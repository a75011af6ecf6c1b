/* kvtier status codes: one type for every component. */
#ifndef KVT_COMMON_STATUS_H
#define KVT_COMMON_STATUS_H

/*
 * kvt_status_t: 0 is success, negative values are errors grouped by hundreds:
 * -1xx bad input, -2xx not found / exists, -3xx no space, -4xx I/O, -5xx peer,
 * -6xx internal. Foreign conventions (-errno, RocksDB errptr, ucs_status_t,
 * ZMQ errno) are converted at the edge of the component that calls them.
 */
typedef enum kvt_status {
    KVT_OK = 0,

    KVT_ERR_INVAL = -100,   /* invalid argument or malformed input */
    KVT_ERR_PARSE = -101,   /* input could not be parsed */
    KVT_ERR_RANGE = -102,   /* value out of range */
    KVT_ERR_TOO_BIG = -103, /* input larger than allowed */

    KVT_ERR_NOT_FOUND = -200, /* no such object */
    KVT_ERR_EXISTS = -201,    /* object already exists */

    KVT_ERR_NO_SPACE = -300, /* capacity or budget exhausted */
    KVT_ERR_NO_MEM = -301,   /* allocation failed */
    KVT_ERR_LIMIT = -302,    /* a configured limit was reached */

    KVT_ERR_IO = -400,      /* a syscall or device failed */
    KVT_ERR_TIMEOUT = -401, /* operation timed out */

    KVT_ERR_PEER = -500,   /* the remote side failed or misbehaved */
    KVT_ERR_PROTO = -501,  /* protocol violation */
    KVT_ERR_CLOSED = -502, /* connection closed */
    KVT_ERR_STALE = -503,  /* the peer restarted: what was learnt of it (an rkey) is stale */

    KVT_ERR_INTERNAL = -600,    /* broken invariant: a bug */
    KVT_ERR_UNSUPPORTED = -601, /* not supported here */
} kvt_status_t;

/* Returns a static lowercase description of @st; never NULL. */
const char *kvt_status_str(kvt_status_t st);

#endif
