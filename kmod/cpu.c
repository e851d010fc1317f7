// SPDX-License-Identifier: GPL-2.0
/*
 * DOC: the CPU state a clone takes from its source thread
 *
 * A stopped thread's user-visible state lives in memory: its registers in the
 * pt_regs at the top of its kernel stack, its FPU and extended state in its
 * fpstate (saved when it was switched out), its fs and gs bases in its thread
 * struct, and its registrations (rseq, robust list, child-tid pointer, signal
 * stack, blocked mask, signal handlers, personality) in its task and sighand.
 * Capturing copies all of it, and allocates everything applying needs, while
 * the source is stopped; applying writes it into the calling thread and
 * cannot fail.
 *
 * The ioctl's own return value would overwrite the source's %rax (and
 * sys_ioctl() returns an int), so %rax and %orig_ax are set by a task work
 * that runs at the start of the caller's way back to user space (TWA_SIGNAL:
 * inside get_signal(), before any signal is handled). The kernel's own
 * restart logic then sees exactly what the source
 * would have seen: a thread stopped while blocked in read() has -ERESTARTSYS
 * in %rax and re-issues read() once it runs. A thread stopped before its
 * system call ran (at a PTRACE_SYSCALL entry stop, or frozen in place inside
 * a freezable sleep) still has the value the syscall entry put in %rax; it is
 * given -ERESTARTNOINTR so that the clone issues the call (a sleep restarts
 * with its full duration).
 */
#include <linux/ptrace.h>
#include <linux/sched/signal.h>
#include <linux/sched/task.h>
#include <linux/sched/task_stack.h>
#include <linux/signal.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/slab.h>
#include <linux/task_work.h>
#include <asm/fpu/api.h>
#include <asm/pkru.h>
#include <asm/prctl.h>
#include <asm/syscall.h>

#include "internal.h"

struct bunshin_resume {
	struct callback_head work;
	struct file *file;	/* /dev/bunshin, held so the module outlives the work */
	unsigned long ax;
	unsigned long orig_ax;
};

struct bunshin_cpu {
	struct pt_regs regs;
	unsigned long fsbase;
	unsigned long gsbase;
	u32 pkru;
	struct rseq __user *rseq;
	u32 rseq_sig;
	unsigned long rseq_event_mask;
	struct robust_list_head __user *robust_list;
#ifdef CONFIG_COMPAT
	struct compat_robust_list_head __user *compat_robust_list;
#endif
	int __user *clear_child_tid;
	unsigned long sas_ss_sp;
	size_t sas_ss_size;
	unsigned int sas_ss_flags;
	sigset_t blocked;
	struct restart_block restart_block;
	char comm[TASK_COMM_LEN];
	unsigned int personality;
	struct bunshin_resume *resume;
	struct k_sigaction *actions;	/* NULL: keep the caller's handlers */
	unsigned int fpsize;
	u8 fpregs[] __aligned(64);
};

/*
 * Runs in task_work_run(), from the module's text: the file reference keeps
 * the module loaded, and the final fput() only queues the file's release as
 * another task work, which runs after this function has returned.
 */
static void bunshin_resume_fn(struct callback_head *work)
{
	struct bunshin_resume *r = container_of(work, struct bunshin_resume, work);
	struct pt_regs *regs = current_pt_regs();
	struct file *file = r->file;

	regs->ax = r->ax;
	regs->orig_ax = r->orig_ax;
	kfree(r);
	atomic_dec(&bunshin_live_states);
	fput(file);
}

static int bunshin_cpu_capture_signals(struct task_struct *t, struct bunshin_cpu *c)
{
	struct sighand_struct *sighand;
	unsigned long flags;

	sighand = bunshin_syms.lock_task_sighand(t, &flags);
	if (!sighand)
		return -ESRCH;
	/* a thread stopped in sigsuspend() or ppoll() runs with a temporary mask */
	c->blocked = test_tsk_restore_sigmask(t) ? t->saved_sigmask : t->blocked;
	sigdelsetmask(&c->blocked, sigmask(SIGKILL) | sigmask(SIGSTOP));
	if (c->actions)
		memcpy(c->actions, sighand->action, sizeof(sighand->action));
	unlock_task_sighand(t, &flags);
	return 0;
}

static int bunshin_cpu_capture_regs(struct task_struct *t, struct bunshin_cpu *c)
{
	struct fpstate *fps = t->thread.fpu.fpstate;
	/*
	 * %rax of a system call still in flight: our own ioctl's is one, as
	 * the source's is when it was frozen in place or stopped at syscall entry
	 */
	unsigned long in_flight = current_pt_regs()->ax;

	c->regs = *task_pt_regs(t);
	if ((long)c->regs.orig_ax >= 0 && c->regs.ax == in_flight)
		c->regs.ax = (unsigned long)-ERESTARTNOINTR;
	/* a trap flag its tracer set for single-stepping is not the program's */
	if (test_tsk_thread_flag(t, TIF_FORCED_TF))
		c->regs.flags &= ~X86_EFLAGS_TF;
	c->fsbase = bunshin_syms.fsbase_read_task(t);
	c->gsbase = bunshin_syms.gsbase_read_task(t);
	c->pkru = t->thread.pkru;
	memcpy(c->fpregs, &fps->regs, c->fpsize);
	return 0;
}

static void bunshin_cpu_capture_task(struct task_struct *t, struct bunshin_cpu *c)
{
#ifdef CONFIG_RSEQ
	c->rseq = t->rseq;
	c->rseq_sig = t->rseq_sig;
	c->rseq_event_mask = t->rseq_event_mask;
#endif
#ifdef CONFIG_FUTEX
	c->robust_list = t->robust_list;
#ifdef CONFIG_COMPAT
	c->compat_robust_list = t->compat_robust_list;
#endif
#endif
	c->clear_child_tid = t->clear_child_tid;
	c->sas_ss_sp = t->sas_ss_sp;
	c->sas_ss_size = t->sas_ss_size;
	c->sas_ss_flags = t->sas_ss_flags;
	c->restart_block = t->restart_block;
	__get_task_comm(c->comm, sizeof(c->comm), t);
	c->personality = t->personality;
}

/**
 * bunshin_cpu_capture() - copy the user-visible CPU state of stopped thread @t
 * @t: a thread of the source, in a stopped state
 * @with_handlers: also copy the signal handlers (once per thread group)
 *
 * Return: the state, or ERR_PTR: -EOPNOTSUPP for a 32-bit source or one whose
 * extended state differs in size from the caller's (AMX permissions, say),
 * -EBUSY if @t woke up, -ENOMEM, -ESRCH if it is gone.
 */
struct bunshin_cpu *bunshin_cpu_capture(struct task_struct *t, bool with_handlers)
{
	struct fpstate *src_fps = t->thread.fpu.fpstate;
	struct fpstate *dst_fps = current->thread.fpu.fpstate;
	unsigned int state = READ_ONCE(t->__state);
	unsigned long switches;
	struct bunshin_cpu *c;
	int err;

	if (src_fps->size != dst_fps->size || src_fps->xfeatures != dst_fps->xfeatures ||
	    test_tsk_thread_flag(t, TIF_ADDR32))
		return ERR_PTR(-EOPNOTSUPP);
	if (bunshin_fault(BUNSHIN_FAULT_ALLOC))
		return ERR_PTR(-ENOMEM);

	c = kzalloc(struct_size(c, fpregs, src_fps->size), GFP_KERNEL);
	if (!c)
		return ERR_PTR(-ENOMEM);
	atomic_inc(&bunshin_live_states);
	c->fpsize = src_fps->size;
	err = -ENOMEM;
	c->resume = kmalloc(sizeof(*c->resume), GFP_KERNEL);
	if (!c->resume)
		goto free;
	atomic_inc(&bunshin_live_states);
	if (with_handlers) {
		c->actions = kmalloc_array(_NSIG, sizeof(*c->actions), GFP_KERNEL);
		if (!c->actions)
			goto free;
	}
	/* a thread that died has no stack, and so no pt_regs, to read */
	err = -ESRCH;
	if (!try_get_task_stack(t))
		goto free;

	/*
	 * The registers and fpstate in memory are current once @t is off its
	 * CPU; the copy holds if it is still stopped and was not switched in
	 * meanwhile (the same count of context switches before and after).
	 */
	err = -EBUSY;
	switches = bunshin_syms.wait_task_inactive(t, state);
	if (!switches || !bunshin_thread_stopped(t))
		goto put_stack;
	if (!user_64bit_mode(task_pt_regs(t))) {
		err = -EOPNOTSUPP;
		goto put_stack;
	}
	err = bunshin_cpu_capture_regs(t, c);
	if (err)
		goto put_stack;
	bunshin_cpu_capture_task(t, c);
	err = bunshin_cpu_capture_signals(t, c);
	if (err)
		goto put_stack;
	err = -EBUSY;
	if (bunshin_syms.wait_task_inactive(t, state) != switches || !bunshin_thread_stopped(t))
		goto put_stack;
	bunshin_syms.put_task_stack(t);
	return c;

put_stack:
	bunshin_syms.put_task_stack(t);
free:
	bunshin_cpu_free(c);
	return ERR_PTR(err);
}

static void bunshin_cpu_apply_fpu(struct bunshin_cpu *c)
{
	struct fpu *fpu = &current->thread.fpu;

	fpregs_lock();
	memcpy(&fpu->fpstate->regs, c->fpregs, c->fpsize);
	/* the registers in the CPU are stale now: reload them on the way out */
	fpu->last_cpu = -1;
	set_thread_flag(TIF_NEED_FPU_LOAD);
	fpregs_unlock();
	write_pkru(c->pkru);
}

static void bunshin_cpu_apply_signals(struct bunshin_cpu *c)
{
	struct sighand_struct *sighand = current->sighand;

	if (c->actions) {
		spin_lock_irq(&sighand->siglock);
		memcpy(sighand->action, c->actions, sizeof(sighand->action));
		spin_unlock_irq(&sighand->siglock);
	}
	sigprocmask(SIG_SETMASK, &c->blocked, NULL);
}

static void bunshin_cpu_apply_task(struct bunshin_cpu *c)
{
	struct task_struct *tsk = current;

	bunshin_syms.do_arch_prctl_64(tsk, ARCH_SET_FS, c->fsbase);
	bunshin_syms.do_arch_prctl_64(tsk, ARCH_SET_GS, c->gsbase);
#ifdef CONFIG_RSEQ
	tsk->rseq = c->rseq;
	tsk->rseq_sig = c->rseq_sig;
	tsk->rseq_event_mask = c->rseq_event_mask;
	rseq_set_notify_resume(tsk);
#endif
#ifdef CONFIG_FUTEX
	tsk->robust_list = c->robust_list;
#ifdef CONFIG_COMPAT
	tsk->compat_robust_list = c->compat_robust_list;
#endif
#endif
	tsk->clear_child_tid = c->clear_child_tid;
	tsk->sas_ss_sp = c->sas_ss_sp;
	tsk->sas_ss_size = c->sas_ss_size;
	tsk->sas_ss_flags = c->sas_ss_flags;
	tsk->restart_block = c->restart_block;
	bunshin_syms.set_task_comm(tsk, c->comm, false);
	tsk->personality = c->personality;
}

/**
 * bunshin_cpu_apply() - make the calling thread continue where @c stopped
 * @c: a captured state, consumed (freed) here
 * @file: the /dev/bunshin file of the ioctl
 *
 * The caller must already run on the graft's address space: the pointers in
 * @c (rseq, robust list, signal stack) are addresses in it.
 */
void bunshin_cpu_apply(struct bunshin_cpu *c, struct file *file)
{
	struct bunshin_resume *r = c->resume;

	*current_pt_regs() = c->regs;
	bunshin_cpu_apply_fpu(c);
	bunshin_cpu_apply_task(c);
	bunshin_cpu_apply_signals(c);

	/* last: a queued TWA_SIGNAL work makes signal_pending() true */
	c->resume = NULL;
	r->ax = c->regs.ax;
	r->orig_ax = c->regs.orig_ax;
	r->file = get_file(file);
	init_task_work(&r->work, bunshin_resume_fn);
	if (task_work_add(current, &r->work, TWA_SIGNAL)) {
		/* only an exiting task refuses work, and it never returns to user space */
		fput(r->file);
		kfree(r);
		atomic_dec(&bunshin_live_states);
	}
	bunshin_cpu_free(c);
}

void bunshin_cpu_free(struct bunshin_cpu *c)
{
	if (c->resume)
		atomic_dec(&bunshin_live_states);
	kfree(c->resume);
	kfree(c->actions);
	kfree(c);
	atomic_dec(&bunshin_live_states);
}
