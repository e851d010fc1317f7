// SPDX-License-Identifier: GPL-2.0
/*
 * BUNSHIN_GRAFT_HOLD, BUNSHIN_IOC_RELEASE and poll(): how an orchestrator
 * starts a whole clone tree at once. The orchestrator keeps a copy of the
 * helper's /dev/bunshin; poll() says when the graft is done (EPOLLERR when it
 * failed); the clone, threads and all, runs no instruction until the file is
 * released; released into a frozen cgroup (v2), it is frozen before its first
 * instruction and runs on when thawed; a held clone dies cleanly by SIGKILL.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "graft_lib.h"
#include "tap.h"

/* poll()'s events on @fd within @ms, 0 if none */
static short polled(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, ms) == 1 ? p.revents : 0;
}

/* whether @clone answers a ping sent before within @ms */
static int answered(struct proc *clone, int ms)
{
	struct pollfd p = { .fd = clone->out, .events = POLLIN };
	struct reply r;

	return poll(&p, 1, ms) == 1 && read(clone->out, &r, sizeof(r)) == sizeof(r) && r.op == 'P';
}

static void ping(struct proc *clone)
{
	struct cmd c = { .op = 'P' };

	if (write(clone->cmd, &c, sizeof(c)) != sizeof(c))
		tap_diag("cannot ping the clone");
}

/* a held graft of @src (threads: a helper thread per source thread); the session file is returned */
static int held_graft(struct proc *clone, struct proc *src, int threads, const char *cgroup)
{
	int session = open_bunshin();
	struct graft_opts o = { .flags = threads ? HELPER_THREADS : 0, .session = session, .hold = 1,
				.cgroup = cgroup };

	if (session < 0 || api(session))
		return -1;
	source_stop(src, STOP_SIGSTOP);
	graft_start(clone, src, &o);
	return session;
}

static int cgroup_value(const char *cg, const char *key)
{
	char path[160];

	snprintf(path, sizeof(path), "%s/cgroup.events", cg);
	return (int)file_long(path, key);
}

int main(void)
{
	const char *cg = "/sys/fs/cgroup/bunshin-hold";
	struct proc src, clone, bad;
	struct reply r;
	int session, status, ok, i;
	short ev;

	tap_plan(7);
	signal(SIGPIPE, SIG_IGN);	/* a clone that died is reported, not fatal here */
	source_start(&src, 4 << 20, 3);
	usleep(100000);

	session = held_graft(&clone, &src, 1, NULL);
	ev = polled(session, 20000);
	tap_result(ev & POLLIN && !(ev & POLLERR), "poll() on the orchestrator's copy: EPOLLIN once the graft is done");
	source_resume(&src, STOP_SIGSTOP);
	ping(&clone);
	ok = !answered(&clone, 1000);
	tap_result(ok, "a held clone runs no code before the release (no answer in 1 s)");
	ok = !ioctl(session, BUNSHIN_IOC_RELEASE, 0) && answered(&clone, 20000);
	if (!ok && waitpid(clone.pid, &status, WNOHANG) == clone.pid) {
		tap_diag("the clone ended: %s %d", WIFSIGNALED(status) ? "signal" : "exit",
			 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
		clone.pid = 0;
	}
	tap_result(ok, "released, it runs on");
	usleep(300000);
	ok = !call(&clone, 'X', 0, 0, &r) && r.v[1] && r.v[2] && r.v[3] && !call(&clone, 'P', 0, 0, &r) &&
	     !r.v[1];
	tap_result(ok, "its threads run on with their state, and its own state is the source's");
	close(session);
	proc_end(&clone);

	/* released into a frozen cgroup: frozen before its first instruction */
	mkdir(cg, 0755);
	session = held_graft(&clone, &src, 1, cg);
	polled(session, 20000);
	source_resume(&src, STOP_SIGSTOP);
	write_file("/sys/fs/cgroup/bunshin-hold/cgroup.freeze", "1");
	ioctl(session, BUNSHIN_IOC_RELEASE, 0);
	for (i = 0; i < 200 && cgroup_value(cg, "frozen") != 1; i++)
		usleep(50000);
	ping(&clone);
	ok = cgroup_value(cg, "frozen") == 1 && !answered(&clone, 1000);
	write_file("/sys/fs/cgroup/bunshin-hold/cgroup.freeze", "0");
	ok = ok && answered(&clone, 20000);
	tap_result(ok, "released into a frozen cgroup: frozen at once, no answer; thawed, it answers");
	close(session);
	proc_end(&clone);
	rmdir(cg);

	/* a held clone killed */
	session = held_graft(&clone, &src, 1, NULL);
	polled(session, 20000);
	source_resume(&src, STOP_SIGSTOP);
	kill(clone.pid, SIGKILL);
	ok = waitpid(clone.pid, &status, 0) == clone.pid && WIFSIGNALED(status);
	clone.pid = 0;
	proc_end(&clone);
	close(session);
	tap_result(ok, "a held clone dies by SIGKILL");

	/* a failed graft: EPOLLERR */
	session = open_bunshin();
	api(session);
	{
		struct graft_opts o = { .session = session, .hold = 1 };

		/* the source runs: the graft is refused (EBUSY) */
		graft_start(&bad, &src, &o);
	}
	ev = polled(session, 20000);
	tap_result(ev & POLLERR, "poll() reports EPOLLERR for a graft that failed");
	close(session);
	proc_end(&bad);
	proc_end(&src);
	return tap_exit();
}
