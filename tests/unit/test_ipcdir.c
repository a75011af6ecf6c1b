/*
 * common/ipcdir: where kvtierd may bind ipc:// sockets. Real files in a temp
 * directory: the directory is made 0700 (and tightened), bind endpoints
 * resolve inside it or are refused (outside paths, '..', symlinked
 * directories, bad names, paths too long for a Unix socket), an existing path
 * is bound over only when it is a dead socket of this user, and release
 * removes sockets only.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/ipcdir.h"

static char g_tmp[128];                     /* the test's scratch directory */
static char g_dir[KVT_IPCDIR_MAX_PATH + 1]; /* the ipc dir inside it, canonical */

static int setup(void **state)
{
    (void)state;
    snprintf(g_tmp, sizeof(g_tmp), "/tmp/kvt_ipcdir_XXXXXX");
    if (mkdtemp(g_tmp) == NULL)
        return -1;
    char path[256], err[256];
    snprintf(path, sizeof(path), "%s/data/ipc", g_tmp);
    return kvt_ipcdir_open(path, g_dir, sizeof(g_dir), err, sizeof(err)) == KVT_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_file(const char *path)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("precious\n", f);
    fclose(f);
}

/* A Unix socket at @path; listening (the caller closes the fd) or left dead (-1). */
/* A Unix socket of @type bound at @path. */
static int bind_unix(const char *path, int type)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    assert_true(strlen(path) < sizeof(sa.sun_path));
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, type, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

static int make_socket(const char *path, bool listening)
{
    int fd = bind_unix(path, SOCK_STREAM);
    if (listening) {
        assert_int_equal(listen(fd, 1), 0);
        return fd;
    }
    close(fd); /* the file stays: a dead socket, as a crash leaves it */
    return -1;
}

static void test_open(void **state)
{
    (void)state;
    struct stat st;
    assert_int_equal(stat(g_dir, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0700);
    assert_int_equal(g_dir[0], '/');
    /* an existing directory others may enter is refused and left as it is */
    char out[PATH_MAX], err[256], path[256];
    assert_int_equal(chmod(g_dir, 0750), 0);
    assert_int_equal(kvt_ipcdir_open(g_dir, out, sizeof(out), err, sizeof(err)), KVT_ERR_INVAL);
    assert_non_null(strstr(err, "open to other users"));
    assert_int_equal(stat(g_dir, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0750);
    /* a private one: the same path comes back */
    assert_int_equal(chmod(g_dir, 0700), 0);
    assert_int_equal(kvt_ipcdir_open(g_dir, out, sizeof(out), err, sizeof(err)), KVT_OK);
    assert_string_equal(out, g_dir);
    /* through a symlink: the canonical path */
    snprintf(path, sizeof(path), "%s/link", g_tmp);
    assert_int_equal(symlink(g_dir, path), 0);
    assert_int_equal(kvt_ipcdir_open(path, out, sizeof(out), err, sizeof(err)), KVT_OK);
    assert_string_equal(out, g_dir);
    /* a file is not a directory */
    snprintf(path, sizeof(path), "%s/file", g_tmp);
    write_file(path);
    assert_int_not_equal(kvt_ipcdir_open(path, out, sizeof(out), err, sizeof(err)), KVT_OK);
    assert_true(err[0] != '\0');
    assert_int_not_equal(kvt_ipcdir_open("", out, sizeof(out), err, sizeof(err)), KVT_OK);
    /* a directory too deep for a socket path in it: made, but it cannot serve */
    char deep[256];
    int n = snprintf(deep, sizeof(deep), "%s/", g_tmp);
    memset(deep + n, 'd', 120);
    deep[n + 120] = '\0';
    assert_int_equal(kvt_ipcdir_open(deep, out, sizeof(out), err, sizeof(err)), KVT_ERR_RANGE);
    assert_non_null(strstr(err, "too long"));
}

static void expect_bind(const char *endpoint, const char *want)
{
    char out[512], err[256] = "";
    kvt_status_t st = kvt_ipcdir_bind_endpoint(g_dir, endpoint, out, sizeof(out), err, sizeof(err));
    if (st != KVT_OK)
        fail_msg("%s: refused: %s", endpoint, err);
    char full[512];
    snprintf(full, sizeof(full), "ipc://%s/%s", g_dir, want);
    assert_string_equal(out, full);
}

static void expect_refused(const char *dir, const char *endpoint, const char *why)
{
    char out[512] = "untouched", err[256] = "";
    assert_int_equal(kvt_ipcdir_bind_endpoint(dir, endpoint, out, sizeof(out), err, sizeof(err)),
                     KVT_ERR_INVAL);
    assert_string_equal(out, "untouched");
    if (strstr(err, why) == NULL)
        fail_msg("%s: message \"%s\" lacks \"%s\"", endpoint, err, why);
}

static void test_bind_endpoint(void **state)
{
    (void)state;
    char ep[512], outside[256];
    expect_bind("ipc://events", "events");
    expect_bind("ipc://kv.pub-0_A", "kv.pub-0_A");
    snprintf(ep, sizeof(ep), "ipc://%s/abs", g_dir);
    expect_bind(ep, "abs");
    /* through a symlink to the directory itself: inside */
    snprintf(ep, sizeof(ep), "ipc://%s/link/viasym", g_tmp);
    expect_bind(ep, "viasym");
    /* the endpoint may be rewritten in place */
    char inplace[512] = "ipc://inplace", err[256];
    assert_int_equal(
        kvt_ipcdir_bind_endpoint(g_dir, inplace, inplace, sizeof(inplace), err, sizeof(err)),
        KVT_OK);
    assert_non_null(strstr(inplace, "/inplace"));

    snprintf(outside, sizeof(outside), "ipc://%s/victim", g_tmp);
    expect_refused(g_dir, outside, "ipc dir");
    expect_refused(g_dir, "ipc:///etc/passwd", "ipc dir");
    expect_refused(g_dir, "ipc:///victim", "ipc dir");
    snprintf(ep, sizeof(ep), "ipc://%s/../victim", g_dir);
    expect_refused(g_dir, ep, "plain");
    snprintf(ep, sizeof(ep), "ipc://%s/./x", g_dir);
    expect_refused(g_dir, ep, "plain");
    snprintf(ep, sizeof(ep), "ipc://%s//x", g_dir);
    expect_refused(g_dir, ep, "plain");
    snprintf(ep, sizeof(ep), "ipc://%s/", g_dir);
    expect_refused(g_dir, ep, "name");
    snprintf(ep, sizeof(ep), "ipc://%s/..", g_dir);
    expect_refused(g_dir, ep, "name");
    /* a symlinked directory inside that leads out */
    char link[512], target[512];
    snprintf(target, sizeof(target), "%s/elsewhere", g_tmp);
    assert_int_equal(mkdir(target, 0700), 0);
    snprintf(link, sizeof(link), "%s/out", g_dir);
    assert_int_equal(symlink(target, link), 0);
    snprintf(ep, sizeof(ep), "ipc://%s/out/x", g_dir);
    expect_refused(g_dir, ep, "ipc dir");
    /* relative names are plain names */
    expect_refused(g_dir, "ipc://../victim", "no '/'");
    expect_refused(g_dir, "ipc://sub/x", "no '/'");
    expect_refused(g_dir, "ipc://.", "name");
    expect_refused(g_dir, "ipc://..", "name");
    expect_refused(g_dir, "ipc://", "name");
    expect_refused(g_dir, "ipc://*", "name");
    expect_refused(g_dir, "ipc://a b", "name");
    expect_refused(g_dir, "ipc://caf\xc3\xa9", "name");
    char longname[80];
    memset(longname, 'n', 65);
    longname[65] = '\0';
    snprintf(ep, sizeof(ep), "ipc://%s", longname);
    expect_refused(g_dir, ep, "name");
    /* not ipc, and no ipc dir at all */
    expect_refused(g_dir, "tcp://127.0.0.1:1", "not an ipc");
    expect_refused(NULL, "ipc://events", "--ipc-dir");
    expect_refused("", "ipc://events", "--ipc-dir");
    /* a name that does not fit a Unix socket path with the directory */
    char deep[200];
    snprintf(deep, sizeof(deep), "/%0100d", 0);
    expect_refused(deep, "ipc://events-with-a-long-name-0123456789", "too long");
}

static void test_check_free_and_release(void **state)
{
    (void)state;
    char ep[600], path[512], err[256];
    /* nothing there */
    snprintf(path, sizeof(path), "%s/free", g_dir);
    snprintf(ep, sizeof(ep), "ipc://%s", path);
    assert_int_equal(kvt_ipcdir_check_free(ep, err, sizeof(err)), KVT_OK);
    /* a regular file: refused, and release leaves it */
    write_file(path);
    assert_int_equal(kvt_ipcdir_check_free(ep, err, sizeof(err)), KVT_ERR_INVAL);
    assert_non_null(strstr(err, "not a socket"));
    kvt_ipcdir_release(ep);
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(unlink(path), 0);
    /* a directory or a symlink: not a socket either */
    assert_int_equal(mkdir(path, 0700), 0);
    assert_int_equal(kvt_ipcdir_check_free(ep, err, sizeof(err)), KVT_ERR_INVAL);
    kvt_ipcdir_release(ep);
    assert_int_equal(rmdir(path), 0);
    assert_int_equal(symlink("/etc/passwd", path), 0);
    assert_int_equal(kvt_ipcdir_check_free(ep, err, sizeof(err)), KVT_ERR_INVAL);
    kvt_ipcdir_release(ep);
    assert_int_equal(lstat(path, &st), 0);
    assert_int_equal(unlink(path), 0);
    /* a socket someone listens on: in use */
    int fd = make_socket(path, true);
    assert_int_equal(kvt_ipcdir_check_free(ep, err, sizeof(err)), KVT_ERR_INVAL);
    assert_non_null(strstr(err, "in use"));
    close(fd);
    /* a live datagram socket there (connect says EPROTOTYPE, not refused): in use too */
    char dpath[512], dep[600];
    snprintf(dpath, sizeof(dpath), "%s/dgram", g_dir);
    snprintf(dep, sizeof(dep), "ipc://%s", dpath);
    int dg = bind_unix(dpath, SOCK_DGRAM);
    assert_int_equal(kvt_ipcdir_check_free(dep, err, sizeof(err)), KVT_ERR_INVAL);
    assert_non_null(strstr(err, "cannot tell"));
    close(dg);
    assert_int_equal(unlink(dpath), 0);
    /* the same socket, dead (its listener gone): may be bound over */
    assert_int_equal(kvt_ipcdir_check_free(ep, err, sizeof(err)), KVT_OK);
    /* release removes a socket, and only for ipc endpoints */
    char tcp_ep[600];
    snprintf(tcp_ep, sizeof(tcp_ep), "tcp://%s", path); /* same prefix length as ipc:// */
    kvt_ipcdir_release(tcp_ep);
    assert_int_equal(lstat(path, &st), 0);
    kvt_ipcdir_release(ep);
    assert_int_not_equal(lstat(path, &st), 0);
    kvt_ipcdir_release(ep); /* already gone: nothing happens */
    make_socket(path, false);
    assert_int_equal(kvt_ipcdir_check_free(ep, err, sizeof(err)), KVT_OK);
    kvt_ipcdir_release(ep);
    assert_int_not_equal(lstat(path, &st), 0);
    kvt_ipcdir_release(""); /* an endpoint never bound */
    assert_true(kvt_ipcdir_is_ipc("ipc://x"));
    assert_false(kvt_ipcdir_is_ipc("inproc://x"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open),
        cmocka_unit_test(test_bind_endpoint),
        cmocka_unit_test(test_check_free_and_release),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
