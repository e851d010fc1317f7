// SPDX-License-Identifier: GPL-2.0
/*
 * A source stopped while blocked in read() on a pipe, by each way of stopping
 * a process: the clone's read() restarts on its own pipe and completes, and
 * the source's own read() completes when it runs again. Stopped at the entry
 * of read() (PTRACE_SYSCALL), the call has not run yet: the clone runs it.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "graft_lib.h"
#include "tap.h"

int main(void)
{
	enum stop_kind kinds[] = { STOP_SIGSTOP, STOP_PTRACE, STOP_SYSCALL_ENTRY, STOP_FREEZER_V2,
				   STOP_FREEZER_V1 };
	unsigned int i;

	tap_plan(5);
	if (access("/dev/bunshin", F_OK)) {
		for (i = 0; i < 5; i++)
			tap_skip("graft_restart", "/dev/bunshin missing (module not loaded)");
		tap_exit();
	}
	for (i = 0; i < 5; i++) {
		struct graft_opts o = { 0 };
		struct proc src, clone;
		struct reply r1, r2;
		char name[128];
		int err, ok;

		snprintf(name, sizeof(name), "stopped by %s in read(): the clone's read restarts",
			 stop_name(kinds[i]));
		if (source_start(&src, 1 << 20, 0) || source_stop(&src, kinds[i])) {
			tap_result(0, name);
			continue;
		}
		/* a stopped source has not consumed this: it is read when it runs */
		graft_start(&clone, &src, &o);
		err = graft_wait(&clone);
		ok = !err && !call(&clone, 'S', 0, 0, &r2);
		source_resume(&src, kinds[i]);
		ok = ok && !call(&src, 'S', 0, 0, &r1) && r1.v[0] == r2.v[0];
		if (err)
			tap_diag("%s: graft: %s", stop_name(kinds[i]), strerror(-err));
		tap_result(ok, name);
		proc_end(&clone);
		proc_end(&src);
	}
	tap_exit();
}
