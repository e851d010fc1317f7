// SPDX-License-Identifier: GPL-2.0
/*
 * DOC: the clone's own shared memory (BUNSHIN_GRAFT_REMAP)
 *
 * A copy-on-write duplicate keeps every shared mapping shared, as fork()
 * does: a clone of a browser would write into the source's shared memory
 * segments, and read what the source writes there. The orchestrator makes a
 * copy of each such file (a memfd, a file in /dev/shm) and names the pairs in
 * the graft request; after the duplicate is made and before the caller runs
 * on it, every mapping of a @from file is moved onto its @to file, as if the
 * clone had mapped @to at the same address, offset and protections.
 *
 * Only mappings that hold no page of their own move: a shared mapping, or a
 * private one never written to. Neither had page-table entries copied by
 * dup_mmap() (copy_page_range() skips a mapping without an anon_vma), so the
 * clone faults its pages in from @to. A private mapping with pages of its own
 * is refused (-EOPNOTSUPP), as are special mappings (PFN, mixed, hugetlb).
 * A SysV segment's mappings move onto the orchestrator's attach of its copy
 * (bunshin_remap_attach_of()): SysV shared memory (X's MIT-SHM) is a copy too.
 */
#include <linux/file.h>
#include <linux/highmem.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/mmap_lock.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "internal.h"

struct bunshin_remap_table {
	unsigned int nr;
	struct {
		struct file *from;
		struct file *to;
	} map[];
};

void bunshin_remap_put(struct bunshin_remap_table *t)
{
	unsigned int i;

	if (!t)
		return;
	for (i = 0; i < t->nr; i++) {
		fput(t->map[i].from);
		fput(t->map[i].to);
	}
	kvfree(t);
}

/**
 * bunshin_remap_get() - the files a graft request names for remapping
 * @req: the request, validated: BUNSHIN_GRAFT_REMAP with 1..BUNSHIN_REMAP_MAX entries
 *
 * Return: the table, with a reference to every file, or an ERR_PTR: -EFAULT
 * (entries unreadable), -EBADF (a descriptor is not open), -EINVAL (an entry
 * maps a file onto itself or onto a file of another kind), -ENOMEM.
 */
/*
 * A SysV segment is mapped through a file of its attach (shm_file_operations
 * around the segment's shmem file: nattch, shmdt() and faults go through it),
 * never through its shmem file itself, which is what opening the segment's
 * /proc/PID/map_files entry gives. When the caller maps @to's inode through
 * such a file of its own (the orchestrator attached the copy before starting
 * the helper), that file is the one the clone's mappings move onto, so that
 * they are attaches of the copy.
 */
static struct file *bunshin_remap_attach_of(struct file *to)
{
	struct mm_struct *mm = current->mm;
	struct vm_area_struct *vma;
	struct file *found = NULL;

	if (!mm)
		return to;
	mmap_read_lock(mm);
	{
		VMA_ITERATOR(vmi, mm, 0);

		for_each_vma(vmi, vma) {
			if (vma->vm_file && file_inode(vma->vm_file) == file_inode(to) &&
			    vma->vm_file->f_op != to->f_op) {
				found = get_file(vma->vm_file);
				break;
			}
		}
	}
	mmap_read_unlock(mm);
	if (!found)
		return to;
	fput(to);
	return found;
}

struct bunshin_remap_table *bunshin_remap_get(const struct bunshin_graft *req)
{
	const struct bunshin_remap __user *uentries = u64_to_user_ptr(req->remap);
	struct bunshin_remap_table *t;
	struct bunshin_remap e;
	unsigned int i;
	int err = 0;

	t = kvzalloc(struct_size(t, map, req->nr_remap), GFP_KERNEL);
	if (!t)
		return ERR_PTR(-ENOMEM);
	for (i = 0; i < req->nr_remap; i++) {
		if (copy_from_user(&e, &uentries[i], sizeof(e))) {
			err = -EFAULT;
			break;
		}
		t->map[i].from = e.from < 0 ? NULL : fget(e.from);
		t->map[i].to = e.to < 0 ? NULL : fget(e.to);
		if (t->map[i].from && t->map[i].to)
			t->nr = i + 1;
		else
			err = -EBADF;
		if (err) {
			if (t->map[i].from)
				fput(t->map[i].from);
			if (t->map[i].to)
				fput(t->map[i].to);
			break;
		}
		if (file_inode(t->map[i].from) == file_inode(t->map[i].to) ||
		    t->map[i].from->f_op != t->map[i].to->f_op) {
			err = -EINVAL;
			break;
		}
		t->map[i].to = bunshin_remap_attach_of(t->map[i].to);
	}
	if (err) {
		bunshin_remap_put(t);
		return ERR_PTR(err);
	}
	return t;
}

static struct file *bunshin_remap_target(const struct bunshin_remap_table *t, struct file *file)
{
	unsigned int i;

	for (i = 0; i < t->nr; i++)
		if (file_inode(t->map[i].from) == file_inode(file))
			return t->map[i].to;
	return NULL;
}

/* whether @vma may move onto @to: no page of its own, not special, a copy of its file */
static int bunshin_remap_check(struct vm_area_struct *vma, struct file *to)
{
	if (vma->anon_vma || vma->vm_flags & (VM_PFNMAP | VM_MIXEDMAP | VM_HUGETLB))
		return -EOPNOTSUPP;
	if (vma->vm_file->f_op != to->f_op ||
	    i_size_read(file_inode(to)) != i_size_read(file_inode(vma->vm_file)))
		return -EINVAL;
	return 0;
}

/* take @vma off its file's reverse map, as unlinking it from its mapping does */
static void bunshin_vma_unlink_file(struct vm_area_struct *vma)
{
	struct address_space *mapping = vma->vm_file->f_mapping;

	i_mmap_lock_write(mapping);
	if (vma_is_shared_maywrite(vma))
		mapping_unmap_writable(mapping);
	flush_dcache_mmap_lock(mapping);
	bunshin_syms.vma_interval_tree_remove(vma, &mapping->i_mmap);
	flush_dcache_mmap_unlock(mapping);
	i_mmap_unlock_write(mapping);
}

/* put @vma on @file's reverse map, as dup_mmap() does for a child's copy */
static void bunshin_vma_link_file(struct vm_area_struct *vma, struct file *file)
{
	struct address_space *mapping = file->f_mapping;

	vma->vm_file = get_file(file);
	i_mmap_lock_write(mapping);
	if (vma_is_shared_maywrite(vma))
		mapping_allow_writable(mapping);
	flush_dcache_mmap_lock(mapping);
	bunshin_syms.vma_interval_tree_insert(vma, &mapping->i_mmap);
	flush_dcache_mmap_unlock(mapping);
	i_mmap_unlock_write(mapping);
}

/**
 * bunshin_remap_apply() - move @mm's mappings of the table's files onto their copies
 * @mm: the graft's new address space, not yet run by anyone
 * @t: the table, or NULL (nothing to do)
 *
 * Every mapping is checked before any is moved, so a refusal leaves @mm as
 * dup_mmap() made it (and the caller drops it).
 *
 * Return: 0, -EOPNOTSUPP (a private mapping with pages of its own, a special
 * mapping) or -EINVAL (a copy whose size differs from its file's).
 */
int bunshin_remap_apply(struct mm_struct *mm, const struct bunshin_remap_table *t)
{
	struct vm_area_struct *vma;
	struct file *to, *from;
	int err = 0;

	if (!t)
		return 0;
	mmap_write_lock(mm);
	{
		VMA_ITERATOR(vmi, mm, 0);

		for_each_vma(vmi, vma) {
			if (!vma->vm_file)
				continue;
			to = bunshin_remap_target(t, vma->vm_file);
			if (!to)
				continue;
			err = bunshin_remap_check(vma, to);
			if (err)
				goto out;
		}
	}
	{
		VMA_ITERATOR(vmi, mm, 0);

		for_each_vma(vmi, vma) {
			to = vma->vm_file ? bunshin_remap_target(t, vma->vm_file) : NULL;
			if (!to)
				continue;
			if (vma->vm_ops && vma->vm_ops->close)
				vma->vm_ops->close(vma);
			from = vma->vm_file;
			bunshin_vma_unlink_file(vma);
			bunshin_vma_link_file(vma, to);
			if (vma->vm_ops && vma->vm_ops->open)
				vma->vm_ops->open(vma);
			fput(from);
		}
	}
out:
	mmap_write_unlock(mm);
	return err;
}
