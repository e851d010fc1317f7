// SPDX-License-Identifier: GPL-2.0
/*
 * Graft against fork() of the same source, in the same VM, for 64 MiB and
 * 512 MiB sources: the time each takes and the private memory of what it
 * makes. Prints one JSON object. Under TCG only the ratios mean anything.
 *
 * graft: from the helper's BUNSHIN_IOC_GRAFT call to the clone's first
 *        command after its restarted read() (a command queued in advance), so
 *        it includes the return to user space and the restart;
 * fork:  the source's own fork() call, as its parent sees it (the page-table
 *        copy and the new task);
 * private memory: Private_Clean + Private_Dirty of smaps_rollup, and VmPTE,
 *        right after, while the source stays idle.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include "graft_lib.h"

#define REPEATS 7

struct sample {
	double us[REPEATS];
	double private_kib[REPEATS];
	double pte_kib[REPEATS];
};

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median(double *v)
{
	double s[REPEATS];

	memcpy(s, v, sizeof(s));
	qsort(s, REPEATS, sizeof(double), cmp);
	return s[REPEATS / 2];
}

static void stats(const char *name, double *v, int last)
{
	double s[REPEATS];

	memcpy(s, v, sizeof(s));
	qsort(s, REPEATS, sizeof(double), cmp);
	printf("\"%s\": {\"median\": %.1f, \"min\": %.1f, \"max\": %.1f}%s", name, s[REPEATS / 2], s[0],
	       s[REPEATS - 1], last ? "" : ", ");
}

static long private_kib(pid_t pid)
{
	return smaps_value(pid, "Private_Clean") + smaps_value(pid, "Private_Dirty");
}

static int measure(size_t size, struct sample *graft, struct sample *fork_)
{
	struct proc src, clone;
	struct reply r;
	int i;

	if (source_start(&src, size, 0) || source_stop(&src, STOP_SIGSTOP))
		return -1;
	for (i = 0; i < REPEATS; i++) {
		struct graft_opts o = { .preload = 'N' };
		struct reply n;

		graft_start(&clone, &src, &o);
		/* the clone answers the queued 'N' first, then the ping */
		if (read(clone.out, &n, sizeof(n)) != sizeof(n) || n.op != 'N')
			return -1;
		graft->us[i] = (n.v[0] - (int64_t)*graft_clock) / 1000.0;
		graft->private_kib[i] = private_kib(clone.pid);
		graft->pte_kib[i] = status_value(clone.pid, "VmPTE");
		proc_end(&clone);
	}
	source_resume(&src, STOP_SIGSTOP);
	for (i = 0; i < REPEATS; i++) {
		if (call(&src, 'F', 0, 0, &r))
			return -1;
		usleep(20000);
		fork_->us[i] = r.v[0] / 1000.0;
		fork_->private_kib[i] = private_kib(r.v[1]);
		fork_->pte_kib[i] = status_value(r.v[1], "VmPTE");
		kill(r.v[1], SIGKILL);
	}
	proc_end(&src);
	return 0;
}

int main(void)
{
	size_t sizes[] = { 64UL << 20, 512UL << 20 };
	struct sample graft, fork_;
	struct utsname u;
	unsigned int i;

	graft_clock = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	uname(&u);
	printf("{\"kernel\": \"%s\", \"machine\": \"qemu TCG, 2 vCPUs\", \"repeats\": %d, \"results\": [",
	       u.release, REPEATS);
	for (i = 0; i < 2; i++) {
		if (measure(sizes[i], &graft, &fork_)) {
			printf("]}\n");
			fprintf(stderr, "graft_bench: measuring %zu MiB failed\n", sizes[i] >> 20);
			return 1;
		}
		printf("%s{\"size_mib\": %zu, ", i ? ", " : "", sizes[i] >> 20);
		stats("graft_us", graft.us, 0);
		stats("fork_us", fork_.us, 0);
		stats("graft_private_kib", graft.private_kib, 0);
		stats("fork_private_kib", fork_.private_kib, 0);
		stats("graft_pte_kib", graft.pte_kib, 0);
		stats("fork_pte_kib", fork_.pte_kib, 0);
		printf("\"graft_over_fork_time\": %.2f}", median(graft.us) / median(fork_.us));
	}
	printf("]}\n");
	return 0;
}
