/*
 * server/listen.c: the listening sockets: "host:port" addresses, the
 * loopback rule (--allow-remote), SO_REUSEPORT sockets per worker, and the
 * Unix socket (listen.h).
 */
#define KVT_LOG_COMPONENT "srv"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/hostport.h"
#include "common/log.h"
#include "server/listen.h"

/* SO_REUSEPORT lets every worker own a listening socket on the same port. */
#ifndef SO_REUSEPORT
#error "kvtierd needs SO_REUSEPORT (Linux >= 3.9)"
#endif

/* ---- addresses and listeners ---------------------------------------------- */

/* Parses "host:port" or "[v6]:port" into @ss. */
static kvt_status_t parse_addr(const char *text, struct sockaddr_storage *ss, socklen_t *len_p)
{
    char host[256], port[8];
    uint16_t pn;
    if (kvt_hostport_split(text, host, sizeof(host), &pn, true, NULL, 0) != KVT_OK)
        return KVT_ERR_INVAL;
    snprintf(port, sizeof(port), "%u", pn);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    if (getaddrinfo(host, port, &hints, &ai) != 0 || ai == NULL)
        return KVT_ERR_INVAL;
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    *len_p = ai->ai_addrlen;
    freeaddrinfo(ai);
    return KVT_OK;
}

static bool is_loopback(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *s = (const struct sockaddr_in *)(const void *)ss;
        return (ntohl(s->sin_addr.s_addr) >> 24) == 127;
    }
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)(const void *)ss;
        return IN6_IS_ADDR_LOOPBACK(&s->sin6_addr);
    }
    return false;
}

static int listen_tcp(const struct sockaddr_storage *ss, socklen_t len)
{
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int one = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0 ||
        bind(fd, (const struct sockaddr *)ss, len) != 0 || listen(fd, 1024) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

static uint16_t bound_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
        return 0;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)(void *)&ss)->sin_port);
    return ntohs(((struct sockaddr_in6 *)(void *)&ss)->sin6_port);
}

/* Opens @text's listener; with @port_p non-zero, binds that port instead (other workers). */
static int open_listener(kvt_srv_t *srv, const char *what, const char *text, uint16_t port)
{
    struct sockaddr_storage ss;
    socklen_t len;
    if (parse_addr(text, &ss, &len) != KVT_OK) {
        kvt_log_error("%s address '%s' is not host:port", what, text);
        return -2;
    }
    if (!is_loopback(&ss) && !srv->cfg.allow_remote) {
        kvt_log_error("%s address '%s' is not loopback: pass --allow-remote to bind it", what,
                      text);
        return -2;
    }
    if (port != 0) {
        if (ss.ss_family == AF_INET)
            ((struct sockaddr_in *)(void *)&ss)->sin_port = htons(port);
        else
            ((struct sockaddr_in6 *)(void *)&ss)->sin6_port = htons(port);
    }
    int fd = listen_tcp(&ss, len);
    if (fd < 0)
        kvt_log_error("cannot listen on %s %s: %s", what, text, strerror(errno));
    return fd;
}

/*
 * Whether @path may be bound: nothing there, or a socket nobody listens on (left
 * by a kvtierd that was killed), which is removed. A socket another process
 * serves, or anything that is not a socket, is refused and left as it is: an
 * unconditional unlink took a running kvtierd's socket from its engine (a second
 * kvtierd started on the same --rpc-unix), or removed whatever file the flag
 * named by mistake. (A process that binds between the probe and the unlink
 * still loses its socket; two kvtierd starting at once are not guarded.)
 */
static bool unix_path_free(const char *path, const struct sockaddr_un *sa)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return true;
        kvt_log_error("unix socket %s: %s", path, strerror(errno));
        return false;
    }
    if (!S_ISSOCK(st.st_mode)) {
        kvt_log_error("unix socket %s: the path exists and is not a socket; refusing to remove it",
                      path);
        return false;
    }
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (probe < 0) {
        kvt_log_error("unix socket %s: socket: %s", path, strerror(errno));
        return false;
    }
    int rc = connect(probe, (const struct sockaddr *)sa, sizeof(*sa));
    int e = errno;
    close(probe);
    if (rc == 0 || e == EAGAIN || e == EINPROGRESS) {
        kvt_log_error("unix socket %s is in use by another process (another kvtierd?)", path);
        return false;
    }
    if (e == ECONNREFUSED && unlink(path) != 0 && errno != ENOENT) {
        kvt_log_error("unix socket %s: removing the stale socket: %s", path, strerror(errno));
        return false;
    }
    if (e != ECONNREFUSED && e != ENOENT) {
        kvt_log_error("unix socket %s: %s", path, strerror(e));
        return false;
    }
    return true;
}

static int listen_unix(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path)) {
        kvt_log_error("unix socket path too long: %s", path);
        return -2;
    }
    strcpy(sa.sun_path, path);
    if (!unix_path_free(path, &sa))
        return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 1024) != 0) {
        kvt_log_error("cannot listen on unix socket %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    chmod(path, 0600); /* only this user may talk to the daemon */
    return fd;
}

int srv_listener_fd(kvt_srv_worker_t *w, int which)
{
    kvt_srv_t *srv = w->srv;
    if (which == PROTO_HTTP) {
        if (srv->fd_http < 0)
            return -1;
        if (w->id == 0)
            return srv->fd_http;
        return open_listener(srv, "http", srv->cfg.http_listen, srv->http_port);
    }
    if (which == PROTO_RPC) {
        if (srv->fd_rpc < 0)
            return -1;
        if (w->id == 0)
            return srv->fd_rpc;
        return open_listener(srv, "rpc", srv->cfg.rpc_listen, srv->rpc_port);
    }
    return w->id == 0 ? srv->fd_unix : -1;
}

kvt_status_t srv_listen_first(kvt_srv_t *srv)
{
    /* the first listeners fix the ports; other workers bind the same ones */
    if (srv->cfg.http_listen[0]) {
        srv->fd_http = open_listener(srv, "http", srv->cfg.http_listen, 0);
        if (srv->fd_http < 0)
            return srv->fd_http == -2 ? KVT_ERR_INVAL : KVT_ERR_IO;
        srv->http_port = bound_port(srv->fd_http);
    }
    if (srv->cfg.rpc_listen[0]) {
        srv->fd_rpc = open_listener(srv, "rpc", srv->cfg.rpc_listen, 0);
        if (srv->fd_rpc < 0)
            return srv->fd_rpc == -2 ? KVT_ERR_INVAL : KVT_ERR_IO;
        srv->rpc_port = bound_port(srv->fd_rpc);
    }
    if (srv->cfg.rpc_unix[0]) {
        srv->fd_unix = listen_unix(srv->cfg.rpc_unix);
        if (srv->fd_unix < 0)
            return srv->fd_unix == -2 ? KVT_ERR_INVAL : KVT_ERR_IO;
    }
    return KVT_OK;
}
