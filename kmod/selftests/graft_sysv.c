// SPDX-License-Identifier: GPL-2.0
/*
 * BUNSHIN_GRAFT_REMAP of SysV shared memory (X's MIT-SHM): the source maps a
 * removed private segment; the orchestrator makes a copy (a segment of its
 * own, the source's bytes in it), attaches it, and names the two segments'
 * files (opened through /proc/PID/map_files, which gives their shmem files)
 * in the graft. The clone's mapping is an attach of the copy, not of the
 * source's segment: its maps line names the copy's id, it reads the source's
 * bytes, a write on either side is not seen on the other, the copy counts the
 * clone's attach and the source's segment keeps its count, and shmdt() in the
 * clone detaches it. Nothing leaks over fifty such grafts.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <unistd.h>

#include "graft_lib.h"
#include "tap.h"

#define SHM_SIZE	(1 << 20)

struct copy {
	int id;
	uint8_t *at;
	int file;	/* its shmem file, through our attach's map_files entry */
};

static int map_files(pid_t pid, uint64_t addr, int flags)
{
	char path[96];

	snprintf(path, sizeof(path), "/proc/%d/map_files/%lx-%lx", pid, (unsigned long)addr,
		 (unsigned long)addr + SHM_SIZE);
	return open(path, flags | O_CLOEXEC);
}

/* a segment holding the bytes of the source's (its file @from), attached here */
static int copy_of(int from, struct copy *c)
{
	c->id = shmget(IPC_PRIVATE, SHM_SIZE, 0600);
	if (c->id < 0)
		return -1;
	c->at = shmat(c->id, NULL, 0);
	if (c->at == (void *)-1 || pread(from, c->at, SHM_SIZE, 0) != SHM_SIZE)
		return -1;
	c->file = map_files(getpid(), (uint64_t)(uintptr_t)c->at, O_RDWR);
	return c->file < 0 ? -1 : 0;
}

static void copy_end(struct copy *c)
{
	close(c->file);
	shmdt(c->at);
	shmctl(c->id, IPC_RMID, NULL);
}

static long nattch(int id)
{
	struct shmid_ds ds;

	return shmctl(id, IPC_STAT, &ds) ? -1 : (long)ds.shm_nattch;
}

/* the id in the maps line of @pid at @addr (SysV mappings show it as their inode), or -1 */
static long maps_shmid(pid_t pid, uint64_t addr)
{
	char path[64], line[256], want[32];
	unsigned long inode;
	long id = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", pid);
	snprintf(want, sizeof(want), "%lx-", (unsigned long)addr);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, want, strlen(want)) && strstr(line, "/SYSV") &&
		    sscanf(line, "%*s %*s %*s %*s %lu", &inode) == 1)
			id = (long)inode;
	fclose(f);
	return id;
}

int main(void)
{
	struct counts start, end;
	struct proc src, clone;
	struct reply r, a, b;
	struct copy c;
	uint64_t addr;
	long src_id;
	int from, err, ok, i;
	bool settled;

	tap_plan(7);
	source_shm_size = SHM_SIZE;
	source_sysv = true;
	if (source_start(&src, 1 << 20, 0) || call(&src, 'M', 0, 0, &r)) {
		tap_diag("no source");
		return KSFT_FAIL;
	}
	addr = r.v[0];
	src_id = maps_shmid(src.pid, addr);

	source_stop(&src, STOP_SIGSTOP);
	from = map_files(src.pid, addr, O_RDONLY);
	if (from < 0 || copy_of(from, &c)) {
		tap_diag("no copy: %s", strerror(errno));
		return KSFT_FAIL;
	}
	{
		struct graft_opts o = { .remap_from = from, .remap_to = c.file };

		graft_start(&clone, &src, &o);
	}
	err = graft_wait(&clone);
	source_resume(&src, STOP_SIGSTOP);
	tap_result(!err, "a graft remapping the source's SysV segment onto an attached copy succeeds");
	if (err) {
		tap_diag("graft: %s", strerror(-err));
		proc_end(&src);
		return tap_exit();
	}
	tap_diag("source segment %ld, copy %d, the clone maps %ld", src_id, c.id, maps_shmid(clone.pid, addr));
	tap_result(maps_shmid(clone.pid, addr) == c.id && maps_shmid(src.pid, addr) == src_id,
		   "the clone maps the copy at the source's address; the source its own segment");

	ok = 1;
	for (i = 0; i < SHM_SIZE && ok; i += 4093)
		ok = !call(&src, 'r', i, 0, &a) && !call(&clone, 'r', i, 0, &b) && a.v[0] == b.v[0];
	tap_result(ok, "the clone reads the source's bytes there");

	call(&src, 'w', 100, 0xAA, &r);
	call(&clone, 'w', 200, 0xBB, &r);
	ok = !call(&src, 'r', 200, 0, &a) && !call(&clone, 'r', 100, 0, &b) &&
	     a.v[0] == (uint8_t)(200 * 7 + 3) && b.v[0] == (uint8_t)(100 * 7 + 3) && c.at[200] == 0xBB;
	tap_result(ok, "a write on either side is not seen on the other; the clone's lands in the copy");

	shmdt(c.at);
	c.at = (void *)-1;
	tap_diag("attaches: copy %ld, source's segment %ld", nattch(c.id), nattch((int)src_id));
	tap_result(nattch(c.id) == 1 && nattch((int)src_id) == 1,
		   "the copy counts one attach, the clone's (the helper's went with its graft); the source's its own");
	ok = !call(&clone, 'D', 0, 0, &r) && r.v[0] == 0 && nattch(c.id) == 0;
	tap_result(ok, "shmdt() in the clone detaches it: the copy's attach count drops to 0");
	proc_end(&clone);
	close(c.file);
	shmctl(c.id, IPC_RMID, NULL);

	/* leaks: fifty grafts, each with its own copy */
	counts_read(&start);
	for (i = 0; i < 50; i++) {
		struct graft_opts o;

		if (copy_of(from, &c))
			break;
		o = (struct graft_opts){ .remap_from = from, .remap_to = c.file };
		source_stop(&src, STOP_SIGSTOP);
		graft_start(&clone, &src, &o);
		err = graft_wait(&clone);
		proc_end(&clone);
		source_resume(&src, STOP_SIGSTOP);
		copy_end(&c);
		if (err) {
			tap_diag("graft %d: %s", i, strerror(-err));
			break;
		}
	}
	settled = counts_settle(&start, &end, 16);
	tap_diag("after 50 grafts: mm_struct %+ld, filp %+ld, sessions %ld", end.mm - start.mm,
		 end.filp - start.filp, end.sessions);
	tap_result(settled,
		   "fifty grafts onto attached copies leave no mm_struct, file or module object");
	close(from);
	proc_end(&src);
	return tap_exit();
}
