/* server/listen.h: kvtierd's listening sockets (listen.c). */
#ifndef KVT_SERVER_LISTEN_H
#define KVT_SERVER_LISTEN_H

#include "server/srv_int.h"

/*
 * Opens the first listener of each front end (--http-listen, --rpc-listen,
 * --rpc-unix): it fixes the ports, which the other workers then bind too.
 * KVT_ERR_INVAL for a bad or non-loopback address (without --allow-remote),
 * KVT_ERR_IO when a socket cannot be bound; the reason is logged.
 */
kvt_status_t srv_listen_first(kvt_srv_t *srv);

/* The listening socket of @which (enum srv_proto, or NPROTOS for the Unix one) for worker @w:
 * worker 0 takes the first one, the others bind their own (SO_REUSEPORT); -1 when none. */
int srv_listener_fd(kvt_srv_worker_t *w, int which);

#endif
