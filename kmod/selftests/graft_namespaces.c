// SPDX-License-Identifier: GPL-2.0
/*
 * The clone lives in the helper's container, not the source's: new pid,
 * mount, network, UTS, IPC and time namespaces and another cgroup, which is charged
 * for the clone's page tables but not for the pages it shares with the source.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "graft_lib.h"
#include "tap.h"

#define CLONE_CG "/sys/fs/cgroup/bunshin-clone"

static int ns_differs(pid_t a, pid_t b, const char *ns)
{
	char pa[64], pb[64], la[64] = "", lb[64] = "";

	snprintf(pa, sizeof(pa), "/proc/%d/ns/%s", a, ns);
	snprintf(pb, sizeof(pb), "/proc/%d/ns/%s", b, ns);
	if (readlink(pa, la, sizeof(la) - 1) < 0 || readlink(pb, lb, sizeof(lb) - 1) < 0)
		return 0;
	return strcmp(la, lb) != 0;
}

static int in_cgroup(pid_t pid, const char *name)
{
	char path[64], line[256];
	int found = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/cgroup", pid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		found |= strstr(line, name) != NULL;
	fclose(f);
	return found;
}

int main(void)
{
	const char *namespaces[] = { "pid", "mnt", "net", "uts", "ipc" };
	struct graft_opts o = { .flags = HELPER_NEWNS, .cgroup = CLONE_CG };
	struct proc src, clone;
	struct reply r;
	long before, after, pte, ahead;
	uint64_t t0;
	int time_ns;
	unsigned int i;
	int err, all;

	tap_plan(5);
	if (access("/dev/bunshin", F_OK)) {
		tap_skip("graft_namespaces", "/dev/bunshin missing (module not loaded)");
		tap_exit();
	}
	mkdir(CLONE_CG, 0755);
	before = file_long(CLONE_CG "/memory.current", NULL);
	if (source_start(&src, 64UL << 20, 0) || source_stop(&src, STOP_SIGSTOP))
		return KSFT_FAIL;
	/* the helper also gets a time namespace whose monotonic clock is 1000 s ahead */
	time_ns = open("/proc/self/ns/time", O_RDONLY);
	if (time_ns < 0 || unshare(CLONE_NEWTIME) ||
	    write_file("/proc/self/timens_offsets", "monotonic 1000 0"))
		return KSFT_FAIL;
	graft_start(&clone, &src, &o);
	setns(time_ns, CLONE_NEWTIME);
	close(time_ns);
	err = graft_wait(&clone);
	if (err) {
		int status = 0;

		waitpid(clone.pid, &status, 0);
		clone.pid = 0;
		tap_diag("graft: %s (the helper's status %#x)", strerror(-err), status);
	}
	tap_result(!err && !call(&clone, 'P', 0, 0, &r) && r.v[0] == 1,
		   "the clone runs as pid 1 of the helper's new pid namespace");
	all = 1;
	for (i = 0; i < 5; i++) {
		if (!ns_differs(src.pid, clone.pid, namespaces[i])) {
			tap_diag("the %s namespace is the source's", namespaces[i]);
			all = 0;
		}
	}
	tap_result(!err && all, "its pid, mount, network, UTS and IPC namespaces are not the source's");
	tap_result(!err && in_cgroup(clone.pid, "bunshin-clone") && !in_cgroup(src.pid, "bunshin-clone"),
		   "it is in the helper's cgroup");
	/* 'N' reads CLOCK_MONOTONIC through the vDSO, whose vvar pages came from the source */
	t0 = now_ns();
	ahead = !err && !call(&clone, 'N', 0, 0, &r) ? ((int64_t)r.v[0] - (int64_t)t0) / 1000000000 : 0;
	tap_diag("the clone's vDSO monotonic clock is %ld s ahead of ours", ahead);
	tap_result(ahead >= 999 && ahead <= 1001, "its vDSO clock is its own time namespace's");
	after = file_long(CLONE_CG "/memory.current", NULL);
	pte = status_value(clone.pid, "VmPTE");
	tap_diag("clone cgroup charged %ld kB (page tables %ld kB) for a 64 MiB source",
		 (after - before) / 1024, pte);
	tap_result(!err && after - before < 4L << 20,
		   "its cgroup is charged for page tables and kernel objects, not the shared 64 MiB");
	proc_end(&clone);
	proc_end(&src);
	rmdir(CLONE_CG);
	tap_exit();
}
