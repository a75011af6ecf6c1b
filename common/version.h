/*
 * common/version.h: what a binary reports with --version, in /v1/stats and as
 * the kvtier_build_info metric.
 */
#ifndef KVT_COMMON_VERSION_H
#define KVT_COMMON_VERSION_H

#include <stdio.h>

/* The project version ("0.1.0", CMakeLists.txt). */
const char *kvt_version(void);

/* The source revision built: `git describe --always --dirty`, or "unknown". */
const char *kvt_build_rev(void);

/* CMAKE_BUILD_TYPE ("Release", "Debug", ...; "" when none was set). */
const char *kvt_build_type(void);

/* The compiler and its version ("gcc 12.2.0", "clang 14.0.6"). */
const char *kvt_build_compiler(void);

/* Prints "<prog> <version> (<revision>, <build type>, <compiler>)\n" to @out. */
void kvt_version_print(FILE *out, const char *prog);

/* Whether argv[1..argc-1] holds "--version" (before any "--"). */
int kvt_version_asked(int argc, char **argv);

#endif
