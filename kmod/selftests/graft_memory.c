// SPDX-License-Identifier: GPL-2.0
/*
 * A graft's memory and state: the clone sees the source's bytes, shares its
 * unchanged pages (equal page frames in /proc/PID/pagemap), owns nothing but
 * page tables right after the graft, and a write on either side is not seen
 * by the other. The clone also carries the source's registrations: rseq,
 * robust list, signal stack, blocked mask, TLS base and signal handlers.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "graft_lib.h"
#include "tap.h"

#define SIZE (64UL << 20)

static struct proc src, clone;

static int shared_pages(uint64_t base, size_t size, long *differ)
{
	long same = 0;
	uint64_t off;

	*differ = 0;
	for (off = 0; off < size; off += 4096) {
		int64_t a = pagemap_pfn(src.pid, base + off);
		int64_t b = pagemap_pfn(clone.pid, base + off);

		if (a > 0 && a == b)
			same++;
		else
			(*differ)++;
	}
	return same;
}

int main(void)
{
	struct graft_opts o = { 0 };
	struct reply a, r1, r2;
	long differ, same, priv, pte;
	uint64_t base;
	int err;

	tap_plan(7);
	if (access("/dev/bunshin", F_OK)) {
		tap_skip("graft_memory", "/dev/bunshin missing (module not loaded)");
		tap_exit();
	}
	if (source_start(&src, SIZE, 0) || call(&src, 'A', 0, 0, &a) || call(&src, 'S', 0, 0, &r1))
		return KSFT_FAIL;
	base = a.v[0];
	if (source_stop(&src, STOP_SIGSTOP) || graft_start(&clone, &src, &o))
		return KSFT_FAIL;
	err = graft_wait(&clone);
	tap_result(!err, "a stopped source grafts into a helper, whose clone answers");
	if (err) {
		tap_diag("graft: %s", strerror(-err));
		tap_exit();
	}

	/* while the source stays stopped, before either side writes */
	same = shared_pages(base, SIZE, &differ);
	priv = smaps_value(clone.pid, "Private_Dirty") + smaps_value(clone.pid, "Private_Clean");
	pte = status_value(clone.pid, "VmPTE");
	tap_diag("shared pages %ld of %lu, differing %ld; clone private %ld kB, page tables %ld kB",
		 same, SIZE / 4096, differ, priv, pte);
	tap_result(same == (long)(SIZE / 4096), "every page of the region has the same frame in both");
	/* the clone ran only to answer a ping: its stack and a heap page at most */
	tap_result(pte > 0 && priv <= 64 && priv < pte + 64,
		   "the clone's private memory right after the graft is its page tables and a few pages");

	err = call(&clone, 'S', 0, 0, &r2);
	tap_result(!err && r2.v[0] == r1.v[0], "the clone reads the source's bytes");

	/* isolation, clone -> source: the clone writes, the source keeps the old byte */
	source_resume(&src, STOP_SIGSTOP);
	call(&clone, 'W', 4096 * 3 + 5, 0xAB, &r2);
	call(&src, 'R', 4096 * 3 + 5, 0, &r1);
	call(&clone, 'R', 4096 * 3 + 5, 0, &r2);
	tap_result(r2.v[0] == 0xAB && r1.v[0] != 0xAB &&
		   pagemap_pfn(src.pid, base + 4096 * 3) != pagemap_pfn(clone.pid, base + 4096 * 3) &&
		   pagemap_pfn(src.pid, base + 4096 * 4) == pagemap_pfn(clone.pid, base + 4096 * 4),
		   "a write in the clone is not seen by the source, and copies only its page");
	call(&src, 'W', 4096 * 9, 0xCD, &r1);
	call(&clone, 'R', 4096 * 9, 0, &r2);
	call(&src, 'R', 4096 * 9, 0, &r1);
	tap_result(r1.v[0] == 0xCD && r2.v[0] != 0xCD,
		   "a write in the source after the graft is not seen by the clone");

	/* the clone's registrations are the source's, and its handler runs */
	kill(clone.pid, SIGUSR1);
	usleep(100000);
	call(&clone, 'X', 0, 0, &r2);
	call(&clone, 'U', 0, 0, &r1);
	tap_diag("rseq %ld robust %ld altstack %ld mask+tls %ld usr1 %ld",
		 r2.v[0], r2.v[1], r2.v[2], r2.v[3], r1.v[0]);
	tap_result(r2.v[0] == 1 && r2.v[1] && r2.v[2] && r2.v[3] && r1.v[0] == 1,
		   "rseq, robust list, signal stack, blocked mask, TLS and handlers carried over");

	proc_end(&clone);
	proc_end(&src);
	tap_exit();
}
