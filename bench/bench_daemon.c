/*
 * bench/bench_daemon.c: what the daemon benches share: blocking loopback
 * sockets, one-shot HTTP requests, a real kvtierd started on ephemeral ports
 * in a temp dir, the router workload (prompts, where their blocks live, the
 * QUERY frames) and CPU readings from /proc.
 */
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "kvtier/client.h"
#include "proto/proto.h"

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
    char sock[128];
    if (d->unix_sock) {
        snprintf(sock, sizeof(sock), "%s/rpc.sock", d->dir);
        argv[n++] = "--rpc-unix";
        argv[n++] = sock;
    }
    for (size_t i = 0; args != NULL && args[i] != NULL && n < 63; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    d->pid = fork();
    if (d->pid == 0) {
        /* a bench that dies (or stopped the daemon with SIGSTOP) leaves nothing behind */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
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
        kill(d->pid, SIGCONT); /* a stopped daemon only sees SIGTERM once it runs again */
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

/* ---- the router workload ------------------------------------------------------------------ */

void kvt_bench_prompt(uint32_t i, uint32_t n, uint32_t *out)
{
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (uint32_t t = 0; t < n; t++) {
        if (t == 256)
            x = 0x12345678ull + i * 0x9e3779b97f4a7c15ull;
        out[t] = (uint32_t)(kvt_bench_rand(&x) % 128000u);
    }
}

uint32_t kvt_bench_holder(uint32_t pods, uint32_t tokens, uint32_t i, uint32_t copy,
                          uint32_t *blocks_p)
{
    uint32_t nb = tokens / 16;
    *blocks_p = copy ? nb / 2 : nb;
    return (i + copy) % pods;
}

uint64_t kvt_bench_ehash(uint32_t i, uint32_t b)
{
    return (uint64_t)i * 4096 + b + 1;
}

int kvt_bench_load(uint16_t http_port, uint32_t pods, uint32_t prompts, uint32_t tokens,
                   uint32_t *tok)
{
    size_t cap = (size_t)tokens * 12 + 4096;
    char *body = malloc(cap);
    if (body == NULL)
        return -1;
    for (uint32_t i = 0; i < prompts; i++) {
        kvt_bench_prompt(i, tokens, tok);
        for (uint32_t copy = 0; copy < 2; copy++) {
            uint32_t blocks, pod = kvt_bench_holder(pods, tokens, i, copy, &blocks);
            size_t n = (size_t)snprintf(body, cap,
                                        "{\"pod\":\"pod-%u\",\"model\":\"bench\",\"events\":[{"
                                        "\"type\":\"BlockStored\",\"block_size\":16,"
                                        "\"block_hashes\":[",
                                        pod);
            for (uint32_t b = 0; b < blocks; b++)
                n += (size_t)snprintf(body + n, cap - n, "%s%" PRIu64, b ? "," : "",
                                      kvt_bench_ehash(i, b));
            n += (size_t)snprintf(body + n, cap - n, "],\"token_ids\":[");
            for (uint32_t t = 0; t < blocks * 16; t++)
                n += (size_t)snprintf(body + n, cap - n, "%s%u", t ? "," : "", tok[t]);
            n += (size_t)snprintf(body + n, cap - n, "]}]}");
            int st = kvt_bench_http(http_port, "POST", "/v1/events", body, n, NULL, 0);
            if (st != 200) {
                fprintf(stderr, "kvtier-bench: loading events failed (HTTP %d)\n", st);
                free(body);
                return -1;
            }
        }
    }
    free(body);
    return 0;
}

uint8_t *kvt_bench_query_frame(uint32_t i, uint32_t tokens, uint32_t *tok, size_t *len_p)
{
    kvt_bench_prompt(i, tokens, tok);
    kvt_proto_wr_t w;
    kvt_proto_wr_init(&w);
    kvt_proto_query_req_t q = {
        .model = {"bench", 5}, .kind = KVT_PROTO_Q_TOKENS, .n = tokens, .tokens = tok};
    if (kvt_proto_query_req_encode(&w, 0, &q) != KVT_OK) {
        kvt_proto_wr_cleanup(&w);
        return NULL;
    }
    *len_p = w.len;
    return w.buf;
}

/* ---- CPU readings ---------------------------------------------------------------------------- */

double kvt_bench_proc_cpu(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long ut = 0, st = 0;
    if (p == NULL ||
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

bool kvt_bench_steal(uint64_t *steal_p, uint64_t *total_p)
{
    FILE *f = fopen("/proc/stat", "r");
    if (f == NULL)
        return false;
    unsigned long long v[8] = {0};
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (n != 8)
        return false;
    *steal_p = v[7];
    *total_p = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
    return true;
}

kvt_client_t *kvt_bench_client(const char *addr, uint32_t io_timeout_ms)
{
    char err[256] = "";
    kvt_client_opts_t o;
    kvt_client_opts_default(&o);
    o.address = addr;
    o.io_timeout_ms = io_timeout_ms;
    kvt_client_t *c = NULL;
    if (kvt_client_create_msg(&o, &c, err, sizeof(err)) != KVT_OK) {
        fprintf(stderr, "kvtier-bench: kvtierd at %s: %s\n", addr, err);
        return NULL;
    }
    return c;
}
