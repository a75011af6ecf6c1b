/*
 * libFuzzer target for the config-file parser (common/config.c).
 *
 * The input is the config file (handed over through a memfd). Invariants: a
 * bad file is rejected with KVT_ERR_INVAL, a one-line message and the
 * caller's struct untouched; a good file loads, and dumping the result and
 * loading the dump gives equal values (the --dump-config round trip).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/config.h"

#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct fz_cfg {
    char *name;
    bool flag;
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    double real;
    uint64_t size;
    uint64_t dur;
    kvt_cfg_list_t list;
    kvt_log_level_t level;
} fz_cfg_t;

static const kvt_cfg_opt_t opts[] = {
    {"name", "x", "a string", &kvt_cfg_string, offsetof(fz_cfg_t, name), 0},
    {"flag", "false", "a bool", &kvt_cfg_bool, offsetof(fz_cfg_t, flag), 0},
    {"u32", "1", "a u32", &kvt_cfg_u32, offsetof(fz_cfg_t, u32), 0},
    {"u64", "2", "a u64", &kvt_cfg_u64, offsetof(fz_cfg_t, u64), 0},
    {"i64", "-3", "an i64", &kvt_cfg_i64, offsetof(fz_cfg_t, i64), 0},
    {"real", "0.5", "a double", &kvt_cfg_double, offsetof(fz_cfg_t, real), 0},
    {"size", "4KiB", "a size", &kvt_cfg_size, offsetof(fz_cfg_t, size), 0},
    {"dur", "1s", "a duration", &kvt_cfg_duration, offsetof(fz_cfg_t, dur), 0},
    {"engine", NULL, "a list", &kvt_cfg_string_list, offsetof(fz_cfg_t, list), 0},
    {"log-level", "info", "a level", &kvt_cfg_log_level, offsetof(fz_cfg_t, level), 0},
};
#define NOPTS (sizeof(opts) / sizeof(opts[0]))

/* Loads @cfg from the file behind @fd; returns the status, message in @err. */
static kvt_status_t load_fd(int fd, fz_cfg_t *cfg, char *err, size_t errlen)
{
    char path[64], prog[] = "fuzz", flag[] = "--config";
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    char *argv[] = {prog, flag, path, NULL};
    kvt_cfg_result_t res;
    kvt_status_t st = kvt_cfg_load(opts, NOPTS, cfg, sizeof(*cfg), 3, argv, NULL, &res, err,
                                   errlen);
    if (st == KVT_OK)
        kvt_cfg_result_cleanup(&res);
    return st;
}

static int fd_with(const void *data, size_t size)
{
    int fd = memfd_create("fuzz_config", 0);
    CHECK(fd >= 0);
    CHECK(size == 0 || write(fd, data, size) == (ssize_t)size);
    return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = fd_with(data, size);
    fz_cfg_t cfg, before;
    memset(&cfg, 0xab, sizeof(cfg));
    before = cfg;
    char err[512];
    kvt_status_t st = load_fd(fd, &cfg, err, sizeof(err));
    close(fd);
    if (st != KVT_OK) {
        CHECK(st == KVT_ERR_INVAL || st == KVT_ERR_NO_MEM);
        CHECK(memcmp(&cfg, &before, sizeof(cfg)) == 0);
        CHECK(strchr(err, '\n') == NULL);
        return 0;
    }
    /* round trip: dump, load the dump, compare */
    char *dump = NULL;
    size_t dlen = 0;
    FILE *f = open_memstream(&dump, &dlen);
    CHECK(f != NULL);
    CHECK(kvt_cfg_dump(f, opts, NOPTS, &cfg) == KVT_OK);
    fclose(f);
    int fd2 = fd_with(dump, dlen);
    fz_cfg_t cfg2;
    memset(&cfg2, 0, sizeof(cfg2));
    st = load_fd(fd2, &cfg2, err, sizeof(err));
    close(fd2);
    if (st != KVT_OK) {
        fprintf(stderr, "dump does not load back: %s\n---\n%s---\n", err, dump);
        abort();
    }
    CHECK((cfg.name == NULL) == (cfg2.name == NULL));
    CHECK(cfg.name == NULL || strcmp(cfg.name, cfg2.name) == 0);
    CHECK(cfg.flag == cfg2.flag && cfg.u32 == cfg2.u32 && cfg.u64 == cfg2.u64);
    CHECK(cfg.i64 == cfg2.i64 && cfg.size == cfg2.size && cfg.dur == cfg2.dur);
    CHECK(cfg.real == cfg2.real && cfg.level == cfg2.level);
    CHECK(cfg.list.n == cfg2.list.n);
    for (size_t i = 0; i < cfg.list.n; i++)
        CHECK(strcmp(cfg.list.items[i], cfg2.list.items[i]) == 0);
    kvt_cfg_cleanup(opts, NOPTS, &cfg2);
    kvt_cfg_cleanup(opts, NOPTS, &cfg);
    free(dump);
    return 0;
}
