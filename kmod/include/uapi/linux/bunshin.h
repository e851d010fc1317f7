/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * BunshinFork: graft a copy-on-write duplicate of a stopped process into the
 * calling process, across container boundaries.
 *
 * Usage: open /dev/bunshin, negotiate with BUNSHIN_IOC_API, then either call
 * BUNSHIN_IOC_GRAFT from a single-threaded caller, or first park every other
 * thread of the caller in BUNSHIN_IOC_GRAFT_THREAD on the same file and then
 * call BUNSHIN_IOC_GRAFT from the remaining one. One graft per open file.
 */
#ifndef _UAPI_LINUX_BUNSHIN_H
#define _UAPI_LINUX_BUNSHIN_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define BUNSHIN_API		((__u64)1)

/* The source may be named by a pidfd (BUNSHIN_GRAFT_PIDFD). */
#define BUNSHIN_FEATURE_PIDFD	((__u64)1 << 0)
/* Multi-threaded sources: BUNSHIN_IOC_GRAFT_THREAD. */
#define BUNSHIN_FEATURE_THREADS	((__u64)1 << 1)
/* BUNSHIN_GRAFT_CLOSE: the helper's own descriptors closed by a graft that succeeds. */
#define BUNSHIN_FEATURE_CLOSE	((__u64)1 << 2)
/* BUNSHIN_GRAFT_REMAP: the clone maps its own copies of files the source maps. */
#define BUNSHIN_FEATURE_REMAP	((__u64)1 << 3)
/* BUNSHIN_GRAFT_HOLD, BUNSHIN_IOC_RELEASE and poll(): a clone tree started at once. */
#define BUNSHIN_FEATURE_HOLD	((__u64)1 << 4)

struct bunshin_api {
	__u64 api;		/* in: BUNSHIN_API */
	__u64 features;		/* in: features wanted; out: features supported */
	__u64 ioctls;		/* out: 1 << _IOC_NR(cmd) for every ioctl supported */
};

/* @source is a pidfd instead of a pid in the caller's pid namespace. */
#define BUNSHIN_GRAFT_PIDFD	(1U << 0)
/*
 * BUNSHIN_IOC_GRAFT only: once the graft has succeeded, every descriptor of
 * the caller numbered @close_from or above is closed (the helper's own: this
 * file, the pidfd, the remap files), so that the clone's file table is the
 * one the orchestrator rebuilt below @close_from. A failed graft closes none.
 */
#define BUNSHIN_GRAFT_CLOSE	(1U << 1)
/*
 * BUNSHIN_IOC_GRAFT only: every mapping of the source whose file is the file
 * of a @remap entry's @from maps the entry's @to in the clone instead, at the
 * same offset and with the same protections. This is how a clone gets its own
 * shared memory (memfd, /dev/shm) rather than the source's: the orchestrator
 * makes @to a copy of @from. Both must be of the same kind (file operations)
 * and size; a private mapping of @from holding private pages is refused.
 */
#define BUNSHIN_GRAFT_REMAP	(1U << 2)
/*
 * BUNSHIN_IOC_GRAFT only: a graft that succeeds does not return to the
 * clone's code (nor do its parked threads) until the file is released with
 * BUNSHIN_IOC_RELEASE by anyone holding it (the orchestrator keeps a copy of
 * the helper's file); the wait is killable, and freezable: a clone released
 * into a frozen cgroup runs no instruction before it is thawed. poll() on the
 * file reports EPOLLIN once the graft is done and every thread of the clone
 * has taken its source thread's state (the source may run from then on; the
 * grafting ioctl itself returns no earlier), with EPOLLERR if it failed.
 */
#define BUNSHIN_GRAFT_HOLD	(1U << 3)
#define BUNSHIN_GRAFT_FLAGS	(BUNSHIN_GRAFT_PIDFD | BUNSHIN_GRAFT_CLOSE | BUNSHIN_GRAFT_REMAP | \
				 BUNSHIN_GRAFT_HOLD)

#define BUNSHIN_REMAP_MAX	4096

struct bunshin_remap {
	__s32 from;		/* a descriptor (of the caller) of a file the source maps */
	__s32 to;		/* a descriptor of the file the clone maps instead */
};

struct bunshin_graft {
	__u32 flags;		/* BUNSHIN_GRAFT_* */
	__s32 source;		/* pid (caller's pid namespace) or pidfd of the source */
	__u32 tid;		/* thread to take the CPU state of, numbered in the
				 * source's own pid namespace; 0: the task @source names
				 */
	__u32 close_from;	/* BUNSHIN_GRAFT_CLOSE: first descriptor closed; else zero */
	__u64 remap;		/* BUNSHIN_GRAFT_REMAP: user address of the entries; else zero */
	__u32 nr_remap;		/* BUNSHIN_GRAFT_REMAP: 1..BUNSHIN_REMAP_MAX entries; else zero */
	__u32 reserved;		/* must be zero */
};

#define BUNSHIN_IOC_MAGIC	0xB7
#define BUNSHIN_IOC_API		_IOWR(BUNSHIN_IOC_MAGIC, 0x00, struct bunshin_api)
#define BUNSHIN_IOC_GRAFT	_IOW(BUNSHIN_IOC_MAGIC, 0x01, struct bunshin_graft)
#define BUNSHIN_IOC_GRAFT_THREAD	_IOW(BUNSHIN_IOC_MAGIC, 0x02, struct bunshin_graft)
#define BUNSHIN_IOC_RELEASE	_IO(BUNSHIN_IOC_MAGIC, 0x03)

#endif /* _UAPI_LINUX_BUNSHIN_H */
