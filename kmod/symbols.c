// SPDX-License-Identifier: GPL-2.0
/*
 * DOC: kernel helpers the graft needs that are not exported
 *
 * The graft follows fork's dup_mm() and exec's exec_mmap(), both inlined in
 * Linux 6.1, through the helpers they call. Those helpers are not exported, so
 * they are looked up by name when the module loads: kallsyms_lookup_name() is
 * not exported either and is found through a kprobe on it. A kernel that lacks
 * any of them makes the module refuse to load, naming the missing symbol.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kprobes.h>
#include <linux/module.h>
#include <linux/stddef.h>

#include "internal.h"

struct bunshin_syms bunshin_syms;

struct bunshin_sym {
	const char *name;
	size_t offset;
};

#define BUNSHIN_SYM(field, symbol) { symbol, offsetof(struct bunshin_syms, field) }

static const struct bunshin_sym bunshin_sym_table[] = {
	BUNSHIN_SYM(mm_cachep, "mm_cachep"),
	BUNSHIN_SYM(mm_init, "mm_init"),
	BUNSHIN_SYM(dup_mmap, "dup_mmap"),
	BUNSHIN_SYM(exec_mm_release, "exec_mm_release"),
	BUNSHIN_SYM(sync_mm_rss, "sync_mm_rss"),
	BUNSHIN_SYM(switch_mm, "switch_mm"),
#ifdef CONFIG_LRU_GEN
	BUNSHIN_SYM(lru_gen_add_mm, "lru_gen_add_mm"),
#endif
	BUNSHIN_SYM(mm_update_next_owner, "mm_update_next_owner"),
	BUNSHIN_SYM(mm_access, "mm_access"),
	BUNSHIN_SYM(wait_task_inactive, "wait_task_inactive"),
	BUNSHIN_SYM(do_arch_prctl_64, "do_arch_prctl_64"),
	BUNSHIN_SYM(fsbase_read_task, "x86_fsbase_read_task"),
	BUNSHIN_SYM(gsbase_read_task, "x86_gsbase_read_task"),
	BUNSHIN_SYM(pidfd_get_pid, "pidfd_get_pid"),
	BUNSHIN_SYM(lock_task_sighand, "__lock_task_sighand"),
	BUNSHIN_SYM(set_task_comm, "__set_task_comm"),
	BUNSHIN_SYM(put_task_stack, "put_task_stack"),
#ifdef CONFIG_TIME_NS
	BUNSHIN_SYM(vdso_join_timens, "vdso_join_timens"),
#endif
	BUNSHIN_SYM(vma_interval_tree_insert, "vma_interval_tree_insert"),
	BUNSHIN_SYM(vma_interval_tree_remove, "vma_interval_tree_remove"),
#ifdef BUNSHIN_TEST_MISSING_SYMBOL
	/* kmod/vmtest builds a second module with a symbol no kernel has, to see it refused */
	BUNSHIN_SYM(switch_mm, BUNSHIN_TEST_MISSING_SYMBOL),
#endif
};

typedef unsigned long (*bunshin_lookup_fn)(const char *name);
typedef int (*bunshin_each_match_fn)(int (*fn)(void *data, unsigned long addr),
				     const char *name, void *data);

static int bunshin_count_match(void *data, unsigned long addr)
{
	(*(unsigned int *)data)++;
	return 0;
}

static bunshin_lookup_fn bunshin_find_lookup(void)
{
	struct kprobe kp = { .symbol_name = "kallsyms_lookup_name" };
	bunshin_lookup_fn lookup;

	if (register_kprobe(&kp) < 0)
		return NULL;
	lookup = (bunshin_lookup_fn)kp.addr;
	unregister_kprobe(&kp);
	return lookup;
}

/**
 * bunshin_syms_resolve() - fill in bunshin_syms
 *
 * Return: 0, or -ENOENT after logging the first symbol that is missing.
 */
int bunshin_syms_resolve(void)
{
	bunshin_lookup_fn lookup = bunshin_find_lookup();
	bunshin_each_match_fn each_match;
	size_t i;

	if (!lookup) {
		pr_err("cannot load: kernel symbol kallsyms_lookup_name not found (no kprobes?)\n");
		return -ENOENT;
	}
	each_match = (bunshin_each_match_fn)lookup("kallsyms_on_each_match_symbol");
	if (!each_match) {
		pr_err("cannot load: kernel symbol kallsyms_on_each_match_symbol not found\n");
		return -ENOENT;
	}
	for (i = 0; i < ARRAY_SIZE(bunshin_sym_table); i++) {
		const struct bunshin_sym *sym = &bunshin_sym_table[i];
		unsigned long addr = lookup(sym->name);
		unsigned int matches = 0;

		if (!addr) {
			pr_err("cannot load: kernel symbol %s not found\n", sym->name);
			return -ENOENT;
		}
		each_match(bunshin_count_match, sym->name, &matches);
		if (matches != 1) {
			pr_err("cannot load: kernel symbol %s is ambiguous (%u of them)\n",
			       sym->name, matches);
			return -ENOENT;
		}
		*(unsigned long *)((char *)&bunshin_syms + sym->offset) = addr;
	}
	return 0;
}
