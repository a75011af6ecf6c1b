/*
 * common/fdpass.h: a descriptor beside a stream's bytes (SCM_RIGHTS over a
 * Unix socket): kvtierd hands engines and same-host peers its arena this way.
 */
#ifndef KVT_COMMON_FDPASS_H
#define KVT_COMMON_FDPASS_H

#include <stddef.h>
#include <sys/types.h>

/* sendmsg() of @len bytes at @buf (at least 1) with @fd beside them; returns as sendmsg(): a
 * short count still carried the descriptor, with the first byte. */
ssize_t kvt_fd_send(int sock, const void *buf, size_t len, int flags, int fd);

/* recvmsg() of up to @len bytes into @buf with @flags (plus MSG_CMSG_CLOEXEC); returns as
 * recvmsg(). A descriptor that came beside them is kept in *@fd_p when that is -1; any
 * other is closed at once, so none leaks whatever the sender sends. */
ssize_t kvt_fd_recv(int sock, void *buf, size_t len, int flags, int *fd_p);

#endif
