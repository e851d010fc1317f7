/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Internal interfaces of the BunshinFork module: one section per file.
 */
#ifndef _BUNSHIN_INTERNAL_H
#define _BUNSHIN_INTERNAL_H

#include <linux/mm_types.h>
#include <linux/mutex.h>
#include <linux/sched.h>
#include <linux/wait.h>
#include <uapi/linux/bunshin.h>

/* symbols.c: kernel helpers that are not exported, resolved at load time */
struct pid_namespace;
struct sighand_struct;
struct time_namespace;

struct bunshin_syms {
	struct kmem_cache **mm_cachep;
	struct mm_struct *(*mm_init)(struct mm_struct *mm, struct task_struct *p,
				     struct user_namespace *user_ns);
	int (*dup_mmap)(struct mm_struct *mm, struct mm_struct *oldmm);
	void (*exec_mm_release)(struct task_struct *tsk, struct mm_struct *mm);
	void (*sync_mm_rss)(struct mm_struct *mm);
	void (*switch_mm)(struct mm_struct *prev, struct mm_struct *next,
			  struct task_struct *tsk);
	void (*lru_gen_add_mm)(struct mm_struct *mm);
	void (*mm_update_next_owner)(struct mm_struct *mm);
	struct mm_struct *(*mm_access)(struct task_struct *task, unsigned int mode);
	unsigned long (*wait_task_inactive)(struct task_struct *p, unsigned int match_state);
	long (*do_arch_prctl_64)(struct task_struct *task, int option, unsigned long arg2);
	unsigned long (*fsbase_read_task)(struct task_struct *task);
	unsigned long (*gsbase_read_task)(struct task_struct *task);
	struct pid *(*pidfd_get_pid)(unsigned int fd, unsigned int *flags);
	struct sighand_struct *(*lock_task_sighand)(struct task_struct *task,
						    unsigned long *flags);
	void (*set_task_comm)(struct task_struct *tsk, const char *from, bool exec);
	void (*put_task_stack)(struct task_struct *tsk);
	int (*vdso_join_timens)(struct task_struct *task, struct time_namespace *ns);
	void (*vma_interval_tree_insert)(struct vm_area_struct *node, struct rb_root_cached *root);
	void (*vma_interval_tree_remove)(struct vm_area_struct *node, struct rb_root_cached *root);
};

extern struct bunshin_syms bunshin_syms;
int bunshin_syms_resolve(void);

/* fault.c: named fault points, armed through debugfs, and live-object counters */
enum bunshin_fault_step {
	BUNSHIN_FAULT_NONE,
	BUNSHIN_FAULT_ALLOC,	/* allocating the CPU state and the mm_struct */
	BUNSHIN_FAULT_INIT,	/* initialising the new mm (page directory, context) */
	BUNSHIN_FAULT_COPY,	/* copying the VMAs and page tables */
	BUNSHIN_FAULT_STATE,	/* transferring the CPU state after the switch */
	BUNSHIN_FAULT_NR,
};

bool bunshin_fault(enum bunshin_fault_step step);
int bunshin_debugfs_init(void);
void bunshin_debugfs_exit(void);

extern atomic_t bunshin_live_sessions;
extern atomic_t bunshin_live_states;

/* source.c: finding the source, the permission rule and the stopped check */
struct bunshin_source {
	struct task_struct *thread;	/* whose CPU state is taken */
	struct pid *group;		/* the source's thread group */
	struct mm_struct *mm;		/* its address space, mm_users held */
};

int bunshin_source_get(const struct bunshin_graft *req, struct bunshin_source *src);
bool bunshin_thread_stopped(struct task_struct *t);
bool bunshin_group_stopped(struct task_struct *leader);
void bunshin_source_put(struct bunshin_source *src);

/* mm.c: the copy-on-write duplicate and the switch onto it */
struct mm_struct *bunshin_mm_dup(struct mm_struct *oldmm);
int bunshin_mm_switch(struct mm_struct *mm, bool new_mm);

/* cpu.c: a stopped thread's user-visible CPU state, captured then applied */
struct bunshin_cpu;

struct bunshin_cpu *bunshin_cpu_capture(struct task_struct *t, bool with_handlers);
void bunshin_cpu_apply(struct bunshin_cpu *cpu, struct file *file);
void bunshin_cpu_free(struct bunshin_cpu *cpu);

/* remap.c: the clone's own copies of files the source maps (BUNSHIN_GRAFT_REMAP) */
struct bunshin_remap_table;

struct bunshin_remap_table *bunshin_remap_get(const struct bunshin_graft *req);
int bunshin_remap_apply(struct mm_struct *mm, const struct bunshin_remap_table *t);
void bunshin_remap_put(struct bunshin_remap_table *t);

/* graft.c: one open file, the graft it performs and the threads parked for it */
enum bunshin_session_state {
	BUNSHIN_SESSION_NEW,		/* BUNSHIN_IOC_API not called yet */
	BUNSHIN_SESSION_READY,
	BUNSHIN_SESSION_GRAFTING,
	BUNSHIN_SESSION_DONE,
	BUNSHIN_SESSION_FAILED,
};

struct bunshin_session {
	struct file *file;		/* the open /dev/bunshin this session is */
	struct mutex lock;		/* protects every field below but wq */
	enum bunshin_session_state state;
	int error;			/* why the graft failed, for parked threads */
	bool committed;			/* the graft is past waiting: no thread can fail it now */
	struct pid *caller;		/* thread group of the first caller */
	struct pid *source;		/* thread group grafted */
	struct mm_struct *mm;		/* the copy, held while parked threads adopt it */
	unsigned int parked;		/* threads waiting in BUNSHIN_IOC_GRAFT_THREAD */
	unsigned int capturing;		/* parked threads yet to take their source thread's state */
	bool hold;			/* BUNSHIN_GRAFT_HOLD: the clone waits for a release */
	bool released;			/* BUNSHIN_IOC_RELEASE was called */
	wait_queue_head_t wq;
};

struct bunshin_session *bunshin_session_new(struct file *file);
void bunshin_session_free(struct bunshin_session *s);
long bunshin_graft(struct bunshin_session *s, const struct bunshin_graft *req,
		   const struct bunshin_remap_table *remap);
long bunshin_graft_thread(struct bunshin_session *s, const struct bunshin_graft *req);
long bunshin_session_release(struct bunshin_session *s);
__poll_t bunshin_session_poll(struct bunshin_session *s);

#endif /* _BUNSHIN_INTERNAL_H */
