// SPDX-License-Identifier: GPL-2.0
/*
 * DOC: a graft, step by step
 *
 * BUNSHIN_IOC_GRAFT, in the calling thread:
 *
 *   source   resolve the source, check the ptrace rule and that it is stopped
 *   park     wait until every other thread of the caller is parked in
 *            BUNSHIN_IOC_GRAFT_THREAD on this file, then commit
 *   capture  copy the source thread's CPU state (allocates all the rest needs)
 *   dup      duplicate the source's address space, copy-on-write, move the
 *            mappings named for remapping onto their copies (remap.c), and
 *            check the source stayed stopped
 *   switch   move the caller onto the duplicate          (point of no return)
 *   apply    give the caller the captured CPU state, release parked threads,
 *            close the helper's own descriptors (BUNSHIN_GRAFT_CLOSE), and
 *            wait for the file's release (BUNSHIN_GRAFT_HOLD)
 *
 * Until the switch a failure undoes exactly what was done and the caller goes
 * on as before; the source is never written to. After the switch the caller's
 * old address space is gone, so a failure there kills it (SIGKILL), cleanly.
 *
 * BUNSHIN_IOC_GRAFT_THREAD parks its thread until the graft is done, then
 * captures its source thread's state, switches onto the graft's address space
 * and applies the state. If the graft failed, it returns the graft's error;
 * a thread whose source is refused fails the whole graft with its error. A
 * thread that cannot follow a graft that is done is killed, and its group
 * with it: no thread may run on in the old address space beside the clone.
 */
#include <linux/fdtable.h>
#include <linux/file.h>
#include <linux/nsproxy.h>
#include <linux/poll.h>
#include <linux/pid.h>
#include <linux/time_namespace.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>

#include "internal.h"

struct bunshin_session *bunshin_session_new(struct file *file)
{
	struct bunshin_session *s = kzalloc(sizeof(*s), GFP_KERNEL);

	if (!s)
		return NULL;
	s->file = file;
	mutex_init(&s->lock);
	init_waitqueue_head(&s->wq);
	s->state = BUNSHIN_SESSION_NEW;
	atomic_inc(&bunshin_live_sessions);
	return s;
}

void bunshin_session_free(struct bunshin_session *s)
{
	if (s->mm)
		mmput(s->mm);
	put_pid(s->source);
	put_pid(s->caller);
	mutex_destroy(&s->lock);
	kfree(s);
	atomic_dec(&bunshin_live_sessions);
}

/* Every thread using a session belongs to one thread group, the first's. */
static int bunshin_session_join(struct bunshin_session *s)
{
	struct pid *me = task_tgid(current);

	if (!s->caller)
		s->caller = get_pid(me);
	return s->caller == me ? 0 : -EINVAL;
}

/*
 * Enter the session as a grafting thread (or, @parking, a parked one);
 * @req_hold: the graft's BUNSHIN_GRAFT_HOLD.
 */
static int bunshin_session_enter(struct bunshin_session *s, bool parking, bool req_hold)
{
	int err = mutex_lock_killable(&s->lock);

	if (err)
		return err;
	switch (s->state) {
	case BUNSHIN_SESSION_READY:
		err = bunshin_session_join(s);
		break;
	case BUNSHIN_SESSION_GRAFTING:
		err = parking ? bunshin_session_join(s) : -EINVAL;
		break;
	case BUNSHIN_SESSION_FAILED:
		/* the graft failed (a thread's source was refused, say): its error */
		err = s->error;
		break;
	default:
		/* before BUNSHIN_IOC_API, or the file's one graft was already made */
		err = -EINVAL;
	}
	if (!err) {
		if (parking) {
			s->parked++;
		} else {
			s->state = BUNSHIN_SESSION_GRAFTING;
			s->hold = req_hold;
		}
	}
	mutex_unlock(&s->lock);
	if (!err)
		wake_up_all(&s->wq);
	return err;
}

static void bunshin_session_finish(struct bunshin_session *s, struct bunshin_source *src,
				   struct mm_struct *mm, int err)
{
	/* an interrupted wait's restart code means nothing to the other threads */
	if (err == -ERESTARTSYS)
		err = -EINTR;
	mutex_lock(&s->lock);
	if (err) {
		s->state = BUNSHIN_SESSION_FAILED;
		s->error = err;
	} else {
		s->state = BUNSHIN_SESSION_DONE;
		s->source = get_pid(src->group);
		s->capturing = s->parked;
		if (s->parked) {
			mmget(mm);
			s->mm = mm;
		}
	}
	mutex_unlock(&s->lock);
	wake_up_all(&s->wq);
}

/*
 * BUNSHIN_GRAFT_HOLD: a grafted thread waits here, past the point of no
 * return, until the file is released. Freezable, so that a clone released
 * into a frozen cgroup traps into the freezer before its first instruction;
 * killable, and a fatal signal ends the wait (the thread dies on its way out).
 */
static void bunshin_session_hold(struct bunshin_session *s)
{
	if (READ_ONCE(s->hold))
		wait_event_state(s->wq, READ_ONCE(s->released), (TASK_KILLABLE | TASK_FREEZABLE));
}

/* A parked thread took its source thread's state (or failed to): one fewer to wait for. */
static void bunshin_session_captured(struct bunshin_session *s)
{
	mutex_lock(&s->lock);
	if (s->capturing)
		s->capturing--;
	mutex_unlock(&s->lock);
	wake_up_all(&s->wq);
}

long bunshin_session_release(struct bunshin_session *s)
{
	mutex_lock(&s->lock);
	s->released = true;
	mutex_unlock(&s->lock);
	wake_up_all(&s->wq);
	return 0;
}

__poll_t bunshin_session_poll(struct bunshin_session *s)
{
	switch (READ_ONCE(s->state)) {
	case BUNSHIN_SESSION_DONE:
		/* done: every thread of the clone has its state, the source may run */
		return READ_ONCE(s->capturing) ? 0 : EPOLLIN | EPOLLRDNORM;
	case BUNSHIN_SESSION_FAILED:
		return EPOLLIN | EPOLLRDNORM | EPOLLERR;
	default:
		return 0;
	}
}

static bool bunshin_all_parked(struct bunshin_session *s)
{
	return READ_ONCE(s->parked) + 1 >= get_nr_threads(current) ||
	       READ_ONCE(s->state) == BUNSHIN_SESSION_FAILED;
}

/* A thread whose source is refused fails its own group's graft, until that commits. */
static void bunshin_session_refuse(struct bunshin_session *s, int err)
{
	mutex_lock(&s->lock);
	if ((s->state == BUNSHIN_SESSION_READY || s->state == BUNSHIN_SESSION_GRAFTING) &&
	    !s->committed && !bunshin_session_join(s)) {
		s->state = BUNSHIN_SESSION_FAILED;
		s->error = err;
	}
	mutex_unlock(&s->lock);
	wake_up_all(&s->wq);
}

/*
 * Wait until every other thread of the caller is parked (re-checking now and
 * then: a thread that exits instead does not wake us), then commit: from here
 * on no refused thread can fail the graft.
 */
static int bunshin_session_commit(struct bunshin_session *s)
{
	long left;
	int err = 0;

	while (!bunshin_all_parked(s)) {
		left = wait_event_killable_timeout(s->wq, bunshin_all_parked(s), HZ / 10);
		if (left < 0)
			return left;
	}
	mutex_lock(&s->lock);
	if (s->state == BUNSHIN_SESSION_FAILED)
		err = s->error;		/* a parked thread's source was refused */
	else
		s->committed = true;
	mutex_unlock(&s->lock);
	return err;
}

/*
 * BUNSHIN_GRAFT_CLOSE: close the caller's descriptors from @fd up. The files'
 * last references are dropped by task work, after the ioctl returns, so this
 * very file may be among them.
 */
static void bunshin_close_from(unsigned int fd)
{
	struct files_struct *files = current->files;
	unsigned int max;
	struct file *file;

	spin_lock(&files->file_lock);
	max = files_fdtable(files)->max_fds;
	spin_unlock(&files->file_lock);
	for (; fd < max; fd++) {
		file = close_fd_get_file(fd);
		if (file)
			filp_close(file, files);
	}
}

long bunshin_graft(struct bunshin_session *s, const struct bunshin_graft *req,
		   const struct bunshin_remap_table *remap)
{
	struct bunshin_source src;
	struct bunshin_cpu *cpu;
	struct mm_struct *mm;
	int err;

	err = bunshin_session_enter(s, false, req->flags & BUNSHIN_GRAFT_HOLD);
	if (err)
		return err;
	err = bunshin_source_get(req, &src);
	if (err)
		goto fail;
	err = bunshin_session_commit(s);
	if (err)
		goto put_source;
	err = -EINVAL;
	if (refcount_read(&current->sighand->count) != get_nr_threads(current))
		goto put_source;	/* handlers shared with another process */

	cpu = bunshin_cpu_capture(src.thread, true);
	if (IS_ERR(cpu)) {
		err = PTR_ERR(cpu);
		goto put_source;
	}
	mm = bunshin_mm_dup(src.mm);
	if (IS_ERR(mm)) {
		err = PTR_ERR(mm);
		goto free_cpu;
	}
	err = bunshin_remap_apply(mm, remap);
	if (err)
		goto put_mm;
	/* the copy is of a stopped source only if it stayed stopped throughout */
	err = -EBUSY;
	if (!bunshin_group_stopped(src.thread->group_leader))
		goto put_mm;
	err = bunshin_mm_switch(mm, true);
	if (err)
		goto put_mm;
#ifdef CONFIG_TIME_NS
	/* the vvar pages were copied as the source's: fault them in for our time namespace */
	bunshin_syms.vdso_join_timens(current, current->nsproxy->time_ns);
#endif

	if (bunshin_fault(BUNSHIN_FAULT_STATE)) {
		bunshin_cpu_free(cpu);
		err = -ENOMEM;
		force_sig(SIGKILL);
		goto put_source;
	}
	bunshin_cpu_apply(cpu, s->file);
	bunshin_session_finish(s, &src, mm, 0);
	/*
	 * Return (and report the graft done to poll()) only once every parked
	 * thread has taken its state: from then on the source may run. A thread
	 * that cannot kills the group, this wait with it.
	 */
	wait_event_killable(s->wq, !READ_ONCE(s->capturing));
	bunshin_source_put(&src);
	if (req->flags & BUNSHIN_GRAFT_CLOSE)
		bunshin_close_from(req->close_from);
	bunshin_session_hold(s);
	return 0;

put_mm:
	mmput(mm);
free_cpu:
	bunshin_cpu_free(cpu);
put_source:
	bunshin_source_put(&src);
fail:
	bunshin_session_finish(s, NULL, NULL, err);
	return err;
}

/* Leave the park; return the graft's mm with a reference of our own. */
static struct mm_struct *bunshin_session_adopt(struct bunshin_session *s,
					       struct bunshin_source *src)
{
	struct mm_struct *mm = NULL, *last = NULL;
	int err = 0;

	mutex_lock(&s->lock);
	if (s->state == BUNSHIN_SESSION_FAILED)
		err = s->error;
	else if (src->group != s->source)
		err = -EINVAL;	/* a thread of another source */
	else
		mm = s->mm;
	if (mm)
		mmget(mm);
	if (--s->parked == 0) {
		last = s->mm;
		s->mm = NULL;
	}
	mutex_unlock(&s->lock);
	if (last)
		mmput(last);
	return err ? ERR_PTR(err) : mm;
}

long bunshin_graft_thread(struct bunshin_session *s, const struct bunshin_graft *req)
{
	struct bunshin_source src;
	struct bunshin_cpu *cpu;
	struct mm_struct *mm;
	int err;

	err = bunshin_source_get(req, &src);
	if (err) {
		bunshin_session_refuse(s, err);
		return err;
	}
	err = bunshin_session_enter(s, true, false);
	if (err)
		goto put_source;
	/* killable only: a parked thread is part of its group's graft */
	err = wait_event_killable(s->wq, READ_ONCE(s->state) >= BUNSHIN_SESSION_DONE);
	mm = bunshin_session_adopt(s, &src);
	if (IS_ERR(mm)) {
		err = PTR_ERR(mm);
		/* a thread of another source, beside a graft that is done */
		if (READ_ONCE(s->state) == BUNSHIN_SESSION_DONE)
			force_sig(SIGKILL);
		goto put_source;
	}
	if (err)
		goto kill;

	/*
	 * The graft is done and our group runs on its address space: a thread
	 * that cannot follow must not run on in the old one (SIGKILL, the group).
	 */
	cpu = bunshin_cpu_capture(src.thread, false);
	bunshin_session_captured(s);
	if (IS_ERR(cpu)) {
		err = PTR_ERR(cpu);
		goto kill;
	}
	err = bunshin_mm_switch(mm, false);
	if (err) {
		bunshin_cpu_free(cpu);
		goto kill;
	}
	bunshin_cpu_apply(cpu, s->file);
	bunshin_source_put(&src);
	bunshin_session_hold(s);
	return 0;

kill:
	force_sig(SIGKILL);
	mmput(mm);
put_source:
	bunshin_source_put(&src);
	return err;
}
