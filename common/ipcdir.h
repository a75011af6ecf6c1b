/*
 * common/ipcdir: where kvtierd may bind ZMQ ipc:// endpoints.
 *
 * libzmq unlinks an ipc path before binding it, so a bind on a path named by
 * an API caller could replace any file kvtierd can write. Every ipc bind
 * (engine SUBs with "bind", the publisher) therefore lives in one directory
 * kvtierd owns (--ipc-dir, mode 0700): a relative name ("ipc://events") is
 * placed there, an absolute path must name a file directly inside it (no
 * "..", no symlinked directory leading out), anything else is refused. An
 * existing path is bound over only when it is a dead socket of this user
 * (left by a kvtierd that crashed); socket files are removed when their
 * socket closes. ipc connects create nothing and are not restricted here.
 */
#ifndef KVT_COMMON_IPCDIR_H
#define KVT_COMMON_IPCDIR_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"

/* Longest socket path (struct sockaddr_un's sun_path, less the NUL). */
#define KVT_IPCDIR_MAX_PATH 107u

/* Whether @endpoint is an ipc:// endpoint. */
bool kvt_ipcdir_is_ipc(const char *endpoint);

/*
 * Creates directory @path (parents 0750, itself 0700) or checks an existing
 * one: a directory owned by this user, whose mode is then set to 0700 if it
 * was wider. Writes its canonical absolute path (symlinks resolved) to
 * @out[0..cap). Returns KVT_OK; KVT_ERR_RANGE when the directory is fine but
 * its path leaves no room for a socket name in a Unix socket address (or
 * @cap), so it cannot serve; KVT_ERR_IO or KVT_ERR_INVAL otherwise; each with
 * a reason in @err.
 */
kvt_status_t kvt_ipcdir_open(const char *path, char *out, size_t cap, char *err, size_t errlen);

/*
 * The endpoint to bind for ipc endpoint @endpoint under directory @dir
 * (canonical, from kvt_ipcdir_open(); NULL or "": ipc binds are off):
 * "ipc://<dir>/<name>" in @out[0..cap) (@out may be @endpoint). A name is
 * 1..64 bytes of [A-Za-z0-9._-], not "." or "..". Returns KVT_OK or
 * KVT_ERR_INVAL with a reason in @err (a path outside @dir, a bad name, a
 * path too long for a Unix socket). Checks no file: see kvt_ipcdir_check_free().
 */
kvt_status_t kvt_ipcdir_bind_endpoint(const char *dir, const char *endpoint, char *out, size_t cap,
                                      char *err, size_t errlen);

/*
 * Whether the socket file of bound ipc endpoint @endpoint (as resolved by
 * kvt_ipcdir_bind_endpoint()) may be created: KVT_OK when nothing is there
 * or a socket of this user that nobody listens on (a dead one, replaced);
 * KVT_ERR_INVAL with a reason when it is anything else (a file, a live
 * socket, another user's).
 */
kvt_status_t kvt_ipcdir_check_free(const char *endpoint, char *err, size_t errlen);

/* Removes the socket file of bound ipc endpoint @endpoint, if a socket is
 * there; does nothing for other endpoints or other file types. */
void kvt_ipcdir_release(const char *endpoint);

#endif
