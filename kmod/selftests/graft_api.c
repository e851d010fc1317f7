// SPDX-License-Identifier: GPL-2.0
/*
 * The ioctl ABI and the permission rule: negotiation comes first, unknown
 * commands get ENOTTY, unknown flags and reserved fields EINVAL, a source that
 * is not there ESRCH, a running one EBUSY; a caller that may not ptrace the
 * source gets EPERM, and every failed graft leaves its caller running on as
 * before (this test is that caller).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <stdbool.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "graft_lib.h"
#include "tap.h"

/* the errno of one graft request (0: it succeeded), on a fresh file; @thread: as BUNSHIN_IOC_GRAFT_THREAD */
static int request_errno(struct bunshin_graft req, bool thread)
{
	int fd = open_bunshin();
	int ret;

	if (fd < 0 || api(fd))
		return -1000;
	ret = ioctl(fd, thread ? BUNSHIN_IOC_GRAFT_THREAD : BUNSHIN_IOC_GRAFT, &req) ? errno : 0;
	close(fd);
	return ret;
}

static int graft_errno(uint32_t flags, int32_t source, uint32_t tid)
{
	return request_errno((struct bunshin_graft){ .flags = flags, .source = source, .tid = tid }, false);
}

static void expect(int got, int want, const char *name)
{
	if (got != want)
		tap_diag("%s: got %s (%d), want %s", name, strerror(got), got, strerror(want));
	tap_result(got == want, name);
}

int main(void)
{
	struct bunshin_api a = { .api = BUNSHIN_API };
	struct graft_opts o = { 0 };
	struct proc src, clone;
	struct reply r;
	int fd, pidfd, err, status, back;
	pid_t gone;

	tap_plan(24);
	if (access("/dev/bunshin", F_OK)) {
		tap_skip("graft_api", "/dev/bunshin missing (module not loaded)");
		tap_exit();
	}

	fd = open_bunshin();
	a.api = BUNSHIN_API + 1;
	expect(ioctl(fd, BUNSHIN_IOC_API, &a) ? errno : 0, EINVAL, "API with an unknown version: EINVAL");
	a.api = BUNSHIN_API;
	a.features = 1ULL << 40;
	expect(ioctl(fd, BUNSHIN_IOC_API, &a) ? errno : 0, EINVAL, "API asking for an unknown feature: EINVAL");
	expect(ioctl(fd, BUNSHIN_IOC_GRAFT, &(struct bunshin_graft){ .source = 1 }) ? errno : 0,
	       EINVAL, "GRAFT before API: EINVAL");
	a.features = BUNSHIN_FEATURE_PIDFD;
	err = ioctl(fd, BUNSHIN_IOC_API, &a) ? errno : 0;
	tap_result(!err && a.api == BUNSHIN_API &&
		   a.features == (BUNSHIN_FEATURE_PIDFD | BUNSHIN_FEATURE_THREADS | BUNSHIN_FEATURE_CLOSE |
				  BUNSHIN_FEATURE_REMAP | BUNSHIN_FEATURE_HOLD) &&
		   a.ioctls == 15, "API negotiates: version, every feature and the four ioctls");
	expect(ioctl(fd, BUNSHIN_IOC_API, &a) ? errno : 0, EINVAL, "a second API on one file: EINVAL");
	expect(ioctl(fd, _IOW(BUNSHIN_IOC_MAGIC, 0x7f, struct bunshin_graft), &a) ? errno : 0,
	       ENOTTY, "an unknown command: ENOTTY");
	close(fd);

	if (source_start(&src, 1 << 20, 0))
		return KSFT_FAIL;
	expect(graft_errno(0, src.pid, 0), EBUSY, "a running source: EBUSY");
	{
		struct cmd v = { .op = 'V' };
		char path[64];
		long child;

		/* a vfork parent's wait counts as frozen for the freezer, but it is not stopped */
		if (write(src.cmd, &v, sizeof(v)) != sizeof(v))
			return KSFT_FAIL;
		usleep(200000);
		expect(graft_errno(0, src.pid, 0), EBUSY, "a vfork parent waiting for its child: EBUSY");
		snprintf(path, sizeof(path), "/proc/%d/task/%d/children", src.pid, src.pid);
		child = file_long(path, NULL);
		if (child > 0)
			kill(child, SIGKILL);
		if (read(src.out, &r, sizeof(r)) != sizeof(r))
			return KSFT_FAIL;
	}
	source_stop(&src, STOP_SIGSTOP);
	expect(graft_errno(1U << 7, src.pid, 0), EINVAL, "an unknown flag: EINVAL");
	expect(request_errno((struct bunshin_graft){ .source = src.pid, .reserved = 1 }, false), EINVAL,
	       "a non-zero reserved field: EINVAL");
	expect(request_errno((struct bunshin_graft){ .source = src.pid, .close_from = 3 }, false), EINVAL,
	       "close_from without BUNSHIN_GRAFT_CLOSE: EINVAL");
	expect(request_errno((struct bunshin_graft){ .source = src.pid, .nr_remap = 1 }, false), EINVAL,
	       "remap entries without BUNSHIN_GRAFT_REMAP: EINVAL");
	expect(request_errno((struct bunshin_graft){ .flags = BUNSHIN_GRAFT_REMAP, .source = src.pid }, false),
	       EINVAL, "BUNSHIN_GRAFT_REMAP with no entry: EINVAL");
	expect(request_errno((struct bunshin_graft){ .flags = BUNSHIN_GRAFT_REMAP, .source = src.pid,
						     .remap = 8, .nr_remap = BUNSHIN_REMAP_MAX + 1 }, false),
	       EINVAL, "more than BUNSHIN_REMAP_MAX remap entries: EINVAL");
	expect(request_errno((struct bunshin_graft){ .flags = BUNSHIN_GRAFT_REMAP, .source = src.pid,
						     .remap = 8, .nr_remap = 1 }, false),
	       EFAULT, "remap entries at an unreadable address: EFAULT");
	expect(request_errno((struct bunshin_graft){ .flags = BUNSHIN_GRAFT_CLOSE, .source = src.pid,
						     .close_from = 100 }, true),
	       EINVAL, "BUNSHIN_GRAFT_CLOSE on a parked thread: EINVAL");
	expect(graft_errno(0, 0x3ffffff0, 0), ESRCH, "a pid nobody has: ESRCH");
	expect(graft_errno(0, -4, 0), EINVAL, "a negative pid: EINVAL");
	expect(graft_errno(0, src.pid, 0x3ffffff0), ESRCH, "a tid not in the source: ESRCH");
	expect(graft_errno(0, getpid(), 0), EINVAL, "the caller itself: EINVAL");

	/* a pidfd whose process has exited and been reaped */
	gone = fork();
	if (gone == 0)
		_exit(0);
	pidfd = syscall(SYS_pidfd_open, gone, 0);
	waitpid(gone, &status, 0);
	expect(graft_errno(BUNSHIN_GRAFT_PIDFD, pidfd, 0), ESRCH, "a vanished source: ESRCH");
	close(pidfd);

	/* one thread of a multi-threaded graft names a tid the source lacks: the graft fails */
	o.flags = HELPER_BAD_THREAD;
	graft_start(&clone, &src, &o);
	err = graft_wait_threads(&clone, &back);
	waitpid(clone.pid, &status, 0);
	clone.pid = 0;
	tap_result(err == -ESRCH && back == 1 && WIFEXITED(status) && WEXITSTATUS(status) == 3,
		   "a parked thread naming a missing tid fails the graft (ESRCH): every thread runs on");
	close(clone.cmd);
	close(clone.out);

	/* the permission rule: nobody (65534) may not ptrace root's process */
	o.flags = HELPER_UNPRIVILEGED;
	graft_start(&clone, &src, &o);
	err = graft_wait(&clone);
	expect(-err, EPERM, "an unprivileged caller grafting a root process: EPERM");
	proc_end(&clone);
	proc_end(&src);

	/* ... and may graft its own */
	source_uid = 65534;
	if (source_start(&src, 1 << 20, 0))
		return KSFT_FAIL;
	source_uid = 0;
	source_stop(&src, STOP_SIGSTOP);
	graft_start(&clone, &src, &o);
	err = graft_wait(&clone);
	if (err)
		tap_diag("graft: %s", strerror(-err));
	tap_result(!err && !call(&clone, 'S', 0, 0, &r), "an unprivileged caller grafts its own process");
	proc_end(&clone);
	proc_end(&src);
	tap_exit();
}
