// SPDX-License-Identifier: GPL-2.0
/*
 * The graft selftests' shared parts: see graft_lib.h.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/rseq.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "graft_lib.h"

#define MAGIC 0x6b756e7368696e21ULL

/* ---- the source program (also what every clone runs) ---- */

static uint8_t *region;
static size_t region_size;
static uint8_t *shm;
size_t source_shm_size;
bool source_sysv;
static struct shared *sh;
static void *robust_seen;
static stack_t alt_seen;
static __thread uint64_t tls_magic;
uid_t source_uid;
volatile uint64_t *graft_clock;

static void on_usr1(int sig)
{
	sh->usr1++;
}

static void *spin_thread(void *arg)
{
	/* keep MAGIC in %r15 and %xmm7 for ever: a clone with other registers stops */
	asm volatile("movq %[magic], %%r15\n\t"
		     "movq %%r15, %%xmm7\n\t"
		     "1:\n\t"
		     "incq (%[ctr])\n\t"
		     "movq %%xmm7, %%rax\n\t"
		     "cmpq %%rax, %%r15\n\t"
		     "jne 2f\n\t"
		     "cmpq %[magic], %%r15\n\t"
		     "je 1b\n\t"
		     "2:\n\t"
		     : : [ctr] "r"(&sh->spins), [magic] "r"(MAGIC)
		     : "rax", "r15", "xmm7", "memory", "cc");
	sh->bad = 1;
	return NULL;
}

static void *nap_thread(void *arg)
{
	struct timespec ts = { 0, 2 * 1000 * 1000 };

	tls_magic = MAGIC + 2;
	for (;;) {
		int rc;

		while ((rc = nanosleep(&ts, &ts)) && errno == EINTR)
			;
		if (rc)
			sh->bad = 4;	/* a restart gone wrong: nanosleep() fails only with EINTR */
		ts.tv_nsec = 2 * 1000 * 1000;
		if (tls_magic != MAGIC + 2)
			sh->bad = 2;
		sh->naps++;
	}
	return NULL;
}

static void *wait_thread(void *arg)
{
	pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
	pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
	struct timespec ts;

	tls_magic = MAGIC + 3;
	pthread_mutex_lock(&m);
	for (;;) {
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 3 * 1000 * 1000;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		int rc = pthread_cond_timedwait(&cv, &m, &ts);

		if (rc && rc != ETIMEDOUT)
			sh->bad = 5;
		if (tls_magic != MAGIC + 3)
			sh->bad = 3;
		sh->waits++;
	}
	return NULL;
}

static uint64_t region_hash(void)
{
	uint64_t h = 1469598103934665603ULL;
	size_t i;

	for (i = 0; i < region_size; i += 8)
		h = (h ^ *(uint64_t *)(region + i)) * 1099511628211ULL;
	return h;
}

static int64_t state_checks(struct reply *r)
{
	void *head;
	size_t len;
	stack_t alt;
	sigset_t blocked;

	r->v[0] = 2;	/* rseq not registered by libc: nothing to check */
	if (__rseq_size) {
		/* glibc registers 32 bytes (the kernel's struct rseq) and publishes 20 */
		long ret = syscall(SYS_rseq, (char *)__builtin_thread_pointer() + __rseq_offset,
				   32, 0, RSEQ_SIG);

		/* EBUSY: registered at exactly this area; EINVAL: elsewhere; 0: nowhere */
		r->v[0] = ret == -1 && errno == EBUSY ? 1 : -(ret == -1 ? errno : 1000);
	}
	syscall(SYS_get_robust_list, 0, &head, &len);
	r->v[1] = head == robust_seen;
	sigaltstack(NULL, &alt);
	r->v[2] = alt.ss_sp == alt_seen.ss_sp && alt.ss_size == alt_seen.ss_size;
	sigprocmask(SIG_BLOCK, NULL, &blocked);
	r->v[3] = sigismember(&blocked, SIGUSR2) && tls_magic == MAGIC;
	return 0;
}

static void source_serve(void)
{
	struct cmd c;
	struct reply r;
	ssize_t n;

	for (;;) {
		n = read(CMD_FD, &c, sizeof(c));
		if (n < 0 && errno == EINTR)
			continue;
		if (n != sizeof(c))
			_exit(n == 0 ? 0 : 2);
		memset(&r, 0, sizeof(r));
		r.op = c.op;
		switch (c.op) {
		case 'P':
			r.v[0] = getpid();
			r.v[1] = sh->bad;
			break;
		case 'A':
			r.v[0] = (int64_t)(uintptr_t)region;
			r.v[1] = (int64_t)(uintptr_t)sh;
			r.v[2] = region_size;
			break;
		case 'S':
			r.v[0] = region_hash();
			break;
		case 'R':
			r.v[0] = region[c.a % region_size];
			break;
		case 'W':
			region[c.a % region_size] = c.b;
			break;
		case 'T':
			memset(region + c.a, c.b, region_size - c.a);	/* touch the rest */
			break;
		case 'X':
			state_checks(&r);
			break;
		case 'U':
			r.v[0] = sh->usr1;
			break;
		case 'N':
			r.v[0] = now_ns();
			break;
		case 'F': {
			uint64_t t0 = now_ns();
			pid_t child = fork();

			if (child == 0)
				for (;;)
					pause();
			r.v[0] = now_ns() - t0;
			r.v[1] = child;
			break;
		}
		case 'V': {
			/* a vfork parent waits, marked frozen for the cgroup freezer's sake */
			pid_t child = vfork();

			if (child == 0) {
				syscall(SYS_pause);
				_exit(0);
			}
			r.v[0] = child;
			break;
		}
		case 'M':
			r.v[0] = (int64_t)(uintptr_t)shm;
			r.v[1] = SHM_FD;
			r.v[2] = source_shm_size;
			break;
		case 'r':
			r.v[0] = shm ? shm[c.a % source_shm_size] : -1;
			break;
		case 'w':
			if (shm)
				shm[c.a % source_shm_size] = c.b;
			break;
		case 'D':
			r.v[0] = shmdt(shm) ? errno : 0;
			break;
		case 'p': {
			/* a private mapping of the memfd, written: it holds a page of its own */
			uint8_t *priv = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, SHM_FD, 0);

			r.v[0] = priv == MAP_FAILED ? -errno : 0;
			if (priv != MAP_FAILED)
				priv[0] ^= 1;
			break;
		}
		case 'Q':
			_exit(0);
		}
		if (write(OUT_FD, &r, sizeof(r)) != sizeof(r))
			_exit(2);
	}
}

static void source_main(size_t size, int threads)
{
	struct sigaction sa = { .sa_handler = on_usr1, .sa_flags = SA_RESTART };
	sigset_t usr2;
	pthread_t t;
	size_t len;
	size_t i;

	tls_magic = MAGIC;
	/* read the clock through the vDSO once: its vvar pages are mapped from now on */
	now_ns();
	region_size = size;
	region = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	sh = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (region == MAP_FAILED || sh == MAP_FAILED)
		_exit(2);
	/* no huge pages: the page-frame comparisons are per 4 KiB page */
	madvise(region, size, MADV_NOHUGEPAGE);
	for (i = 0; i < size; i += 8)
		*(uint64_t *)(region + i) = i * 2654435761ULL + 1;
	if (source_shm_size && source_sysv) {
		int id = shmget(IPC_PRIVATE, source_shm_size, 0600);

		shm = id < 0 ? MAP_FAILED : shmat(id, NULL, 0);
		if (shm == MAP_FAILED || shmctl(id, IPC_RMID, NULL))
			_exit(2);
	} else if (source_shm_size) {
		int fd = memfd_create("bunshin-shm", 0);

		if (fd < 0 || dup2(fd, SHM_FD) < 0 || ftruncate(SHM_FD, source_shm_size))
			_exit(2);
		close(fd);
		shm = mmap(NULL, source_shm_size, PROT_READ | PROT_WRITE, MAP_SHARED, SHM_FD, 0);
		if (shm == MAP_FAILED)
			_exit(2);
	}
	if (source_shm_size) {
		for (i = 0; i < source_shm_size; i++)
			shm[i] = (uint8_t)(i * 7 + 3);
	}

	sigaction(SIGUSR1, &sa, NULL);
	sigemptyset(&usr2);
	sigaddset(&usr2, SIGUSR2);
	sigprocmask(SIG_BLOCK, &usr2, NULL);
	alt_seen.ss_sp = malloc(65536);
	alt_seen.ss_size = 65536;
	sigaltstack(&alt_seen, NULL);
	syscall(SYS_get_robust_list, 0, &robust_seen, &len);

	if (threads) {
		pthread_create(&t, NULL, spin_thread, NULL);
		pthread_create(&t, NULL, nap_thread, NULL);
		pthread_create(&t, NULL, wait_thread, NULL);
	}
	source_serve();
}

static int spawn_pipes(int cmd[2], int out[2])
{
	if (pipe2(cmd, O_CLOEXEC) || pipe2(out, O_CLOEXEC))
		return -1;
	return 0;
}

/* in the child: the pipes' far ends become CMD_FD and OUT_FD */
static void child_fds(int cmd[2], int out[2])
{
	/* through fds above both targets: either end may already be CMD_FD or OUT_FD */
	int in = fcntl(cmd[0], F_DUPFD_CLOEXEC, 100);
	int reply = fcntl(out[1], F_DUPFD_CLOEXEC, 100);

	dup2(in, CMD_FD);
	dup2(reply, OUT_FD);
}

int source_start(struct proc *src, size_t size, int threads)
{
	int cmd[2], out[2];
	struct reply r;
	pid_t pid;

	if (spawn_pipes(cmd, out))
		return -1;
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		child_fds(cmd, out);
		if (source_uid && (setgid(source_uid) || setuid(source_uid) ||
				   prctl(PR_SET_DUMPABLE, 1)))
			_exit(2);
		source_main(size, threads);
	}
	close(cmd[0]);
	close(out[1]);
	src->pid = pid;
	src->cmd = cmd[1];
	src->out = out[0];
	return call(src, 'P', 0, 0, &r);
}

int call(struct proc *p, char op, uint64_t a, uint64_t b, struct reply *r)
{
	struct cmd c = { .op = op, .a = a, .b = b };
	struct pollfd pfd = { .fd = p->out, .events = POLLIN };

	if (write(p->cmd, &c, sizeof(c)) != sizeof(c))
		return -1;
	if (poll(&pfd, 1, 20000) != 1)
		return -1;
	if (read(p->out, r, sizeof(*r)) != sizeof(*r))
		return -1;
	return 0;
}

void proc_end(struct proc *p)
{
	if (p->pid <= 0)
		return;
	kill(p->pid, SIGKILL);
	waitpid(p->pid, NULL, __WALL);
	close(p->cmd);
	close(p->out);
	p->pid = 0;
}

/* ---- stopping and resuming the source ---- */

const char *stop_name(enum stop_kind kind)
{
	static const char * const names[] = { "SIGSTOP", "ptrace", "ptrace at syscall entry",
					      "cgroup v2 freezer", "cgroup v1 freezer" };
	return names[kind];
}

static char cg_path[128];

static int wait_text(const char *path, const char *want)
{
	char buf[256];
	int i, fd;
	ssize_t n;

	for (i = 0; i < 2000; i++) {
		fd = open(path, O_RDONLY);
		if (fd < 0)
			return -1;
		n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		buf[n > 0 ? n : 0] = '\0';
		if (strstr(buf, want))
			return 0;
		usleep(5000);
	}
	return -1;
}

int source_stop(struct proc *src, enum stop_kind kind)
{
	char path[192], pid[32];
	int status;

	snprintf(pid, sizeof(pid), "%d", src->pid);
	switch (kind) {
	case STOP_SIGSTOP:
		kill(src->pid, SIGSTOP);
		return waitpid(src->pid, &status, WUNTRACED) == src->pid && WIFSTOPPED(status) ? 0 : -1;
	case STOP_PTRACE:
		if (ptrace(PTRACE_SEIZE, src->pid, 0, 0) || ptrace(PTRACE_INTERRUPT, src->pid, 0, 0))
			return -1;
		return waitpid(src->pid, &status, __WALL) == src->pid ? 0 : -1;
	case STOP_SYSCALL_ENTRY:
		/* stopped in read(); PTRACE_SYSCALL restarts it and stops at its entry */
		if (ptrace(PTRACE_SEIZE, src->pid, 0, PTRACE_O_TRACESYSGOOD) ||
		    ptrace(PTRACE_INTERRUPT, src->pid, 0, 0) ||
		    waitpid(src->pid, &status, __WALL) != src->pid ||
		    ptrace(PTRACE_SYSCALL, src->pid, 0, 0) ||
		    waitpid(src->pid, &status, __WALL) != src->pid)
			return -1;
		return WIFSTOPPED(status) && WSTOPSIG(status) == (SIGTRAP | 0x80) ? 0 : -1;
	case STOP_FREEZER_V2:
		snprintf(cg_path, sizeof(cg_path), "/sys/fs/cgroup/bunshin-src-%d", src->pid);
		mkdir(cg_path, 0755);
		snprintf(path, sizeof(path), "%s/cgroup.procs", cg_path);
		if (write_file(path, pid))
			return -1;
		snprintf(path, sizeof(path), "%s/cgroup.freeze", cg_path);
		if (write_file(path, "1"))
			return -1;
		snprintf(path, sizeof(path), "%s/cgroup.events", cg_path);
		return wait_text(path, "frozen 1");
	case STOP_FREEZER_V1:
		mkdir("/run/freezer", 0755);
		mount("freezer", "/run/freezer", "cgroup", 0, "freezer");
		snprintf(cg_path, sizeof(cg_path), "/run/freezer/bunshin-src-%d", src->pid);
		mkdir(cg_path, 0755);
		snprintf(path, sizeof(path), "%s/cgroup.procs", cg_path);
		if (write_file(path, pid))
			return -1;
		snprintf(path, sizeof(path), "%s/freezer.state", cg_path);
		if (write_file(path, "FROZEN"))
			return -1;
		return wait_text(path, "FROZEN");
	}
	return -1;
}

int source_resume(struct proc *src, enum stop_kind kind)
{
	char path[192];

	switch (kind) {
	case STOP_SIGSTOP:
		return kill(src->pid, SIGCONT);
	case STOP_PTRACE:
	case STOP_SYSCALL_ENTRY:
		return ptrace(PTRACE_DETACH, src->pid, 0, 0);
	case STOP_FREEZER_V2:
		snprintf(path, sizeof(path), "%s/cgroup.freeze", cg_path);
		return write_file(path, "0");
	case STOP_FREEZER_V1:
		snprintf(path, sizeof(path), "%s/freezer.state", cg_path);
		return write_file(path, "THAWED");
	}
	return -1;
}

/* ---- the helper that becomes the clone ---- */

struct thread_arg {
	int fd;
	struct bunshin_graft req;
	pthread_t thread;
	int err;
};

static struct thread_arg helper_threads[16];
static int helper_nthreads;

static void *graft_thread(void *p)
{
	struct thread_arg *t = p;

	/* returns only if the graft failed: this thread runs on in the helper */
	t->err = ioctl(t->fd, BUNSHIN_IOC_GRAFT_THREAD, &t->req) ? errno : 0;
	return NULL;
}

int other_threads(pid_t pid, uint32_t *tids, int max)
{
	char path[64];
	struct dirent *d;
	int n = 0;
	DIR *dir;

	snprintf(path, sizeof(path), "/proc/%d/task", pid);
	dir = opendir(path);
	if (!dir)
		return 0;
	while ((d = readdir(dir)) && n < max) {
		uint32_t tid = strtoul(d->d_name, NULL, 10);

		if (tid && tid != (uint32_t)pid)
			tids[n++] = tid;
	}
	closedir(dir);
	return n;
}

/* report the graft's errno, and how many parked threads came back with the same one */
static void helper_fail(int err)
{
	struct reply r = { .op = 'E', .v = { -err } };
	int i;

	for (i = 0; i < helper_nthreads; i++) {
		pthread_join(helper_threads[i].thread, NULL);
		r.v[1] += helper_threads[i].err == err;
	}

	if (write(OUT_FD, &r, sizeof(r)) != sizeof(r))
		_exit(4);
	_exit(3);
}

/* @fd moved to the lowest free number >= @min (unchanged if it is there already) */
static int move_up(int fd, unsigned int min)
{
	int moved;

	if (fd >= (int)min)
		return fd;
	moved = fcntl(fd, F_DUPFD_CLOEXEC, min);
	if (moved < 0)
		helper_fail(errno);
	close(fd);
	return moved;
}

static void helper_main(int pidfd, pid_t src_pid, const struct graft_opts *o)
{
	struct bunshin_graft req = { .flags = BUNSHIN_GRAFT_PIDFD, .source = pidfd };
	struct bunshin_remap remap;
	uint32_t tids[16];
	int fd, i, n;

	if (o->cgroup) {
		char path[160];

		snprintf(path, sizeof(path), "%s/cgroup.procs", o->cgroup);
		if (write_file(path, "0"))
			helper_fail(errno);
	}
	fd = o->session > 0 ? o->session : open("/dev/bunshin", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		helper_fail(errno);
	if (o->hold)
		req.flags |= BUNSHIN_GRAFT_HOLD;
	if (o->flags & HELPER_UNPRIVILEGED) {
		if (setgroups(0, NULL) || setgid(65534) || setuid(65534))
			helper_fail(errno);
	}
	/* a session handed over was negotiated by whoever opened it */
	if (o->session <= 0 && api(fd))
		helper_fail(errno);
	if (o->remap_to > 0) {
		remap.from = o->remap_from;
		remap.to = o->remap_to;
		req.flags |= BUNSHIN_GRAFT_REMAP;
		req.remap = (uint64_t)(uintptr_t)&remap;
		req.nr_remap = 1;
	}
	if (o->close_from) {
		/* the helper's own descriptors, above the ones the clone keeps */
		req.flags |= BUNSHIN_GRAFT_CLOSE;
		req.close_from = o->close_from;
		fd = move_up(fd, o->close_from);
		req.source = move_up(req.source, o->close_from);
		if (o->remap_to > 0) {
			remap.from = move_up(remap.from, o->close_from);
			remap.to = move_up(remap.to, o->close_from);
		}
	}
	if (o->flags & (HELPER_THREADS | HELPER_BAD_THREAD)) {
		n = other_threads(src_pid, tids, 15);
		if (o->flags & HELPER_BAD_THREAD)
			tids[n++] = 0x3ffffff0;
		for (i = 0; i < n; i++) {
			struct thread_arg *t = &helper_threads[i];

			t->fd = fd;
			/* a parked thread names only its source thread */
			t->req = (struct bunshin_graft){ .flags = BUNSHIN_GRAFT_PIDFD, .source = req.source,
							 .tid = tids[i] };
			if (pthread_create(&t->thread, NULL, graft_thread, t))
				helper_fail(errno);
			helper_nthreads++;
		}
	}
	if (graft_clock)
		*graft_clock = now_ns();
	if (ioctl(fd, BUNSHIN_IOC_GRAFT, &req))
		helper_fail(errno);
	/* not reached: the ioctl returns into the source's code */
	_exit(5);
}

int graft_start(struct proc *clone, struct proc *src, const struct graft_opts *o)
{
	int cmd[2], out[2];
	int pidfd;
	pid_t pid;

	pidfd = syscall(SYS_pidfd_open, src->pid, 0);
	if (pidfd < 0 || spawn_pipes(cmd, out))
		return -1;
	if (o->preload) {
		struct cmd c = { .op = o->preload };

		if (write(cmd[1], &c, sizeof(c)) != sizeof(c))
			return -1;
	}
	if (o->flags & HELPER_NEWNS)
		pid = syscall(SYS_clone, SIGCHLD | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET |
			      CLONE_NEWUTS | CLONE_NEWIPC, 0, 0, 0, 0);
	else
		pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		child_fds(cmd, out);
		helper_main(pidfd, src->pid, o);
	}
	close(pidfd);
	close(cmd[0]);
	close(out[1]);
	clone->pid = pid;
	clone->cmd = cmd[1];
	clone->out = out[0];
	return 0;
}

int graft_wait_threads(struct proc *clone, int *threads_back)
{
	struct pollfd pfd = { .fd = clone->out, .events = POLLIN };
	struct cmd c = { .op = 'P' };
	struct reply r;
	void (*was)(int);
	ssize_t n;
	int err;

	/*
	 * One reply comes: the failed helper's 'E', or the clone's answer to the ping. A failed helper writes its 'E'
	 * and exits, so on a busy machine the ping may find the command pipe without a reader: that write's EPIPE
	 * (SIGPIPE ignored for it, not fatal) still leaves the 'E' to read.
	 */
	was = signal(SIGPIPE, SIG_IGN);
	n = write(clone->cmd, &c, sizeof(c));
	err = errno;
	signal(SIGPIPE, was);
	if (n != sizeof(c) && err != EPIPE)
		return -EPIPE;
	if (poll(&pfd, 1, 20000) != 1 || read(clone->out, &r, sizeof(r)) != sizeof(r))
		return -ETIMEDOUT;
	if (threads_back)
		*threads_back = r.op == 'E' ? r.v[1] : 0;
	if (r.op == 'E')
		return (int)r.v[0];
	return r.op == 'P' ? 0 : -EPROTO;
}

/* ---- readers ---- */

int64_t pagemap_pfn(pid_t pid, uint64_t vaddr)
{
	char path[64];
	uint64_t e;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/pagemap", pid);
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return -1;
	if (pread(fd, &e, sizeof(e), vaddr / 4096 * 8) != sizeof(e))
		e = 0;
	close(fd);
	if (!(e >> 63))
		return -1;
	return e & ((1ULL << 55) - 1);
}

static long proc_value(pid_t pid, const char *file, const char *field)
{
	char path[64], line[256];
	size_t len = strlen(field);
	long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/%s", pid, file);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, field, len) && line[len] == ':')
			v = strtol(line + len + 1, NULL, 10);
	fclose(f);
	return v;
}

long smaps_value(pid_t pid, const char *field)
{
	return proc_value(pid, "smaps_rollup", field);
}

long status_value(pid_t pid, const char *field)
{
	return proc_value(pid, "status", field);
}

long file_long(const char *path, const char *key)
{
	char line[256];
	size_t len = key ? strlen(key) : 0;
	long v = -1;
	FILE *f = fopen(path, "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (!key) {
			v = strtol(line, NULL, 10);
			break;
		}
		if (!strncmp(line, key, len) && line[len] == ' ')
			v = strtol(line + len + 1, NULL, 10);
	}
	fclose(f);
	return v;
}

int write_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = write(fd, text, strlen(text));
	close(fd);
	return n == (ssize_t)strlen(text) ? 0 : -1;
}

int open_bunshin(void)
{
	return open("/dev/bunshin", O_RDWR | O_CLOEXEC);
}

int api(int fd)
{
	struct bunshin_api a = { .api = BUNSHIN_API,
				 .features = BUNSHIN_FEATURE_PIDFD | BUNSHIN_FEATURE_THREADS |
					     BUNSHIN_FEATURE_CLOSE | BUNSHIN_FEATURE_REMAP | BUNSHIN_FEATURE_HOLD };

	return ioctl(fd, BUNSHIN_IOC_API, &a);
}

static long slab_active(const char *name)
{
	char line[512], cache[64];
	long active = -1, v;
	FILE *f = fopen("/proc/slabinfo", "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%63s %ld", cache, &v) == 2 && !strcmp(cache, name))
			active = v;
	fclose(f);
	return active;
}

void counts_read(struct counts *c)
{
	const char *caches[] = { "mm_struct", "vm_area_struct", "task_struct", "filp" };
	char path[96];
	unsigned int i;

	/* RCU-freed tasks and files first, then empty the per-CPU slabs, which count as in use */
	usleep(300000);
	for (i = 0; i < 4; i++) {
		snprintf(path, sizeof(path), "/sys/kernel/slab/%s/shrink", caches[i]);
		write_file(path, "1");
	}
	c->mm = slab_active("mm_struct");
	c->vma = slab_active("vm_area_struct");
	c->task = slab_active("task_struct");
	c->filp = slab_active("filp");
	c->sessions = file_long("/sys/kernel/debug/bunshin/stats", "sessions");
	c->states = file_long("/sys/kernel/debug/bunshin/stats", "states");
}

bool counts_settle(const struct counts *start, struct counts *end, long filp_slack)
{
	int i;

	for (i = 0; i < 32; i++) {
		counts_read(end);
		if (end->mm - start->mm <= 4 && end->filp - start->filp <= filp_slack && !end->sessions &&
		    !end->states)
			return true;
	}
	return false;
}

uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}
