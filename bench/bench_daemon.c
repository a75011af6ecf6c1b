/*
 * bench/bench_daemon.c: what the daemon benches share: blocking loopback
 * sockets, one-shot HTTP requests, and a real kvtierd started on ephemeral
 * ports in a temp dir.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"

int kvt_bench_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {
        .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int one = 1;
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

int kvt_bench_write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

int kvt_bench_read_all(int fd, void *p, size_t n)
{
    char *c = p;
    while (n > 0) {
        ssize_t r = read(fd, c, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        c += r;
        n -= (size_t)r;
    }
    return 0;
}

int kvt_bench_http(uint16_t port, const char *method, const char *path, const char *body,
                   size_t len, char *out, size_t outcap)
{
    int fd = kvt_bench_connect(port);
    if (fd < 0)
        return -1;
    char head[256];
    int hl = snprintf(head, sizeof(head),
                      "%s %s HTTP/1.1\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", method,
                      path, len);
    int status = -1;
    char small[4096];
    char *buf = out != NULL && outcap > sizeof(small) ? out : small;
    size_t cap = buf == out ? outcap : sizeof(small);
    if (kvt_bench_write_all(fd, head, (size_t)hl) == 0 && kvt_bench_write_all(fd, body, len) == 0) {
        size_t n = 0; /* Connection: close, so the answer ends at EOF */
        ssize_t r;
        while (n < cap - 1 &&
               ((r = read(fd, buf + n, cap - 1 - n)) > 0 || (r < 0 && errno == EINTR)))
            n += r > 0 ? (size_t)r : 0;
        buf[n] = '\0';
        if (n > 12)
            status = atoi(buf + 9);
        if (out != NULL && outcap > 0) {
            const char *b = strstr(buf, "\r\n\r\n");
            b = b ? b + 4 : buf + n;
            if (buf != out)
                snprintf(out, outcap, "%s", b);
            else
                memmove(out, b, strlen(b) + 1);
        }
    }
    close(fd);
    return status;
}

const char *kvt_bench_default_kvtierd(void)
{
    static char path[4096];
    ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 16);
    if (n <= 0)
        return NULL;
    path[n] = '\0';
    char *slash = strrchr(path, '/');
    strcpy(slash ? slash + 1 : path, "kvtierd");
    return path;
}

int kvt_bench_daemon_start(const char *kvtierd, const char *const *args, kvt_bench_daemon_t *d)
{
    strcpy(d->dir, "/tmp/kvtier_bench.XXXXXX");
    if (mkdtemp(d->dir) == NULL)
        return -1;
    int pfd[2];
    if (pipe(pfd) != 0)
        return -1;
    char data[128];
    snprintf(data, sizeof(data), "%s/data", d->dir);
    const char *argv[64] = {kvtierd,        "--http-listen", "127.0.0.1:0",
                            "--rpc-listen", "127.0.0.1:0",   "--data-dir",
                            data,           "--log-level",   "warn"};
    size_t n = 9;
    for (size_t i = 0; args != NULL && args[i] != NULL && n < 63; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    d->pid = fork();
    if (d->pid == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]);
        execv(kvtierd, (char *const *)(uintptr_t)argv);
        _exit(127);
    }
    close(pfd[1]);
    char line[128];
    size_t got = 0;
    while (got < sizeof(line) - 1) {
        ssize_t r = read(pfd[0], line + got, 1);
        if (r <= 0 || line[got] == '\n')
            break;
        got++;
    }
    line[got] = '\0';
    close(pfd[0]);
    unsigned h = 0, r = 0;
    if (sscanf(line, "kvtierd listening http=%u rpc=%u", &h, &r) != 2) {
        fprintf(stderr, "kvtier-bench: %s did not start (got '%s')\n", kvtierd, line);
        return -1;
    }
    d->http = (uint16_t)h;
    d->rpc = (uint16_t)r;
    return 0;
}

void kvt_bench_daemon_stop(kvt_bench_daemon_t *d)
{
    if (d->pid > 0) {
        kill(d->pid, SIGTERM);
        waitpid(d->pid, NULL, 0);
        d->pid = 0;
    }
    if (d->dir[0] != '\0') {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", d->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "kvtier-bench: could not remove %s\n", d->dir);
        d->dir[0] = '\0';
    }
}
