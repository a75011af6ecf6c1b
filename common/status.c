#include "status.h"

const char *kvt_status_str(kvt_status_t st)
{
    switch (st) {
    case KVT_OK: return "ok";
    case KVT_ERR_INVAL: return "invalid argument";
    case KVT_ERR_PARSE: return "parse error";
    case KVT_ERR_RANGE: return "value out of range";
    case KVT_ERR_TOO_BIG: return "input too large";
    case KVT_ERR_NOT_FOUND: return "not found";
    case KVT_ERR_EXISTS: return "already exists";
    case KVT_ERR_NO_SPACE: return "no space";
    case KVT_ERR_NO_MEM: return "out of memory";
    case KVT_ERR_LIMIT: return "limit reached";
    case KVT_ERR_IO: return "i/o error";
    case KVT_ERR_TIMEOUT: return "timed out";
    case KVT_ERR_PEER: return "peer error";
    case KVT_ERR_PROTO: return "protocol error";
    case KVT_ERR_CLOSED: return "connection closed";
    case KVT_ERR_STALE: return "peer restarted";
    case KVT_ERR_INTERNAL: return "internal error";
    case KVT_ERR_UNSUPPORTED: return "not supported";
    }
    return "unknown status";
}
