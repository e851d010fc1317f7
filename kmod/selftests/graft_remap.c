// SPDX-License-Identifier: GPL-2.0
/*
 * BUNSHIN_GRAFT_REMAP and BUNSHIN_GRAFT_CLOSE: a clone of a source with a
 * shared memfd mapping maps its own copy of the memfd at the same address,
 * sees the same bytes, and never sees a write of the source's there (nor the
 * source one of its own); the helper's own descriptors are gone from the
 * clone's table. A copy of another size or kind, a descriptor that is not
 * open and a private mapping holding pages of its own are refused, each with
 * its errno, and the helper runs on with its descriptors. Nothing leaks
 * over a hundred grafts of each kind.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <unistd.h>

#include "graft_lib.h"
#include "tap.h"

#define SHM_SIZE	(1 << 20)
#define CLOSE_FROM	64

/* a memfd holding a copy of @from's bytes; @size_delta changes its size */
static int copy_of(int from, long size_delta)
{
	int to = memfd_create("bunshin-shm-copy", 0);
	off_t offset = 0;

	if (to < 0 || sendfile(to, from, &offset, SHM_SIZE) != SHM_SIZE ||
	    ftruncate(to, SHM_SIZE + size_delta))
		return -1;
	return to;
}

/* the source's memfd, opened afresh through /proc (what an orchestrator has) */
static int source_memfd(struct proc *src)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/%d/fd/%d", src->pid, SHM_FD);
	return open(path, O_RDWR);
}

/* the first mapping line of @pid at @addr */
static int maps_line(pid_t pid, uint64_t addr, char *line, size_t size)
{
	char path[64], want[32];
	FILE *f;
	int found = 0;

	snprintf(path, sizeof(path), "/proc/%d/maps", pid);
	snprintf(want, sizeof(want), "%lx-", (unsigned long)addr);
	f = fopen(path, "r");
	if (!f)
		return 0;
	while (!found && fgets(line, size, f))
		found = !strncmp(line, want, strlen(want));
	fclose(f);
	return found;
}

/* descriptors of @pid numbered @min or above */
static int fds_from(pid_t pid, int min)
{
	char path[64];
	struct dirent *e;
	DIR *dir;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", pid);
	dir = opendir(path);
	if (!dir)
		return -1;
	while ((e = readdir(dir)))
		n += e->d_name[0] != '.' && atoi(e->d_name) >= min;
	closedir(dir);
	return n;
}

/* a graft of @src with @o that must fail: its errno, with the source resumed */
static int refused(struct proc *src, struct graft_opts *o, int *fds_kept)
{
	struct proc clone;
	int err;

	source_stop(src, STOP_SIGSTOP);
	graft_start(&clone, src, o);
	err = graft_wait(&clone);
	*fds_kept = err != 0;	/* a helper that wrote its 'E' still had its reply descriptor */
	proc_end(&clone);
	source_resume(src, STOP_SIGSTOP);
	return -err;
}

static void expect_refused(struct proc *src, int from, int to, int want, const char *name)
{
	struct graft_opts o = { .remap_from = from, .remap_to = to, .close_from = CLOSE_FROM };
	int kept, err = refused(src, &o, &kept);

	if (err != want)
		tap_diag("%s: got %s", name, strerror(err));
	tap_result(err == want && kept, name);
}

int main(void)
{
	struct counts start, end;
	struct proc src, clone;
	struct reply r, a, b;
	char line[256];
	uint64_t addr;
	int from, to, err, ok, i, ev;
	bool settled;

	tap_plan(11);
	source_shm_size = SHM_SIZE;
	if (source_start(&src, 1 << 20, 0) || call(&src, 'M', 0, 0, &r)) {
		tap_diag("no source");
		return KSFT_FAIL;
	}
	addr = r.v[0];

	source_stop(&src, STOP_SIGSTOP);
	from = source_memfd(&src);
	to = copy_of(from, 0);
	{
		struct graft_opts o = { .remap_from = from, .remap_to = to, .close_from = CLOSE_FROM };

		graft_start(&clone, &src, &o);
	}
	err = graft_wait(&clone);
	source_resume(&src, STOP_SIGSTOP);
	tap_result(!err, "a graft remapping the source's shared memfd onto a copy succeeds");
	if (err) {
		tap_diag("graft: %s", strerror(-err));
		proc_end(&src);
		return tap_exit();
	}

	ok = maps_line(clone.pid, addr, line, sizeof(line)) && strstr(line, "/memfd:bunshin-shm-copy") &&
	     strstr(line, "rw-s");
	tap_diag("clone: %s", ok ? line : "(no mapping at the address)");
	ok = ok && maps_line(src.pid, addr, line, sizeof(line)) && strstr(line, "/memfd:bunshin-shm ");
	tap_result(ok, "the clone maps the copy at the source's address, shared, read-write; the source its own");

	ok = 1;
	for (i = 0; i < SHM_SIZE && ok; i += 4093)
		ok = !call(&src, 'r', i, 0, &a) && !call(&clone, 'r', i, 0, &b) && a.v[0] == b.v[0];
	tap_result(ok, "the clone reads the source's bytes there");

	call(&src, 'w', 100, 0xAA, &r);
	call(&clone, 'w', 200, 0xBB, &r);
	ok = !call(&src, 'r', 200, 0, &a) && !call(&clone, 'r', 100, 0, &b) &&
	     a.v[0] == (uint8_t)(200 * 7 + 3) && b.v[0] == (uint8_t)(100 * 7 + 3);
	tap_result(ok, "a write on either side is not seen on the other");

	ok = pwrite(to, "\x5c", 1, 300) == 1 && !call(&clone, 'r', 300, 0, &b) && b.v[0] == 0x5c &&
	     !call(&src, 'r', 300, 0, &a) && a.v[0] == (uint8_t)(300 * 7 + 3);
	tap_result(ok, "the clone's mapping is the copy's file: a write through it is seen by the clone only");

	ok = fds_from(clone.pid, CLOSE_FROM) == 0;
	tap_result(ok, "the helper's descriptors from close_from up are closed; those below are the clone's");
	proc_end(&clone);
	close(to);

	to = copy_of(from, 4096);
	expect_refused(&src, from, to, EINVAL, "a copy of another size: EINVAL, and the helper runs on");
	close(to);
	ev = eventfd(0, 0);
	expect_refused(&src, from, ev, EINVAL, "a copy of another kind (an eventfd): EINVAL");
	close(ev);
	to = copy_of(from, 0);
	expect_refused(&src, from, 1000, EBADF, "a descriptor that is not open: EBADF");

	/* leaks: a hundred remapped grafts and a hundred refused ones (a leak per graft would be a hundred) */
	counts_read(&start);
	for (i = 0; i < 100; i++) {
		struct graft_opts o = { .remap_from = from, .remap_to = to, .close_from = CLOSE_FROM };
		int kept, size = copy_of(from, 4096);

		source_stop(&src, STOP_SIGSTOP);
		graft_start(&clone, &src, &o);
		err = graft_wait(&clone);
		proc_end(&clone);
		source_resume(&src, STOP_SIGSTOP);
		o.remap_to = size;
		err = err ? err : -refused(&src, &o, &kept);
		close(size);
		if (err != -EINVAL) {
			tap_diag("remapped graft %d: %s", i, strerror(-err));
			break;
		}
	}
	settled = counts_settle(&start, &end, 32);
	tap_diag("after 200 grafts: mm_struct %+ld, filp %+ld, sessions %ld", end.mm - start.mm,
		 end.filp - start.filp, end.sessions);
	tap_result(settled,
		   "a hundred remapped grafts and a hundred refused ones leave no mm_struct, file or module object");

	call(&src, 'p', 0, 0, &r);
	expect_refused(&src, from, to, EOPNOTSUPP,
		       "a private mapping of the file holding a page of its own: EOPNOTSUPP");
	close(to);
	close(from);
	proc_end(&src);
	return tap_exit();
}
