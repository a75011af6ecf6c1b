/* server/xfer_pull.h: TRANSFER, pull, run by the xfer thread (xfer_pull.c). */
#ifndef KVT_SERVER_XFER_PULL_H
#define KVT_SERVER_XFER_PULL_H

#include "server/xfer_int.h"

/* Runs TRANSFER @job on the xfer thread and sets its answer (the caller posts it). */
void srv_xfer_pull_run(srv_xfer_t *xf, srv_job_t *job);

/* Closes the cached peers (xfer thread, before the UCX context goes). */
void srv_xfer_pull_cleanup(srv_xfer_t *xf);

#endif
