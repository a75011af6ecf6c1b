/* server/xfer_pull.h: TRANSFER, run by the xfer thread (xfer_pull.c, xfer_push.c). */
#ifndef KVT_SERVER_XFER_PULL_H
#define KVT_SERVER_XFER_PULL_H

#include "server/xfer_int.h"

/* Runs TRANSFER @job on the xfer thread and sets its answer (the caller posts it). */
void srv_xfer_pull_run(srv_xfer_t *xf, srv_job_t *job);

#endif
