// SPDX-License-Identifier: GPL-2.0
/*
 * DOC: fault points and live-object counters, in debugfs
 *
 * Every step of a graft that can fail has a name. Writing a name to
 * /sys/kernel/debug/bunshin/fail_step arms that step: the next graft fails
 * there, as if the step had run out of memory, and the step disarms itself.
 * /sys/kernel/debug/bunshin/stats counts the sessions and captured CPU states
 * alive, so that tests can check that nothing the module allocates outlives
 * its graft.
 */
#include <linux/debugfs.h>
#include <linux/fs.h>
#include <linux/seq_file.h>
#include <linux/string.h>
#include <linux/uaccess.h>

#include "internal.h"

static const char * const bunshin_fault_names[BUNSHIN_FAULT_NR] = {
	[BUNSHIN_FAULT_NONE] = "none",
	[BUNSHIN_FAULT_ALLOC] = "alloc",
	[BUNSHIN_FAULT_INIT] = "init",
	[BUNSHIN_FAULT_COPY] = "copy",
	[BUNSHIN_FAULT_STATE] = "state",
};

static atomic_t bunshin_armed = ATOMIC_INIT(BUNSHIN_FAULT_NONE);
static struct dentry *bunshin_debugfs;

atomic_t bunshin_live_sessions = ATOMIC_INIT(0);
atomic_t bunshin_live_states = ATOMIC_INIT(0);

/**
 * bunshin_fault() - should @step fail now?
 * @step: the step about to run
 *
 * Return: true once after @step was armed, then false until armed again.
 */
bool bunshin_fault(enum bunshin_fault_step step)
{
	return atomic_cmpxchg(&bunshin_armed, step, BUNSHIN_FAULT_NONE) == step;
}

static int bunshin_fail_step_show(struct seq_file *m, void *v)
{
	int armed = atomic_read(&bunshin_armed);
	int i;

	for (i = 0; i < BUNSHIN_FAULT_NR; i++)
		seq_printf(m, i == armed ? "[%s]%s" : "%s%s", bunshin_fault_names[i],
			   i + 1 < BUNSHIN_FAULT_NR ? " " : "\n");
	return 0;
}

static int bunshin_fail_step_open(struct inode *inode, struct file *file)
{
	return single_open(file, bunshin_fail_step_show, NULL);
}

static ssize_t bunshin_fail_step_write(struct file *file, const char __user *ubuf,
				       size_t len, loff_t *ppos)
{
	char buf[16];
	int step;

	if (len >= sizeof(buf))
		return -EINVAL;
	if (copy_from_user(buf, ubuf, len))
		return -EFAULT;
	buf[len] = '\0';
	step = sysfs_match_string(bunshin_fault_names, strim(buf));
	if (step < 0)
		return step;
	atomic_set(&bunshin_armed, step);
	return len;
}

static const struct file_operations bunshin_fail_step_fops = {
	.owner = THIS_MODULE,
	.open = bunshin_fail_step_open,
	.read = seq_read,
	.write = bunshin_fail_step_write,
	.llseek = seq_lseek,
	.release = single_release,
};

static int bunshin_stats_show(struct seq_file *m, void *v)
{
	seq_printf(m, "sessions %d\nstates %d\n", atomic_read(&bunshin_live_sessions),
		   atomic_read(&bunshin_live_states));
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(bunshin_stats);

int bunshin_debugfs_init(void)
{
	bunshin_debugfs = debugfs_create_dir("bunshin", NULL);
	debugfs_create_file("fail_step", 0600, bunshin_debugfs, NULL, &bunshin_fail_step_fops);
	debugfs_create_file("stats", 0400, bunshin_debugfs, NULL, &bunshin_stats_fops);
	return 0;
}

void bunshin_debugfs_exit(void)
{
	debugfs_remove(bunshin_debugfs);
}
