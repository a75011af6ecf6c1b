/* common/version.c: the version and build of this binary (version.h). */
#include "common/version.h"

#include <string.h>

#include "kvt_build_rev.h" /* generated at build time by cmake/build_rev.cmake */

#ifndef KVT_PROJECT_VERSION
#error "KVT_PROJECT_VERSION must come from the build"
#endif
#ifndef KVT_BUILD_TYPE
#define KVT_BUILD_TYPE ""
#endif

#define KVT_STR_(x) #x
#define KVT_STR(x) KVT_STR_(x)
#if defined(__clang__)
#define KVT_COMPILER                                                                               \
    "clang " KVT_STR(__clang_major__) "." KVT_STR(__clang_minor__) "." KVT_STR(__clang_patchlevel__)
#elif defined(__GNUC__)
#define KVT_COMPILER                                                                               \
    "gcc " KVT_STR(__GNUC__) "." KVT_STR(__GNUC_MINOR__) "." KVT_STR(__GNUC_PATCHLEVEL__)
#else
#define KVT_COMPILER "unknown"
#endif

const char *kvt_version(void)
{
    return KVT_PROJECT_VERSION;
}

const char *kvt_build_rev(void)
{
    return KVT_BUILD_REV;
}

const char *kvt_build_type(void)
{
    return KVT_BUILD_TYPE;
}

const char *kvt_build_compiler(void)
{
    return KVT_COMPILER;
}

void kvt_version_print(FILE *out, const char *prog)
{
    fprintf(out, "%s %s (%s, %s, %s)\n", prog, kvt_version(), kvt_build_rev(),
            kvt_build_type()[0] ? kvt_build_type() : "no build type", kvt_build_compiler());
}

int kvt_version_asked(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            return 0;
        if (strcmp(argv[i], "--version") == 0)
            return 1;
    }
    return 0;
}
