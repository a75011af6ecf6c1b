/*
 * common/ipcdir.c: ipc:// bind paths confined to kvtierd's own directory.
 * The contract is in ipcdir.h.
 */
#include "common/ipcdir.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/errtext.h"

#define IPC_PREFIX "ipc://"
#define IPC_PREFIX_LEN 6
#define IPC_NAME_MAX 64

/* Refuses with a reason: every caller has (err, errlen) in scope. */
#define IPC_FAIL(...)                                                                              \
    do {                                                                                           \
        kvt_errf(err, errlen, __VA_ARGS__);                                                        \
        return KVT_ERR_INVAL;                                                                      \
    } while (0)

bool kvt_ipcdir_is_ipc(const char *endpoint)
{
    return strncmp(endpoint, IPC_PREFIX, IPC_PREFIX_LEN) == 0;
}

kvt_status_t kvt_ipcdir_open(const char *path, char *out, size_t cap, char *err, size_t errlen)
{
    char buf[PATH_MAX];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(buf))
        IPC_FAIL("ipc dir '%s': empty or too long", path);
    memcpy(buf, path, n + 1);
    /* parents as the data dir gets them; the directory itself is private */
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0750) != 0 && errno != EEXIST) {
            kvt_errf(err, errlen, "ipc dir: cannot create %s: %s", buf, strerror(errno));
            return KVT_ERR_IO;
        }
        *p = '/';
    }
    if (mkdir(buf, 0700) != 0 && errno != EEXIST) {
        kvt_errf(err, errlen, "ipc dir: cannot create %s: %s", buf, strerror(errno));
        return KVT_ERR_IO;
    }
    char real[PATH_MAX];
    struct stat st;
    if (realpath(buf, real) == NULL || stat(real, &st) != 0) {
        kvt_errf(err, errlen, "ipc dir %s: %s", buf, strerror(errno));
        return KVT_ERR_IO;
    }
    if (!S_ISDIR(st.st_mode))
        IPC_FAIL("ipc dir %s is not a directory", real);
    if (st.st_uid != geteuid())
        IPC_FAIL("ipc dir %s belongs to another user", real);
    /* mkdir above made it 0700; one that was there already is not ours to change */
    if ((st.st_mode & 077) != 0)
        IPC_FAIL("ipc dir %s is open to other users (mode %03o): give a private directory "
                 "(chmod 0700) or one kvtierd may create",
                 real, (unsigned)(st.st_mode & 0777));
    if (strlen(real) + 1 > cap || strlen(real) + 2 > KVT_IPCDIR_MAX_PATH) {
        kvt_errf(err, errlen, "ipc dir %s: path too long for Unix sockets", real);
        return KVT_ERR_RANGE;
    }
    memcpy(out, real, strlen(real) + 1);
    return KVT_OK;
}

/* A socket name inside the directory: 1..64 bytes of [A-Za-z0-9._-], not "." or "..". */
static bool ipc_name_ok(const char *s, size_t n)
{
    if (n == 0 || n > IPC_NAME_MAX || (n == 1 && s[0] == '.') ||
        (n == 2 && s[0] == '.' && s[1] == '.'))
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}

kvt_status_t kvt_ipcdir_bind_endpoint(const char *dir, const char *endpoint, char *out, size_t cap,
                                      char *err, size_t errlen)
{
    if (!kvt_ipcdir_is_ipc(endpoint))
        IPC_FAIL("%s is not an ipc:// endpoint", endpoint);
    if (dir == NULL || dir[0] == '\0')
        IPC_FAIL("binding %s: kvtierd has no usable --ipc-dir for ipc binds (see its log)",
                 endpoint);
    const char *path = endpoint + IPC_PREFIX_LEN;
    const char *name = path;
    if (path[0] == '/') {
        /* an absolute path: its directory, symlinks resolved, must be the ipc dir itself */
        const char *slash = strrchr(path, '/');
        name = slash + 1;
        char parent[PATH_MAX], real[PATH_MAX];
        size_t pl = (size_t)(slash - path);
        if (strstr(path, "/../") != NULL || strstr(path, "/./") != NULL ||
            strstr(path, "//") != NULL || pl >= sizeof(parent))
            IPC_FAIL("binding %s: the path must be plain (no '.', '..' or '//')", endpoint);
        memcpy(parent, path, pl);
        parent[pl] = '\0';
        if (pl == 0 || realpath(parent, real) == NULL || strcmp(real, dir) != 0)
            IPC_FAIL("binding %s: ipc sockets kvtierd binds must be in its ipc dir %s "
                     "(or give a plain name: ipc://<name>)",
                     endpoint, dir);
    } else if (strchr(path, '/') != NULL) {
        IPC_FAIL("binding %s: a relative ipc name is a plain name in kvtierd's ipc dir "
                 "(no '/')",
                 endpoint);
    }
    if (!ipc_name_ok(name, strlen(name)))
        IPC_FAIL("binding %s: the socket name must be 1..%d bytes of letters, digits, "
                 "'.', '_' or '-' (not '.' or '..')",
                 endpoint, IPC_NAME_MAX);
    char res[IPC_PREFIX_LEN + PATH_MAX + IPC_NAME_MAX + 2];
    int n = snprintf(res, sizeof(res), IPC_PREFIX "%s/%s", dir, name);
    if (n < 0 || (size_t)n - IPC_PREFIX_LEN > KVT_IPCDIR_MAX_PATH)
        IPC_FAIL("binding %s: %s/%s is too long for a Unix socket", endpoint, dir, name);
    if ((size_t)n + 1 > cap)
        IPC_FAIL("binding %s: the resolved endpoint is too long", endpoint);
    memcpy(out, res, (size_t)n + 1);
    return KVT_OK;
}

kvt_status_t kvt_ipcdir_check_free(const char *endpoint, char *err, size_t errlen)
{
    const char *path = endpoint + IPC_PREFIX_LEN;
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return KVT_OK;
        IPC_FAIL("binding %s: %s", endpoint, strerror(errno));
    }
    if (!S_ISSOCK(st.st_mode))
        IPC_FAIL("binding %s: the path exists and is not a socket", endpoint);
    if (st.st_uid != geteuid())
        IPC_FAIL("binding %s: the socket there belongs to another user", endpoint);
    /* a socket someone listens on is in use; a dead one is left over from a crash */
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path))
        IPC_FAIL("binding %s: path too long for a Unix socket", endpoint);
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        IPC_FAIL("binding %s: socket: %s", endpoint, strerror(errno));
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    int e = errno;
    close(fd);
    /* only a refused connection proves nobody listens (a full backlog says EAGAIN, a live
     * socket of another type EPROTOTYPE) */
    if (rc == 0 || e == EAGAIN || e == EINPROGRESS)
        IPC_FAIL("binding %s: the socket is in use by another listener", endpoint);
    if (e != ECONNREFUSED)
        IPC_FAIL("binding %s: cannot tell whether the socket there is in use: %s", endpoint,
                 strerror(e));
    return KVT_OK;
}

void kvt_ipcdir_release(const char *endpoint)
{
    if (!kvt_ipcdir_is_ipc(endpoint))
        return;
    const char *path = endpoint + IPC_PREFIX_LEN;
    struct stat st;
    if (path[0] == '/' && lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
        unlink(path);
}
