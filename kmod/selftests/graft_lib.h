/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What the graft selftests share: a source program that holds a region of
 * known bytes and answers commands on a pipe (it sits blocked in read() while
 * idle, so every graft restarts a read), ways to stop it, a helper that
 * grafts it into itself (in other namespaces if asked), and readers of
 * /proc/PID/pagemap, smaps_rollup and the cgroup files.
 */
#ifndef BUNSHIN_GRAFT_LIB_H
#define BUNSHIN_GRAFT_LIB_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "../include/uapi/linux/bunshin.h"

#define CMD_FD	10	/* the source reads its commands here (the clone too) */
#define OUT_FD	11	/* and writes its replies here */

struct cmd {
	char op;
	uint64_t a, b;
};

struct reply {
	char op;		/* the command's op, or 'E' from a helper whose graft failed */
	int64_t v[4];
};

/* what the source's threads share, at the address 'A' replies with (v[1]) */
struct shared {
	volatile uint64_t spins;	/* a thread spinning in user space, registers checked */
	volatile uint64_t naps;		/* a thread looping in nanosleep() */
	volatile uint64_t waits;	/* a thread looping in pthread_cond_timedwait() */
	volatile uint64_t bad;		/* set by a thread that found its state corrupted */
	volatile uint64_t usr1;		/* SIGUSR1 deliveries to the handler */
};

struct proc {
	pid_t pid;
	int cmd;	/* write commands here */
	int out;	/* read replies here */
};

enum stop_kind {
	STOP_SIGSTOP,		/* a group stop */
	STOP_PTRACE,		/* PTRACE_INTERRUPT: a ptrace stop in get_signal() */
	STOP_SYSCALL_ENTRY,	/* PTRACE_SYSCALL: stopped at the entry of read(), before it runs */
	STOP_FREEZER_V2,
	STOP_FREEZER_V1,
};

/* the uid the next source runs as (0: root), made dumpable again after setuid() */
extern uid_t source_uid;
/*
 * if non-zero, the next source also maps a memfd named "bunshin-shm" of this
 * size MAP_SHARED (commands 'M', 'r', 'w', 'p'); its descriptor is SHM_FD
 */
extern size_t source_shm_size;
#define SHM_FD	12
/*
 * if set, that region is a SysV segment instead (IPC_PRIVATE, removed once
 * attached, as X clients do): no SHM_FD; 'D' detaches it (shmdt())
 */
extern bool source_sysv;
/* if set (a MAP_SHARED word), the helper stores now_ns() there just before its GRAFT */
extern volatile uint64_t *graft_clock;

/* the source: @size bytes of pattern, @threads extra threads (0 or 3) */
int source_start(struct proc *src, size_t size, int threads);
int source_stop(struct proc *src, enum stop_kind kind);
int source_resume(struct proc *src, enum stop_kind kind);
const char *stop_name(enum stop_kind kind);

/* a round trip; returns 0 and fills @r, or -1 (timeout after 20 s, EOF) */
int call(struct proc *p, char op, uint64_t a, uint64_t b, struct reply *r);
void proc_end(struct proc *p);

#define HELPER_NEWNS		(1 << 0)	/* new pid, mount, net, uts, ipc namespaces */
#define HELPER_THREADS		(1 << 1)	/* park a thread per extra source thread */
#define HELPER_UNPRIVILEGED	(1 << 2)	/* drop to uid/gid 65534 after opening */
#define HELPER_BAD_THREAD	(1 << 3)	/* also park a thread naming a tid the source lacks */

struct graft_opts {
	int flags;
	const char *cgroup;		/* cgroup v2 directory to join, or NULL */
	char preload;			/* a command queued for the clone before the helper starts */
	int remap_from, remap_to;	/* if remap_to > 0: one BUNSHIN_GRAFT_REMAP entry (fds here) */
	unsigned int close_from;	/* if non-zero: BUNSHIN_GRAFT_CLOSE from this fd up */
	int session;			/* if > 0: the helper grafts on this open /dev/bunshin (the caller
					 * keeps it: poll(), BUNSHIN_IOC_RELEASE) instead of its own */
	int hold;			/* BUNSHIN_GRAFT_HOLD */
};

/* Start a helper that grafts @src into itself; the clone answers on @clone. */
int graft_start(struct proc *clone, struct proc *src, const struct graft_opts *o);
/*
 * Wait for the clone's answer to a ping: 0, or the graft's -errno; then
 * *@threads_back (if not NULL) is how many parked threads returned that errno.
 */
int graft_wait_threads(struct proc *clone, int *threads_back);
#define graft_wait(clone) graft_wait_threads(clone, NULL)

/* readers */
int other_threads(pid_t pid, uint32_t *tids, int max);	/* thread ids but the leader's */
int64_t pagemap_pfn(pid_t pid, uint64_t vaddr);
long smaps_value(pid_t pid, const char *field);	/* kB; -1 if absent */
long status_value(pid_t pid, const char *field);	/* kB; -1 if absent */
long file_long(const char *path, const char *key);	/* "key value" lines or a bare number */
int write_file(const char *path, const char *text);
int open_bunshin(void);
int api(int fd);

/* leak counters: mm_struct, vm_area_struct, task_struct, filp in use, module states */
struct counts {
	long mm, vma, task, filp, sessions, states;
};
void counts_read(struct counts *c);
/*
 * Read the counters into @end until nothing is left over since @start (at most
 * 4 mm_structs and @filp_slack files more, no module session or state: freed
 * objects go a little late), up to 32 times; whether it got there.
 */
bool counts_settle(const struct counts *start, struct counts *end, long filp_slack);

uint64_t now_ns(void);

#endif
