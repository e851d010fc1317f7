/* SPDX-License-Identifier: GPL-2.0 */
/*
 * TAP output in the kselftest format: a plan, one "ok"/"not ok" line per
 * test, "# SKIP" for a test whose prerequisite is missing, exit code 0 (pass),
 * 1 (fail) or 4 (skip, when every test skipped).
 */
#ifndef BUNSHIN_TAP_H
#define BUNSHIN_TAP_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define KSFT_PASS 0
#define KSFT_FAIL 1
#define KSFT_SKIP 4

static int tap_number, tap_passed, tap_failed, tap_skipped;

static inline void tap_plan(int tests)
{
	printf("TAP version 13\n1..%d\n", tests);
	fflush(stdout);
}

static inline void tap_diag(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	printf("# ");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	fflush(stdout);
}

static inline void tap_result(int ok, const char *name)
{
	printf("%s %d %s\n", ok ? "ok" : "not ok", ++tap_number, name);
	fflush(stdout);
	if (ok)
		tap_passed++;
	else
		tap_failed++;
}

static inline void tap_skip(const char *name, const char *why)
{
	printf("ok %d %s # SKIP %s\n", ++tap_number, name, why);
	fflush(stdout);
	tap_skipped++;
}

static inline int tap_exit(void)
{
	printf("# Totals: pass:%d fail:%d xfail:0 xpass:0 skip:%d error:0\n",
	       tap_passed, tap_failed, tap_skipped);
	fflush(stdout);
	if (tap_failed)
		exit(KSFT_FAIL);
	if (tap_skipped && !tap_passed)
		exit(KSFT_SKIP);
	exit(KSFT_PASS);
}

#endif
