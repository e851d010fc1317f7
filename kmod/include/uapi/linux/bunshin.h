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

struct bunshin_api {
	__u64 api;		/* in: BUNSHIN_API */
	__u64 features;		/* in: features wanted; out: features supported */
	__u64 ioctls;		/* out: 1 << _IOC_NR(cmd) for every ioctl supported */
};

/* @source is a pidfd instead of a pid in the caller's pid namespace. */
#define BUNSHIN_GRAFT_PIDFD	(1U << 0)
#define BUNSHIN_GRAFT_FLAGS	(BUNSHIN_GRAFT_PIDFD)

struct bunshin_graft {
	__u32 flags;		/* BUNSHIN_GRAFT_* */
	__s32 source;		/* pid (caller's pid namespace) or pidfd of the source */
	__u32 tid;		/* thread to take the CPU state of, numbered in the
				 * source's own pid namespace; 0: the task @source names
				 */
	__u32 reserved0;	/* must be zero */
	__u64 reserved[2];	/* must be zero */
};

#define BUNSHIN_IOC_MAGIC	0xB7
#define BUNSHIN_IOC_API		_IOWR(BUNSHIN_IOC_MAGIC, 0x00, struct bunshin_api)
#define BUNSHIN_IOC_GRAFT	_IOW(BUNSHIN_IOC_MAGIC, 0x01, struct bunshin_graft)
#define BUNSHIN_IOC_GRAFT_THREAD	_IOW(BUNSHIN_IOC_MAGIC, 0x02, struct bunshin_graft)

#endif /* _UAPI_LINUX_BUNSHIN_H */
