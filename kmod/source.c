// SPDX-License-Identifier: GPL-2.0
/*
 * DOC: the source of a graft
 *
 * The source is named by a pid in the caller's pid namespace or by a pidfd,
 * which is how a caller in a sibling container names a process it cannot see.
 * The thread whose CPU state is taken may be picked by its id in the source's
 * own pid namespace. The caller must be allowed to ptrace-attach to the source
 * (mm_access(), the rule process_vm_readv() applies), so a graft never gives
 * anyone access they did not have. Every thread of the source must be stopped:
 * frozen (either cgroup freezer), in a group stop or in a ptrace stop.
 */
#include <linux/mm.h>
#include <linux/pid.h>
#include <linux/pid_namespace.h>
#include <linux/ptrace.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/sched/task.h>
#include <linux/userfaultfd_k.h>

#include "internal.h"

bool bunshin_thread_stopped(struct task_struct *t)
{
	unsigned int state = READ_ONCE(t->__state);

	if (t->flags & PF_EXITING)
		return false;
	if (state & (__TASK_STOPPED | __TASK_TRACED | TASK_FROZEN))
		return true;
	/*
	 * The cgroup v2 freezer parks its tasks in do_freezer_trap(); ->frozen
	 * alone is also set for a vfork parent, which may wake at any time.
	 */
	return t->frozen && (READ_ONCE(t->jobctl) & JOBCTL_TRAP_FREEZE);
}

bool bunshin_group_stopped(struct task_struct *leader)
{
	struct task_struct *t;
	bool stopped = true;

	rcu_read_lock();
	for_each_thread(leader, t) {
		if (!bunshin_thread_stopped(t)) {
			stopped = false;
			break;
		}
	}
	rcu_read_unlock();
	return stopped;
}

/*
 * A source with userfaultfd-registered ranges is refused: dup_mmap() would
 * hand the source's monitor a userfaultfd on the clone (a fork event) and
 * wait for the monitor to read it.
 */
static int bunshin_mm_check(struct mm_struct *mm)
{
	struct vm_area_struct *vma;
	int err = mmap_read_lock_killable(mm);

	if (err)
		return err;
	for (vma = find_vma(mm, 0); vma; vma = find_vma(mm, vma->vm_end)) {
		if (!userfaultfd_missing(vma) && !userfaultfd_wp(vma) && !userfaultfd_minor(vma))
			continue;
		err = -EOPNOTSUPP;
		break;
	}
	mmap_read_unlock(mm);
	return err;
}

static struct pid *bunshin_source_pid(const struct bunshin_graft *req)
{
	unsigned int f_flags;
	struct pid *pid;

	if (req->flags & BUNSHIN_GRAFT_PIDFD)
		return bunshin_syms.pidfd_get_pid(req->source, &f_flags);
	if (req->source <= 0)
		return ERR_PTR(-EINVAL);
	pid = find_get_pid(req->source);
	return pid ? pid : ERR_PTR(-ESRCH);
}

/* thread @tid of @task's group, numbered in @ns (the pid namespace of the source's pid) */
static struct task_struct *bunshin_source_thread(struct task_struct *task, struct pid_namespace *ns,
						 u32 tid)
{
	struct task_struct *t;

	if (!tid)
		return task;
	rcu_read_lock();
	t = pid_task(find_pid_ns(tid, ns), PIDTYPE_PID);
	if (t && same_thread_group(t, task))
		get_task_struct(t);
	else
		t = NULL;
	rcu_read_unlock();
	put_task_struct(task);
	return t;
}

/**
 * bunshin_source_get() - resolve, check and pin the source of @req
 * @req: the validated request
 * @src: filled in on success; release with bunshin_source_put()
 *
 * Return: 0; -EINVAL for a pid that cannot be one, the caller itself or a
 * kernel thread; -EBADF for a bad pidfd; -ESRCH for a source that is gone;
 * -EPERM when the caller may not ptrace-attach to it; -EBUSY when a thread of
 * it is running; -EOPNOTSUPP for one with userfaultfd-registered ranges.
 */
int bunshin_source_get(const struct bunshin_graft *req, struct bunshin_source *src)
{
	struct task_struct *task;
	struct mm_struct *mm;
	struct pid *pid;
	int err;

	pid = bunshin_source_pid(req);
	if (IS_ERR(pid))
		return PTR_ERR(pid);
	task = get_pid_task(pid, PIDTYPE_PID);
	if (task)
		task = bunshin_source_thread(task, ns_of_pid(pid), req->tid);
	put_pid(pid);
	if (!task)
		return -ESRCH;

	err = -EINVAL;
	if (task->flags & (PF_KTHREAD | PF_IO_WORKER) || same_thread_group(task, current))
		goto put_task;

	mm = bunshin_syms.mm_access(task, PTRACE_MODE_ATTACH_REALCREDS);
	if (IS_ERR(mm)) {
		err = PTR_ERR(mm);
		goto put_task;
	}
	err = -EBUSY;
	if (!bunshin_group_stopped(task->group_leader))
		goto put_mm;
	err = bunshin_mm_check(mm);
	if (err)
		goto put_mm;

	src->thread = task;
	src->group = get_task_pid(task, PIDTYPE_TGID);
	src->mm = mm;
	return 0;

put_mm:
	mmput(mm);
put_task:
	put_task_struct(task);
	/* as process_vm_readv(): EPERM is the error for a denied ptrace check */
	return err == -EACCES ? -EPERM : err;
}

void bunshin_source_put(struct bunshin_source *src)
{
	mmput(src->mm);
	put_pid(src->group);
	put_task_struct(src->thread);
}
