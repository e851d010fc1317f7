// SPDX-License-Identifier: GPL-2.0
/*
 * Failure and leaks. A fault injected at each step of a graft leaves the
 * source untouched and the caller either running on (its ioctl returned the
 * error) or, past the switch, killed by SIGKILL. 1,000 grafts, and a chain of
 * 64 grafts of grafts, leave no mm_struct, VMA, task, file or module object
 * behind (/proc/slabinfo with slab_nomerge; the module's debugfs counters).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "graft_lib.h"
#include "tap.h"

#define FAIL_STEP "/sys/kernel/debug/bunshin/fail_step"

static void counts_diag(const char *what, const struct counts *a, const struct counts *b)
{
	tap_diag("%s: mm_struct %+ld, vm_area_struct %+ld, task_struct %+ld, filp %+ld, sessions %ld, states %ld",
		 what, b->mm - a->mm, b->vma - a->vma, b->task - a->task, b->filp - a->filp,
		 b->sessions, b->states);
}

/* a few objects of slack; a leak per graft would be a thousand, or 64 */
static int no_leak(const struct counts *a, const struct counts *b)
{
	return b->mm - a->mm <= 4 && b->task - a->task <= 4 && b->vma - a->vma <= 32 &&
	       b->filp - a->filp <= 32 && b->sessions == 0 && b->states == 0;
}

/*
 * Tasks and files are freed after an RCU grace period, which a busy machine makes late (task_struct +6 once): read
 * until nothing is left over, or for about ten seconds. A leak stays and still fails.
 */
static void counts_settled(const struct counts *start, struct counts *end)
{
	int i;

	for (i = 0; i < 32; i++) {
		counts_read(end);
		if (no_leak(start, end))
			return;
	}
}

static void fault_at(const char *step, int killed, int threads)
{
	struct graft_opts o = { .flags = threads ? HELPER_THREADS : 0 };
	struct proc src, clone;
	struct reply before, after;
	char name[160];
	int err, status, caller_ok, back;

	source_start(&src, 4 << 20, threads);
	usleep(threads ? 100000 : 0);
	call(&src, 'S', 0, 0, &before);
	source_stop(&src, STOP_SIGSTOP);
	write_file(FAIL_STEP, step);
	graft_start(&clone, &src, &o);
	/*
	 * The helper is reaped before it is asked how the graft went: its reply must be read even when the question
	 * finds it gone (on a busy machine it once was, and the question's SIGPIPE killed this test).
	 */
	waitpid(clone.pid, &status, 0);
	clone.pid = 0;
	err = graft_wait_threads(&clone, &back);
	if (killed)
		caller_ok = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
	else	/* the helper's own code ran on: it reported the errno and exited 3 */
		caller_ok = err == -ENOMEM && WIFEXITED(status) && WEXITSTATUS(status) == 3 &&
			    back == (threads ? 3 : 0);
	source_resume(&src, STOP_SIGSTOP);
	call(&src, 'S', 0, 0, &after);
	snprintf(name, sizeof(name), "a fault at \"%s\"%s: the caller %s, the source untouched", step,
		 threads ? " with threads parked" : "",
		 killed ? "is killed by SIGKILL" :
		 threads ? "and its parked threads get ENOMEM and run on" : "gets ENOMEM and runs on");
	if (!caller_ok)
		tap_diag("%s: graft %s, status %#x, threads back %d", step, strerror(-err), status,
			 back);
	tap_result(caller_ok && after.v[0] == before.v[0], name);
	close(clone.cmd);
	close(clone.out);
	proc_end(&src);
}

int main(void)
{
	struct counts start, end;
	struct proc chain[65];
	struct reply r0, r;
	int i, err, ok;

	tap_plan(9);
	if (access("/dev/bunshin", F_OK) || access(FAIL_STEP, F_OK)) {
		tap_skip("graft_faults", "/dev/bunshin or debugfs missing");
		tap_exit();
	}
	counts_read(&start);
	fault_at("alloc", 0, 0);
	fault_at("init", 0, 0);
	fault_at("copy", 0, 0);
	fault_at("state", 1, 0);
	fault_at("copy", 0, 1);
	fault_at("state", 1, 1);

	/* 1,000 grafts of one source */
	source_start(&chain[0], 1 << 20, 0);
	source_stop(&chain[0], STOP_SIGSTOP);
	ok = 1;
	for (i = 0; i < 1000 && ok; i++) {
		struct graft_opts o = { 0 };

		graft_start(&chain[1], &chain[0], &o);
		err = graft_wait(&chain[1]);
		if (err) {
			tap_diag("graft %d: %s", i, strerror(-err));
			ok = 0;
		}
		proc_end(&chain[1]);
	}
	proc_end(&chain[0]);
	counts_settled(&start, &end);
	counts_diag("after the faults and 1,000 grafts", &start, &end);
	tap_result(ok && no_leak(&start, &end), "1,000 grafts leak no memory and no reference");

	/* a chain: each clone, stopped, is the source of the next */
	source_start(&chain[0], 4 << 20, 0);
	call(&chain[0], 'W', 12345, 0x5A, &r);
	call(&chain[0], 'S', 0, 0, &r0);
	ok = 1;
	for (i = 1; i <= 64 && ok; i++) {
		struct graft_opts o = { 0 };

		source_stop(&chain[i - 1], STOP_SIGSTOP);
		graft_start(&chain[i], &chain[i - 1], &o);
		err = graft_wait(&chain[i]);
		if (err) {
			tap_diag("graft %d of the chain: %s", i, strerror(-err));
			ok = 0;
		}
	}
	ok = ok && !call(&chain[64], 'S', 0, 0, &r) && r.v[0] == r0.v[0];
	tap_result(ok, "the 64th graft of grafts holds the first source's bytes");
	for (i = 64; i >= 0; i--)
		if (chain[i].pid)
			proc_end(&chain[i]);
	counts_settled(&start, &end);
	counts_diag("after the chain of 64", &start, &end);
	tap_result(no_leak(&start, &end), "a chain of 64 grafts of grafts leaks nothing");
	tap_exit();
}
