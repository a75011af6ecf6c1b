/*
 * server/mailbox.h: how the threads of kvtierd hand each other work. A
 * mailbox is a mutex-guarded FIFO of jobs, plus a small ring of accepted
 * sockets, and a wake-up the owner's loop listens to:
 *
 * - the writer's inbox: workers post write jobs (events, engine adds and
 *   drops); the writer's poll wakes on an eventfd;
 * - each worker's box: the writer posts finished jobs back (the job names the
 *   box), and other workers post sockets they accepted for it (connections go
 *   round-robin); the worker's event loop wakes on a libevent event.
 *
 * Posting never calls into the owner: a handler gets its completion through
 * its own worker's box, never by calling up into the writer or srv.c.
 */
#ifndef KVT_SERVER_MAILBOX_H
#define KVT_SERVER_MAILBOX_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

struct srv_job;

#define SRV_MBOX_FDS 64u /* accepted sockets one box holds at most */

typedef struct srv_mbox {
    pthread_mutex_t mu;
    struct srv_job *head, *tail;
    size_t len;
    size_t cap;  /* jobs at most; 0: no limit */
    bool closed; /* set by srv_mbox_close(): posts are refused */
    struct {
        int fd;
        int proto;
    } fds[SRV_MBOX_FDS];
    uint32_t nfds;
    void (*wake)(void *arg); /* any thread; must not block */
    void *wake_arg;
} srv_mbox_t;

void srv_mbox_init(srv_mbox_t *mb, size_t cap, void (*wake)(void *), void *wake_arg);

/* Frees what is still queued: jobs with srv_job_free(), sockets closed. No poster may remain. */
void srv_mbox_cleanup(srv_mbox_t *mb);

/* Appends @job and wakes the owner; KVT_ERR_LIMIT when the box is full or closed (the job stays
 * the caller's). */
kvt_status_t srv_mbox_post(srv_mbox_t *mb, struct srv_job *job);

/* Appends accepted socket @fd (for front end @proto) and wakes the owner; false when the ring is
 * full or the box closed (the socket stays the caller's). */
bool srv_mbox_post_fd(srv_mbox_t *mb, int fd, int proto);

/*
 * Owner. Takes everything queued: returns the jobs (a list through ->next,
 * oldest first) and copies the sockets to @fds/@protos (SRV_MBOX_FDS room),
 * their count in *@nfds (@nfds NULL: none are taken). *@closed_p, when not
 * NULL, says whether the box was closed.
 */
struct srv_job *srv_mbox_take(srv_mbox_t *mb, int *fds, int *protos, uint32_t *nfds,
                              bool *closed_p);

/* Whether no job waits and the box is open (the owner may sleep). */
bool srv_mbox_idle(srv_mbox_t *mb);

/* Refuses further posts (what is queued stays to be taken) and wakes the owner. */
void srv_mbox_close(srv_mbox_t *mb);

#endif
