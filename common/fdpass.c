/* common/fdpass.c: see fdpass.h. */
#include "common/fdpass.h"

#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Room for a few descriptors: a sender that passes more than one gets them closed, not
 * truncated silently (MSG_CTRUNC would drop them unseen, still open in no one's hands). */
#define FDPASS_MAX 4

typedef union {
    char buf[CMSG_SPACE(sizeof(int) * FDPASS_MAX)];
    struct cmsghdr align;
} fdpass_cmsg_t;

ssize_t kvt_fd_send(int sock, const void *buf, size_t len, int flags, int fd)
{
    fdpass_cmsg_t u;
    memset(&u, 0, sizeof(u));
    struct iovec iov = {(void *)(uintptr_t)buf, len};
    struct msghdr m = {.msg_iov = &iov,
                       .msg_iovlen = 1,
                       .msg_control = u.buf,
                       .msg_controllen = CMSG_SPACE(sizeof(int))};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    return sendmsg(sock, &m, flags);
}

ssize_t kvt_fd_recv(int sock, void *buf, size_t len, int flags, int *fd_p)
{
    fdpass_cmsg_t u;
    struct iovec iov = {buf, len};
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
    ssize_t n = recvmsg(sock, &m, flags | MSG_CMSG_CLOEXEC);
    if (n < 0)
        return n;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm != NULL; cm = CMSG_NXTHDR(&m, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        size_t nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nfd; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(fd));
            if (*fd_p < 0)
                *fd_p = fd;
            else
                close(fd);
        }
    }
    return n;
}
