/* server/mailbox.c: job and socket hand-over between kvtierd's threads (mailbox.h). */
#include "server/mailbox.h"
#include "server/blocks.h"
#include "server/xfer.h"

#include <stdlib.h>
#include <unistd.h>

#include "server/srv_int.h"

void srv_job_free(srv_job_t *job)
{
    if (job == NULL)
        return;
    kvt_evbatch_cleanup(&job->batch);
    kvt_jbuf_cleanup(&job->answer);
    free(job->engine);
    free(job->routed);
    srv_tier_call_free(job->tc);
    srv_xfer_call_free(job->xc);
    free(job);
}

void srv_mbox_init(srv_mbox_t *mb, size_t cap, void (*wake)(void *), void *wake_arg)
{
    pthread_mutex_init(&mb->mu, NULL);
    mb->head = mb->tail = NULL;
    mb->len = 0;
    mb->cap = cap;
    mb->closed = false;
    mb->nfds = 0;
    mb->wake = wake;
    mb->wake_arg = wake_arg;
}

void srv_mbox_cleanup(srv_mbox_t *mb)
{
    srv_job_t *j = mb->head;
    while (j != NULL) {
        srv_job_t *n = j->next;
        srv_job_free(j);
        j = n;
    }
    mb->head = mb->tail = NULL;
    mb->len = 0;
    for (uint32_t i = 0; i < mb->nfds; i++)
        close(mb->fds[i].fd); /* passed here after the owner stopped */
    mb->nfds = 0;
    pthread_mutex_destroy(&mb->mu);
}

kvt_status_t srv_mbox_post(srv_mbox_t *mb, srv_job_t *job)
{
    pthread_mutex_lock(&mb->mu);
    if (mb->closed || (mb->cap > 0 && mb->len >= mb->cap)) {
        pthread_mutex_unlock(&mb->mu);
        return KVT_ERR_LIMIT;
    }
    job->next = NULL;
    if (mb->tail)
        mb->tail->next = job;
    else
        mb->head = job;
    mb->tail = job;
    mb->len++;
    pthread_mutex_unlock(&mb->mu);
    mb->wake(mb->wake_arg);
    return KVT_OK;
}

bool srv_mbox_post_fd(srv_mbox_t *mb, int fd, int proto)
{
    pthread_mutex_lock(&mb->mu);
    bool ok = !mb->closed && mb->nfds < SRV_MBOX_FDS;
    if (ok) {
        mb->fds[mb->nfds].fd = fd;
        mb->fds[mb->nfds].proto = proto;
        mb->nfds++;
    }
    pthread_mutex_unlock(&mb->mu);
    if (ok)
        mb->wake(mb->wake_arg);
    return ok;
}

srv_job_t *srv_mbox_take(srv_mbox_t *mb, int *fds, int *protos, uint32_t *nfds, bool *closed_p)
{
    pthread_mutex_lock(&mb->mu);
    srv_job_t *jobs = mb->head;
    mb->head = mb->tail = NULL;
    mb->len = 0;
    if (nfds != NULL) {
        *nfds = mb->nfds;
        for (uint32_t i = 0; i < mb->nfds; i++) {
            fds[i] = mb->fds[i].fd;
            protos[i] = mb->fds[i].proto;
        }
        mb->nfds = 0;
    }
    if (closed_p != NULL)
        *closed_p = mb->closed;
    pthread_mutex_unlock(&mb->mu);
    return jobs;
}

bool srv_mbox_idle(srv_mbox_t *mb)
{
    pthread_mutex_lock(&mb->mu);
    bool idle = mb->head == NULL && !mb->closed;
    pthread_mutex_unlock(&mb->mu);
    return idle;
}

void srv_mbox_close(srv_mbox_t *mb)
{
    pthread_mutex_lock(&mb->mu);
    mb->closed = true;
    pthread_mutex_unlock(&mb->mu);
    mb->wake(mb->wake_arg);
}
