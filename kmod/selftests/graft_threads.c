// SPDX-License-Identifier: GPL-2.0
/*
 * A multi-threaded source: besides the main thread (blocked in read()), one
 * thread spins in user space checking that %r15 and %xmm7 keep a magic
 * value, one loops in nanosleep() and one in pthread_cond_timedwait(), each
 * checking its TLS. The helper parks a thread per source thread in
 * BUNSHIN_IOC_GRAFT_THREAD and grafts the main one: every thread of the clone
 * must run on, with its registers, TLS and restarted sleeps intact, and the
 * source must run on too.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "graft_lib.h"
#include "tap.h"

static int read_shared(pid_t pid, uint64_t addr, struct shared *out)
{
	struct iovec local = { out, sizeof(*out) };
	struct iovec remote = { (void *)(uintptr_t)addr, sizeof(*out) };

	return process_vm_readv(pid, &local, 1, &remote, 1, 0) == sizeof(*out) ? 0 : -1;
}

static int threads_of(pid_t pid)
{
	uint32_t tids[16];

	return 1 + other_threads(pid, tids, 16);
}

/* every counter moved and nothing went bad over 300 ms */
static int runs_on(pid_t pid, uint64_t addr, const char *who)
{
	struct shared a, b;

	if (read_shared(pid, addr, &a))
		return 0;
	usleep(300000);
	if (read_shared(pid, addr, &b))
		return 0;
	tap_diag("%s: spins +%lu naps +%lu waits +%lu bad %lu, %d threads", who,
		 (unsigned long)(b.spins - a.spins), (unsigned long)(b.naps - a.naps),
		 (unsigned long)(b.waits - a.waits), (unsigned long)b.bad, threads_of(pid));
	return b.spins > a.spins && b.naps > a.naps && b.waits > a.waits && !b.bad &&
	       threads_of(pid) == 4;
}

int main(void)
{
	enum stop_kind kinds[] = { STOP_SIGSTOP, STOP_FREEZER_V1, STOP_FREEZER_V2 };
	unsigned int i;

	tap_plan(6);
	if (access("/dev/bunshin", F_OK)) {
		tap_skip("graft_threads", "/dev/bunshin missing (module not loaded)");
		tap_exit();
	}
	for (i = 0; i < 3; i++) {
		struct graft_opts o = { .flags = HELPER_THREADS };
		struct proc src, clone;
		struct reply a;
		char name[128];
		int err;

		if (source_start(&src, 1 << 20, 1) || call(&src, 'A', 0, 0, &a))
			return KSFT_FAIL;
		usleep(100000);
		source_stop(&src, kinds[i]);
		graft_start(&clone, &src, &o);
		err = graft_wait(&clone);
		if (err)
			tap_diag("%s: graft: %s", stop_name(kinds[i]), strerror(-err));
		snprintf(name, sizeof(name), "stopped by %s: every thread of the clone runs on",
			 stop_name(kinds[i]));
		tap_result(!err && runs_on(clone.pid, a.v[1], "clone"), name);
		source_resume(&src, kinds[i]);
		snprintf(name, sizeof(name), "stopped by %s: every thread of the source runs on",
			 stop_name(kinds[i]));
		tap_result(runs_on(src.pid, a.v[1], "source"), name);
		proc_end(&clone);
		proc_end(&src);
	}
	tap_exit();
}
