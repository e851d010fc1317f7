// SPDX-License-Identifier: GPL-2.0
/*
 * DOC: the address space of a graft
 *
 * bunshin_mm_dup() is fork's dup_mm(): a new mm_struct starts as a byte copy
 * of the source's, is re-initialised by mm_init() and filled by dup_mmap(),
 * which copies every VMA and write-protects the source's private pages in both
 * page tables, so unchanged pages stay shared until one side writes. The one
 * difference is that the new mm belongs to the caller, not to a child.
 *
 * bunshin_mm_switch() is exec's exec_mmap(): the caller leaves its old address
 * space (releasing what its threads registered there, as exec does) and runs
 * on the copy. It can fail only while a fatal signal is pending.
 */
#include <linux/binfmts.h>
#include <linux/mm.h>
#include <linux/mmap_lock.h>
#include <linux/module.h>
#include <linux/cred.h>
#include <linux/sched/coredump.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <asm/mmu_context.h>

#include "internal.h"

/*
 * The stricter of two dumpable modes: a clone is no more open to ptrace and
 * core dumps than its caller (whose credentials it runs with) or its source
 * (whose memory it holds). SUID_DUMP_USER < SUID_DUMP_ROOT < SUID_DUMP_DISABLE.
 */
static int bunshin_dumpable(int caller, int source)
{
	if (caller == SUID_DUMP_DISABLE || source == SUID_DUMP_DISABLE)
		return SUID_DUMP_DISABLE;
	if (caller == SUID_DUMP_ROOT || source == SUID_DUMP_ROOT)
		return SUID_DUMP_ROOT;
	return SUID_DUMP_USER;
}

/**
 * bunshin_mm_dup() - a copy-on-write duplicate of @oldmm owned by the caller
 * @oldmm: the source's address space, mm_users held by the caller
 *
 * Return: the new mm with one mm_users reference, or an ERR_PTR.
 */
struct mm_struct *bunshin_mm_dup(struct mm_struct *oldmm)
{
	struct mm_struct *mm;
	int err;

	mm = kmem_cache_alloc(*bunshin_syms.mm_cachep, GFP_KERNEL);
	if (!mm)
		return ERR_PTR(-ENOMEM);
	memcpy(mm, oldmm, sizeof(*mm));

	if (bunshin_fault(BUNSHIN_FAULT_INIT)) {
		kmem_cache_free(*bunshin_syms.mm_cachep, mm);
		return ERR_PTR(-ENOMEM);
	}
	/*
	 * The clone runs with the caller's credentials, so its mm belongs to the
	 * caller's user namespace, as exec's new mm does. mm_init() frees @mm
	 * when it fails.
	 */
	if (!bunshin_syms.mm_init(mm, current, current_user_ns()))
		return ERR_PTR(-ENOMEM);
	/* the source's dump filter and THP opt-out, as a fork child keeps its parent's */
	mm->flags = oldmm->flags & MMF_INIT_MASK;
	mm->def_flags = oldmm->def_flags & VM_INIT_DEF_MASK;
	set_mask_bits(&mm->flags, MMF_DUMPABLE_MASK,
		      bunshin_dumpable(__get_dumpable(current->mm->flags),
				       __get_dumpable(oldmm->flags)));

	err = bunshin_syms.dup_mmap(mm, oldmm);
	if (!err && bunshin_fault(BUNSHIN_FAULT_COPY))
		err = -ENOMEM;
	if (err)
		goto free_pt;

	mm->hiwater_rss = get_mm_rss(mm);
	mm->hiwater_vm = mm->total_vm;

	err = -EAGAIN;
	if (mm->binfmt && !try_module_get(mm->binfmt->module))
		goto free_pt;
	return mm;

free_pt:
	/* as dup_mm(): mmput() must not put a binfmt module never taken */
	mm->binfmt = NULL;
#ifdef CONFIG_MEMCG
	mm->owner = NULL;
#endif
	mmput(mm);
	return ERR_PTR(err);
}

/**
 * bunshin_mm_switch() - run the calling thread on @mm from now on
 * @mm: the graft's address space; the caller's mm_users reference moves to
 *	current->mm on success and stays the caller's on failure
 * @new_mm: @mm was just created (register it with the page reclaim's mm list)
 *
 * Return: 0, or -EINTR when a fatal signal interrupted it.
 */
int bunshin_mm_switch(struct mm_struct *mm, bool new_mm)
{
	struct task_struct *tsk = current;
	struct mm_struct *old_mm = tsk->mm;
	struct mm_struct *active_mm;
	int ret;

	/* as exec: wake a vfork parent, release the robust futexes and the child tid */
	bunshin_syms.exec_mm_release(tsk, old_mm);
	bunshin_syms.sync_mm_rss(old_mm);

	ret = down_write_killable(&tsk->signal->exec_update_lock);
	if (ret)
		return ret;
	ret = mmap_read_lock_killable(old_mm);
	if (ret) {
		up_write(&tsk->signal->exec_update_lock);
		return ret;
	}

	task_lock(tsk);
	/*
	 * exec resets the membarrier registrations here (membarrier_exec_mmap());
	 * a graft keeps the source's, which the copy carries, and needs only
	 * the barrier ordering the old mm's accesses before the switch.
	 */
	smp_mb();
	local_irq_disable();
	active_mm = tsk->active_mm;
	tsk->active_mm = mm;
	tsk->mm = mm;
	if (!IS_ENABLED(CONFIG_ARCH_WANT_IRQS_OFF_ACTIVATE_MM))
		local_irq_enable();
	paravirt_activate_mm(active_mm, mm);
	bunshin_syms.switch_mm(active_mm, mm, NULL);
	if (IS_ENABLED(CONFIG_ARCH_WANT_IRQS_OFF_ACTIVATE_MM))
		local_irq_enable();
	if (new_mm && bunshin_syms.lru_gen_add_mm)
		bunshin_syms.lru_gen_add_mm(mm);
	task_unlock(tsk);
	lru_gen_use_mm(mm);

	mmap_read_unlock(old_mm);
	up_write(&tsk->signal->exec_update_lock);
	WARN_ON_ONCE(active_mm != old_mm);
	setmax_mm_hiwater_rss(&tsk->signal->maxrss, old_mm);
	bunshin_syms.mm_update_next_owner(old_mm);
	mmput(old_mm);
	return 0;
}
