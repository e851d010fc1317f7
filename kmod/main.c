// SPDX-License-Identifier: GPL-2.0
/*
 * DOC: BunshinFork, /dev/bunshin
 *
 * BunshinFork forks real applications across container boundaries. A helper
 * process started in the target container (its namespaces, its cgroup) opens
 * /dev/bunshin and grafts a stopped source process into itself: its address
 * space is replaced by a copy-on-write duplicate of the source's, set up as
 * fork() sets up a child's, so no application memory is copied, and it takes
 * the source's CPU state, so that when the ioctl returns it runs on exactly
 * where the source stopped. Everything else (files, credentials, namespaces,
 * cgroup, seccomp) stays the helper's: the helper rebuilds the file table
 * before it grafts, and a clone never holds more rights than its helper.
 *
 * This file owns the device and the ioctl ABI: BUNSHIN_IOC_API first, then one
 * BUNSHIN_IOC_GRAFT (with BUNSHIN_IOC_GRAFT_THREAD for the other threads) per
 * open file; BUNSHIN_IOC_RELEASE and poll() from whoever holds the file.
 * Each ioctl copies its argument in, validates it, acts, and copies the
 * result out; unknown commands get -ENOTTY, unknown flags and non-zero
 * reserved fields -EINVAL. There is no compat_ioctl: a graft is between
 * 64-bit processes.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/poll.h>
#include <linux/uaccess.h>

#include "internal.h"

#define BUNSHIN_FEATURES	(BUNSHIN_FEATURE_PIDFD | BUNSHIN_FEATURE_THREADS |	\
				 BUNSHIN_FEATURE_CLOSE | BUNSHIN_FEATURE_REMAP |	\
				 BUNSHIN_FEATURE_HOLD)
#define BUNSHIN_IOCTLS		(BIT_ULL(_IOC_NR(BUNSHIN_IOC_API)) |		\
				 BIT_ULL(_IOC_NR(BUNSHIN_IOC_GRAFT)) |		\
				 BIT_ULL(_IOC_NR(BUNSHIN_IOC_GRAFT_THREAD)) |	\
				 BIT_ULL(_IOC_NR(BUNSHIN_IOC_RELEASE)))

static int bunshin_open(struct inode *inode, struct file *file)
{
	struct bunshin_session *s = bunshin_session_new(file);

	if (!s)
		return -ENOMEM;
	file->private_data = s;
	return 0;
}

static int bunshin_release(struct inode *inode, struct file *file)
{
	bunshin_session_free(file->private_data);
	return 0;
}

static long bunshin_ioctl_api(struct bunshin_session *s, void __user *uarg)
{
	struct bunshin_api api;
	long err;

	if (copy_from_user(&api, uarg, sizeof(api)))
		return -EFAULT;
	if (api.api != BUNSHIN_API || api.features & ~BUNSHIN_FEATURES)
		return -EINVAL;

	err = mutex_lock_killable(&s->lock);
	if (err)
		return err;
	if (s->state == BUNSHIN_SESSION_NEW)
		s->state = BUNSHIN_SESSION_READY;
	else
		err = -EINVAL;
	mutex_unlock(&s->lock);
	if (err)
		return err;

	memset(&api, 0, sizeof(api));
	api.api = BUNSHIN_API;
	api.features = BUNSHIN_FEATURES;
	api.ioctls = BUNSHIN_IOCTLS;
	if (copy_to_user(uarg, &api, sizeof(api)))
		return -EFAULT;
	return 0;
}

static long bunshin_ioctl_graft(struct bunshin_session *s, void __user *uarg, bool thread)
{
	struct bunshin_remap_table *remap = NULL;
	struct bunshin_graft req;
	long err;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (req.flags & ~BUNSHIN_GRAFT_FLAGS || req.reserved)
		return -EINVAL;
	/* closing and remapping are the grafting thread's, and their fields zero without them */
	if (thread && req.flags & (BUNSHIN_GRAFT_CLOSE | BUNSHIN_GRAFT_REMAP | BUNSHIN_GRAFT_HOLD))
		return -EINVAL;
	if (!(req.flags & BUNSHIN_GRAFT_CLOSE) && req.close_from)
		return -EINVAL;
	if (req.flags & BUNSHIN_GRAFT_REMAP ?
	    !req.nr_remap || req.nr_remap > BUNSHIN_REMAP_MAX : req.remap || req.nr_remap)
		return -EINVAL;
	if (thread)
		return bunshin_graft_thread(s, &req);
	if (req.flags & BUNSHIN_GRAFT_REMAP) {
		remap = bunshin_remap_get(&req);
		if (IS_ERR(remap))
			return PTR_ERR(remap);
	}
	err = bunshin_graft(s, &req, remap);
	bunshin_remap_put(remap);
	return err;
}

static long bunshin_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct bunshin_session *s = file->private_data;
	void __user *uarg = (void __user *)arg;

	switch (cmd) {
	case BUNSHIN_IOC_API:
		return bunshin_ioctl_api(s, uarg);
	case BUNSHIN_IOC_GRAFT:
		return bunshin_ioctl_graft(s, uarg, false);
	case BUNSHIN_IOC_GRAFT_THREAD:
		return bunshin_ioctl_graft(s, uarg, true);
	case BUNSHIN_IOC_RELEASE:
		return arg ? -EINVAL : bunshin_session_release(s);
	}
	return -ENOTTY;
}

static __poll_t bunshin_poll(struct file *file, struct poll_table_struct *pt)
{
	struct bunshin_session *s = file->private_data;

	poll_wait(file, &s->wq, pt);
	return bunshin_session_poll(s);
}

static const struct file_operations bunshin_fops = {
	.owner = THIS_MODULE,
	.open = bunshin_open,
	.release = bunshin_release,
	.unlocked_ioctl = bunshin_ioctl,
	.poll = bunshin_poll,
	.llseek = noop_llseek,
};

static struct miscdevice bunshin_dev = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "bunshin",
	.fops = &bunshin_fops,
	.mode = 0600,
};

static int __init bunshin_init(void)
{
	int err = bunshin_syms_resolve();

	if (err)
		return err;
	err = misc_register(&bunshin_dev);
	if (err)
		return err;
	bunshin_debugfs_init();
	pr_info("api %llu ready\n", BUNSHIN_API);
	return 0;
}

static void __exit bunshin_exit(void)
{
	bunshin_debugfs_exit();
	misc_deregister(&bunshin_dev);
}

module_init(bunshin_init);
module_exit(bunshin_exit);

MODULE_LICENSE("GPL");
MODULE_AUTHOR("BunshinRL");
MODULE_DESCRIPTION("Graft a copy-on-write duplicate of a stopped process into another container");
