// SPDX-License-Identifier: GPL-2.0
/*
 * bunshin-treefork: builds the clone of a frozen process tree, given a plan
 * (stdin) the orchestrator made by reading the tree (envs/runtime/treefork/).
 *
 * In order: it opens what it reads from the source (a pidfd per process, the
 * pipes and sockets whose bytes in flight it copies, the shared-memory files
 * it copies, the files behind mappings to move), enters new mount, UTS, IPC
 * and network namespaces and the clone's root, creates the plan's open files
 * there (pipes with their bytes, files and directories at their offsets,
 * eventfds, epolls, copies of memfds and /dev/shm files, ptys (each at its
 * source's index, with its termios and window size; slaves opened through
 * their masters), Unix socket pairs
 * with their bytes, accepted connections, listeners, TCP listeners), and
 * starts the root helper as pid 1 of a new pid namespace, which joins the
 * clone's cgroup first and dies with the builder (PR_SET_PDEATHSIG). Each
 * helper creates its children with clone3() and set_tid (each keeps its pid),
 * takes its session and group (a session's leader its controlling terminal,
 * a group's leader the terminal's foreground for its group), installs its descriptors at their numbers,
 * adds its epolls' entries with its own numbers, takes its cwd, rlimits and
 * credentials, starts a thread per extra source thread (each keeps its tid and
 * parks in BUNSHIN_IOC_GRAFT_THREAD) and grafts its source (BUNSHIN_IOC_GRAFT:
 * close its own descriptors, hold until released, remap shared memory). A
 * zombie's helper exits at once with the zombie's status instead (its
 * parent's helper waits for that exit before grafting, not reaping it, and
 * drops the SIGCHLD it got: the clone gets no signal its source did not). A session
 * whose leader is gone from the source is started by a placeholder with the
 * leader's pid: it calls setsid(), makes the session's members with
 * CLONE_PARENT (they are its parent's children, as in the source) and exits;
 * its parent's helper reaps it before grafting. A session member its parent
 * adopted (its own parent died) while the session's leader, a sibling of it,
 * lives is made alike by that leader's helper. Each helper
 * reports a failure on a status pipe of its own; its hang-up before its graft
 * means it died. BUNSHIN_TREEFORK_FAULT kills a named step (tests).
 *
 * It reports on stdout, one line each: "grafted N MS" when every helper's graft
 * is done (N processes, MS since start), then, with hold, waits for a line on
 * stdin: "release" releases every clone at once, anything else (or EOF) kills
 * the clone. On any failure: "error PID ERRNO WHAT", the clone killed, exit 1.
 * After the release it stays as the parent of the clone's pid 1 and exits
 * with it (exit status 0 when the clone's init exits normally).
 *
 * Must never: leave a half-built clone (any failure kills the new pid
 * namespace's init, and with it every helper), or write to the source.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <linux/netlink.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <grp.h>
#include <time.h>
#include <unistd.h>

#include "../include/uapi/linux/bunshin.h"

#define MAX_OBJS	65536
#define SOCKET_PASSCRED	1	/* envs/runtime/treefork/plan.py */
#define MAX_PROCS	4096
#define MAX_LINE	8192

enum obj_kind { OBJ_NONE, OBJ_PIPE, OBJ_PIPE_W, OBJ_FILE, OBJ_DIR, OBJ_EVENTFD, OBJ_MEMFD, OBJ_SHM, OBJ_EPOLL,
		OBJ_SOCKETPAIR, OBJ_SOCKETPAIR_B, OBJ_ACCEPTED, OBJ_UNIX_LISTEN, OBJ_UNIX, OBJ_TCP_LISTEN, OBJ_NETLINK,
		OBJ_REOPEN, OBJ_INOTIFY, OBJ_PROC, OBJ_SYSV, OBJ_INHERIT, OBJ_PTMX, OBJ_PTS, OBJ_PIDFD };

struct obj {
	enum obj_kind kind;
	int fd;			/* the clone's open file, in the builder */
	int src;		/* what it is copied from (opened before entering the clone's root), or -1 */
	int peer;		/* OBJ_PIPE_W: the read end's object */
	int pipe_size;
	int flags;		/* file status flags (F_SETFL), open flags for files */
	long long offset;
	uint64_t count;
	unsigned int seals;
	char *path;		/* OBJ_FILE, OBJ_DIR: path in the clone's root; OBJ_MEMFD/OBJ_SHM: name */
	int type;		/* sockets: SOCK_STREAM, ...; OBJ_TCP_LISTEN: the port */
	int family;		/* OBJ_TCP_LISTEN; OBJ_NETLINK: the protocol */
	uint32_t nl_port, nl_groups;	/* OBJ_NETLINK: its port id and multicast groups */
	int nwatches;			/* OBJ_INOTIFY: its watches, by ascending descriptor number */
	struct inotify_watch *watches;
	int listener;		/* OBJ_ACCEPTED: the listener's object */
	int options;		/* a socket pair's end: SOCKET_PASSCRED (SO_PASSCRED) */
	pid_t src_pid;		/* a socket pair's end: the source process and descriptor its bytes come from */
	int src_fd;
	struct {		/* OBJ_SYSV: the segment (count: its size), the builder's attach of it */
		int id, key, mode;
		uid_t uid;
		gid_t gid;
		void *at;
	} sysv;
	struct {		/* OBJ_PTMX: the pair's index, its slave's termios and window size, packet mode */
		int index, packet;
		unsigned char termios[64], winsize[8];
		size_t termios_len;
	} pty;
};

struct inotify_watch {
	int wd;
	uint32_t mask;
	char *path;
};

struct fd_entry {
	int num, obj, cloexec;
};

struct remap_entry {
	int from;		/* the source's file, opened through /proc/PID/map_files */
	int obj;
};

struct watch {
	int epoll, target;	/* descriptor numbers in the clone process */
	uint32_t events;
	uint64_t data;
};

struct proc {
	pid_t pid, ppid, sid, pgid;	/* in the source's pid namespace: the clone's */
	pid_t host_pid;			/* the source's, in the builder's pid namespace */
	int zombie;			/* made, then exits at once with exit_code (a wait status) */
	int placeholder;		/* a gone session leader: starts the session, makes its members, exits */
	pid_t maker;			/* who makes it with CLONE_PARENT (a placeholder, or its session's leader), or 0: its parent */
	int exit_code;
	char *comm;			/* a zombie's name (a grafted process takes its source's) */
	char *cgroup_rel;		/* its cgroup below the clone's (NULL: the clone's own) */
	int cgroup_fd;			/* that cgroup's cgroup.procs, when some process is below (else -1) */
	int exit_signal;
	uid_t uid;
	gid_t gid;
	int ngroups;
	gid_t groups[64];
	char *cwd;
	int nthreads;
	pid_t *threads;		/* extra threads' tids (the main thread's tid is pid) */
	int nfds;
	struct fd_entry *fds;
	int nremaps;
	struct remap_entry *remaps;
	struct rlimit rlim[RLIM_NLIMITS];
	int has_rlim[RLIM_NLIMITS];
	int nwatches;
	struct watch *watches;	/* epoll interest lists it adds again */
	int status_r, status_w;	/* its helper reports a failure here; a hang-up before its graft: it died */
	int pidfd;		/* the source's */
	int session;		/* the /dev/bunshin this helper grafts on; the builder keeps it too */
	int ctty;		/* a session leader's controlling terminal: an OBJ_PTS (or -1) */
	int foreground;		/* a group leader's terminal whose foreground group its group is: an OBJ_PTS (or -1) */
};

static struct obj objs[MAX_OBJS];
static int nobjs;
static struct proc procs[MAX_PROCS];
static int nprocs;
static char *root_dir, *hostname;
static char *cgroup_dir;
static int close_from = 3, hold;
static const char *fault_who, *fault_step;	/* BUNSHIN_TREEFORK_FAULT=WHO:STEP, see fault() */
static pid_t fault_pid = 1;
static pid_t engine;				/* the builder's parent, which it dies with */
#define FAULT_KILL_ENGINE (-1)			/* a helper's report: "kill the engine now" */

/* a helper's report on its status pipe: why it failed (or FAULT_KILL_ENGINE) */
struct report {
	int32_t pid;
	int32_t err;
	char what[120];
};
static uint64_t started_ns;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

static int trace_fd = 2;	/* the builder's stderr, kept apart from the clone's descriptors */
static int self_fds = -1;	/* the builder's /proc/self/fd, opened before entering the clone's root */
static int proc_dir = -1;	/* the builder's /proc, likewise (SysV: its IPC sysctls, its map_files) */

/* a step, on stderr with the time since the start (the orchestrator shows it when a build fails) */
static void step(const char *what)
{
	dprintf(trace_fd, "%.3f ms %d %s\n", (now_ns() - started_ns) / 1e6, getpid(), what);
}

/*
 * Fault injection (the tree fork's fault tests): BUNSHIN_TREEFORK_FAULT=WHO:STEP
 * kills, at the named step, the builder ("builder"), the helper of clone pid
 * BUNSHIN_TREEFORK_FAULT_PID (default 1) ("helper"), the source's pid 1
 * ("source", by the builder) or the engine ("engine", by the builder at a
 * builder step, by that helper at a helper step). Builder steps: plan,
 * namespaces, files, init, grafted, released; helper steps: children,
 * descriptors, threads, graft.
 */
static void fault(const char *who, const char *at, pid_t pid, pid_t source)
{
	if (!fault_step || strcmp(fault_step, at))
		return;
	if (!strcmp(fault_who, "source") && !strcmp(who, "builder")) {
		dprintf(trace_fd, "fault: killing the source at %s\n", at);
		kill(source, SIGKILL);
	} else if (!strcmp(fault_who, "engine") && (!strcmp(who, "builder") || pid == fault_pid)) {
		/* the engine dies while the builder or a helper is at this step: a
		 * helper's pid namespace has no number for it, so the helper asks
		 * the builder on its status pipe and waits there to be killed */
		dprintf(trace_fd, "fault: killing the engine %d at %s of %s %d\n", engine, at, who, pid);
		if (!strcmp(who, "builder")) {
			kill(engine, SIGKILL);
		} else {
			struct report r = { .pid = pid, .err = FAULT_KILL_ENGINE };
			int i;

			for (i = 0; i < nprocs; i++)
				if (procs[i].pid == pid && write(procs[i].status_w, &r, sizeof(r)) == sizeof(r))
					for (;;)
						pause();
		}
	} else if (!strcmp(fault_who, who) && (!strcmp(who, "builder") || pid == fault_pid)) {
		dprintf(trace_fd, "fault: %s %d killed at %s\n", who, pid, at);
		/* a pid namespace's init ignores its own SIGKILL: it dies as a crash would end it */
		syscall(SYS_exit_group, 128 + SIGKILL);
	}
}

/*
 * The builder dies with the engine that started it (the thread that started
 * it, for PR_SET_PDEATHSIG: the engine starts builders from a thread that
 * lives as long as it does), and with it the clone, held or released: the
 * clone's pid 1 dies with the builder. BUNSHIN_TREEFORK_ENGINE names the
 * engine's pid: an engine already gone when the signal was set up is seen.
 */
static void die_with_engine(void)
{
	const char *named = getenv("BUNSHIN_TREEFORK_ENGINE");

	engine = getppid();
	if (prctl(PR_SET_PDEATHSIG, SIGKILL))
		exit(1);
	if (named && atoi(named) != getppid())
		exit(1);
}

static void fault_setup(void)
{
	static char spec[64];
	char *colon;

	if (!getenv("BUNSHIN_TREEFORK_FAULT"))
		return;
	snprintf(spec, sizeof(spec), "%s", getenv("BUNSHIN_TREEFORK_FAULT"));
	colon = strchr(spec, ':');
	if (!colon)
		return;
	*colon = 0;
	fault_who = spec;
	fault_step = colon + 1;
	if (getenv("BUNSHIN_TREEFORK_FAULT_PID"))
		fault_pid = atoi(getenv("BUNSHIN_TREEFORK_FAULT_PID"));
}

static void die(const char *fmt, ...)
{
	va_list ap;

	printf("error 0 %d ", errno);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	exit(1);
}

/* ---- the plan ---- */

static struct proc *proc_of(pid_t pid)
{
	int i;

	for (i = 0; i < nprocs; i++)
		if (procs[i].pid == pid)
			return &procs[i];
	die("plan: no process %d", pid);
	return NULL;
}

static struct obj *obj_new(int id)
{
	if (id < 0 || id >= MAX_OBJS)
		die("plan: object id %d out of range", id);
	if (id >= nobjs)
		nobjs = id + 1;
	objs[id].src = -1;
	objs[id].fd = -1;
	return &objs[id];
}

static char *rest(char *line, int fields)
{
	char *p = line;

	while (fields-- > 0) {
		p = strchr(p, ' ');
		if (!p)
			die("plan: short line: %s", line);
		p++;
	}
	return strdup(p);
}

/* @hex (two digits a byte) into @out, at most @max bytes; returns how many */
static size_t unhex(const char *hex, unsigned char *out, size_t max, const char *what)
{
	size_t n = 0;
	unsigned int byte;

	while (hex[0] && hex[1] && n < max && sscanf(hex, "%2x", &byte) == 1) {
		out[n++] = byte;
		hex += 2;
	}
	if (*hex)
		die("plan: bad %s (hex, at most %zu bytes)", what, max);
	return n;
}

#define GROW(arr, n) do { (arr) = realloc((arr), sizeof(*(arr)) * ((n) + 1)); \
			  if (!(arr)) die("out of memory"); } while (0)

static void parse_obj(char *line)
{
	char kind[16];
	int id, a, b;
	long long off;
	unsigned long long count;
	struct obj *o;

	if (sscanf(line, "obj %d %15s", &id, kind) != 2)
		die("plan: bad object line: %s", line);
	o = obj_new(id);
	if (!strcmp(kind, "pipe")) {
		o->kind = OBJ_PIPE;
		if (sscanf(line, "obj %*d pipe %d %d %d", &a, &b, &o->pipe_size) != 3)
			die("plan: bad pipe: %s", line);
		if (a > 0 && b >= 0) {
			char path[64];

			/* the source's read end, to copy its bytes in flight with tee() */
			snprintf(path, sizeof(path), "/proc/%d/fd/%d", a, b);
			o->src = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
			if (o->src < 0)
				die("cannot open the source's pipe %s", path);
		}
	} else if (!strcmp(kind, "pipe_w")) {
		o->kind = OBJ_PIPE_W;
		if (sscanf(line, "obj %*d pipe_w %d", &o->peer) != 1)
			die("plan: bad pipe_w: %s", line);
	} else if (!strcmp(kind, "file")) {
		o->kind = OBJ_FILE;
		if (sscanf(line, "obj %*d file %d %lld", &o->flags, &off) != 2)
			die("plan: bad file: %s", line);
		o->offset = off;
		o->path = rest(line, 5);
	} else if (!strcmp(kind, "dir") || !strcmp(kind, "proc")) {
		o->kind = kind[0] == 'd' ? OBJ_DIR : OBJ_PROC;
		if (sscanf(line, "obj %*d %*s %d %lld", &o->flags, &off) != 2)
			die("plan: bad %s: %s", kind, line);
		o->offset = off;
		o->path = rest(line, 5);
	} else if (!strcmp(kind, "eventfd")) {
		o->kind = OBJ_EVENTFD;
		if (sscanf(line, "obj %*d eventfd %llu %d", &count, &o->flags) != 2)
			die("plan: bad eventfd: %s", line);
		o->count = count;
	} else if (!strcmp(kind, "memfd") || !strcmp(kind, "shm")) {
		char path[96], where[64];

		/* "shm": count is 1 when the source's file was unlinked */
		o->kind = kind[0] == 'm' ? OBJ_MEMFD : OBJ_SHM;
		if (sscanf(line, "obj %*d %*s %d %u %d %63s %llu %lld", &o->flags, &o->seals, &a, where, &count,
			   &off) != 6)
			die("plan: bad %s: %s", kind, line);
		o->count = count;
		o->offset = off;
		o->path = rest(line, 9);
		/* the source's file: a descriptor ("fd/N") or a mapping ("map_files/START-END") */
		snprintf(path, sizeof(path), "/proc/%d/%s", a, where);
		o->src = open(path, O_RDONLY | O_CLOEXEC);
		if (o->src < 0)
			die("cannot open the source's shared memory %s", path);
	} else if (!strcmp(kind, "inherit")) {
		/* a descriptor of the caller's, passed to us at this number, in place of the source's file */
		o->kind = OBJ_INHERIT;
		if (sscanf(line, "obj %*d inherit %d", &o->src_fd) != 1 || fcntl(o->src_fd, F_GETFD) < 0)
			die("plan: inherit names no descriptor of ours: %s", line);
	} else if (!strcmp(kind, "sysv")) {
		char path[96], where[64];

		o->kind = OBJ_SYSV;
		if (sscanf(line, "obj %*d sysv %d %d %d %llu %u %u %d %63s", &o->sysv.id, &o->sysv.key,
			   &o->sysv.mode, &count, &o->sysv.uid, &o->sysv.gid, &a, where) != 8)
			die("plan: bad sysv: %s", line);
		o->count = count;
		/* the segment's shmem file, through a mapping of it: its bytes are read from there */
		snprintf(path, sizeof(path), "/proc/%d/%s", a, where);
		o->src = open(path, O_RDONLY | O_CLOEXEC);
		if (o->src < 0)
			die("cannot open the source's SysV segment %s", path);
	} else if (!strcmp(kind, "ptmx")) {
		char termios[2 * sizeof(o->pty.termios) + 1], winsize[2 * sizeof(o->pty.winsize) + 1];

		o->kind = OBJ_PTMX;
		if (sscanf(line, "obj %*d ptmx %d %d %d %128s %16s", &o->flags, &o->pty.index, &o->pty.packet, termios,
			   winsize) != 5 || o->pty.index < 0)
			die("plan: bad ptmx: %s", line);
		o->pty.termios_len = unhex(termios, o->pty.termios, sizeof(o->pty.termios), "termios");
		if (unhex(winsize, o->pty.winsize, sizeof(o->pty.winsize), "window size") != sizeof(o->pty.winsize))
			die("plan: bad window size: %s", line);
		o->path = rest(line, 8);
	} else if (!strcmp(kind, "pidfd")) {
		/* of the clone's process src_pid: opened by its holder's helper once that one is made */
		o->kind = OBJ_PIDFD;
		if (sscanf(line, "obj %*d pidfd %d %d", &o->src_pid, &o->flags) != 2 || o->src_pid <= 0)
			die("plan: bad pidfd: %s", line);
	} else if (!strcmp(kind, "pts")) {
		o->kind = OBJ_PTS;
		if (sscanf(line, "obj %*d pts %d %d", &o->peer, &o->flags) != 2)
			die("plan: bad pts: %s", line);
		o->path = rest(line, 5);
	} else if (!strcmp(kind, "epoll")) {
		o->kind = OBJ_EPOLL;
	} else if (!strcmp(kind, "accepted")) {
		o->kind = OBJ_ACCEPTED;
		if (sscanf(line, "obj %*d accepted %d %d %d", &o->listener, &o->src_pid, &o->src_fd) != 3)
			die("plan: bad accepted: %s", line);
	} else if (!strcmp(kind, "socketpair") || !strcmp(kind, "socketpair_b")) {
		o->kind = kind[10] ? OBJ_SOCKETPAIR_B : OBJ_SOCKETPAIR;
		if (sscanf(line, "obj %*d %*s %d %d %d %d", o->kind == OBJ_SOCKETPAIR ? &o->type : &o->peer,
			   &o->src_pid, &o->src_fd, &o->options) != 4)
			die("plan: bad %s: %s", kind, line);
		o->path = rest(line, 7);
	} else if (!strcmp(kind, "unix_listen") || !strcmp(kind, "unix")) {
		o->kind = kind[4] ? OBJ_UNIX_LISTEN : OBJ_UNIX;
		if (sscanf(line, "obj %*d %*s %d", &o->type) != 1)
			die("plan: bad %s: %s", kind, line);
		o->path = rest(line, 4);
	} else if (!strcmp(kind, "tcp_listen")) {
		o->kind = OBJ_TCP_LISTEN;
		if (sscanf(line, "obj %*d tcp_listen %d %d", &o->family, &o->type) != 2)
			die("plan: bad tcp_listen: %s", line);
		o->path = rest(line, 5);
	} else if (!strcmp(kind, "reopen")) {
		o->kind = OBJ_REOPEN;
		if (sscanf(line, "obj %*d reopen %d %d %lld", &o->peer, &o->flags, &off) != 3)
			die("plan: bad reopen: %s", line);
		o->offset = off;
	} else if (!strcmp(kind, "inotify")) {
		o->kind = OBJ_INOTIFY;
	} else if (!strcmp(kind, "netlink")) {
		o->kind = OBJ_NETLINK;
		if (sscanf(line, "obj %*d netlink %d %d %u %u", &o->type, &o->family, &o->nl_port,
			   &o->nl_groups) != 4)
			die("plan: bad netlink: %s", line);
	} else {
		die("plan: unknown object kind %s", kind);
	}
}

static void parse_line(char *line)
{
	int pid, a, b, c;
	unsigned long long cur, max;
	char *s;
	struct proc *p;

	if (!strncmp(line, "obj ", 4)) {
		parse_obj(line);
	} else if (!strncmp(line, "inotify_watch ", 14)) {
		struct inotify_watch w;

		if (sscanf(line, "inotify_watch %d %d %u", &a, &w.wd, &w.mask) != 3 || a < 0 || a >= nobjs ||
		    objs[a].kind != OBJ_INOTIFY)
			die("plan: bad inotify_watch: %s", line);
		w.path = rest(line, 4);
		GROW(objs[a].watches, objs[a].nwatches);
		objs[a].watches[objs[a].nwatches++] = w;
	} else if (!strncmp(line, "flags ", 6)) {
		if (sscanf(line, "flags %d %d", &a, &b) != 2 || a < 0 || a >= nobjs)
			die("plan: bad flags: %s", line);
		objs[a].flags = b;
	} else if (!strncmp(line, "watch ", 6)) {
		struct watch w;
		unsigned long long data;

		if (sscanf(line, "watch %d %d %d %u %llu", &pid, &w.epoll, &w.target, &w.events, &data) != 5)
			die("plan: bad watch: %s", line);
		w.data = data;
		p = proc_of(pid);
		GROW(p->watches, p->nwatches);
		p->watches[p->nwatches++] = w;
	} else if (!strncmp(line, "proc ", 5)) {
		if (nprocs >= MAX_PROCS)
			die("plan: too many processes");
		p = &procs[nprocs++];
		memset(p, 0, sizeof(*p));
		if (sscanf(line, "proc %d %d %d %d %d %d %u %u", &p->pid, &p->host_pid, &p->ppid, &p->sid,
			   &p->pgid, &p->exit_signal, &p->uid, &p->gid) != 8)
			die("plan: bad proc: %s", line);
		p->pidfd = -1;
		p->session = -1;
		p->cgroup_fd = -1;
		p->ctty = -1;
		p->foreground = -1;
	} else if (!strncmp(line, "groups ", 7)) {
		sscanf(line, "groups %d", &pid);
		p = proc_of(pid);
		s = strchr(line + 7, ' ');
		while (s && p->ngroups < 64 && sscanf(s, " %u", &p->groups[p->ngroups]) == 1) {
			p->ngroups++;
			s = strchr(s + 1, ' ');
		}
	} else if (!strncmp(line, "zombie ", 7)) {
		if (sscanf(line, "zombie %d %d", &pid, &a) != 2)
			die("plan: bad zombie: %s", line);
		p = proc_of(pid);
		p->zombie = 1;
		p->exit_code = a;
		p->comm = rest(line, 3);
	} else if (!strncmp(line, "cgroup_of ", 10)) {
		if (sscanf(line, "cgroup_of %d", &pid) != 1)
			die("plan: bad cgroup_of: %s", line);
		proc_of(pid)->cgroup_rel = rest(line, 2);
	} else if (!strncmp(line, "ctty ", 5) || !strncmp(line, "foreground ", 11)) {
		if (sscanf(line, "%*s %d %d", &pid, &a) != 2 || a < 0 || a >= nobjs || objs[a].kind != OBJ_PTS)
			die("plan: bad %s (not a pty slave): %s", line[0] == 'c' ? "ctty" : "foreground", line);
		*(line[0] == 'c' ? &proc_of(pid)->ctty : &proc_of(pid)->foreground) = a;
	} else if (!strncmp(line, "placeholder ", 12)) {
		if (sscanf(line, "placeholder %d", &pid) != 1)
			die("plan: bad placeholder: %s", line);
		proc_of(pid)->placeholder = 1;
	} else if (!strncmp(line, "maker ", 6)) {
		if (sscanf(line, "maker %d %d", &pid, &a) != 2 || proc_of(a)->zombie)
			die("plan: bad maker: %s", line);
		proc_of(pid)->maker = a;
	} else if (!strncmp(line, "cwd ", 4)) {
		sscanf(line, "cwd %d", &pid);
		proc_of(pid)->cwd = rest(line, 2);
	} else if (!strncmp(line, "thread ", 7)) {
		if (sscanf(line, "thread %d %d", &pid, &a) != 2)
			die("plan: bad thread: %s", line);
		p = proc_of(pid);
		GROW(p->threads, p->nthreads);
		p->threads[p->nthreads++] = a;
	} else if (!strncmp(line, "fd ", 3)) {
		if (sscanf(line, "fd %d %d %d %d", &pid, &a, &b, &c) != 4 || b < 0 || b >= nobjs)
			die("plan: bad fd: %s", line);
		p = proc_of(pid);
		GROW(p->fds, p->nfds);
		p->fds[p->nfds++] = (struct fd_entry){ a, b, c };
	} else if (!strncmp(line, "remap ", 6)) {
		char where[64], path[128];

		if (sscanf(line, "remap %d %d %63s %d", &pid, &a, where, &b) != 4 || b < 0 || b >= nobjs)
			die("plan: bad remap: %s", line);
		p = proc_of(pid);
		GROW(p->remaps, p->nremaps);
		snprintf(path, sizeof(path), "/proc/%d/map_files/%s", a, where);
		p->remaps[p->nremaps].from = open(path, O_RDONLY | O_CLOEXEC);
		if (p->remaps[p->nremaps].from < 0)
			die("cannot open the source's mapping %s", path);
		p->remaps[p->nremaps++].obj = b;
	} else if (!strncmp(line, "rlimit ", 7)) {
		if (sscanf(line, "rlimit %d %d %llu %llu", &pid, &a, &cur, &max) != 4 || a < 0 ||
		    a >= RLIM_NLIMITS)
			die("plan: bad rlimit: %s", line);
		p = proc_of(pid);
		p->rlim[a] = (struct rlimit){ cur, max };
		p->has_rlim[a] = 1;
	} else if (!strncmp(line, "root ", 5)) {
		root_dir = rest(line, 1);
	} else if (!strncmp(line, "hostname ", 9)) {
		hostname = rest(line, 1);
	} else if (!strncmp(line, "cgroup ", 7)) {
		cgroup_dir = rest(line, 1);
	} else if (!strncmp(line, "close_from ", 11)) {
		close_from = atoi(line + 11);
	} else if (!strncmp(line, "hold ", 5)) {
		hold = atoi(line + 5);
	} else if (line[0] && line[0] != '#') {
		die("plan: unknown line: %s", line);
	}
}

static void read_plan(void)
{
	static char line[MAX_LINE];
	size_t n;

	while (fgets(line, sizeof(line), stdin)) {
		n = strlen(line);
		if (n && line[n - 1] == '\n')
			line[--n] = 0;
		if (!strcmp(line, "end"))
			return;
		parse_line(line);
	}
	die("plan: no end line");
}

/* ---- the clone's open files, made by the builder ---- */

/* @fd moved to a number >= close_from, where no target descriptor is */
static int high(int fd)
{
	int moved;

	if (fd < 0 || fd >= close_from)
		return fd;
	moved = fcntl(fd, F_DUPFD, close_from);
	if (moved < 0)
		die("fcntl(F_DUPFD)");
	close(fd);
	return moved;
}

static void copy_contents(struct obj *o)
{
	struct stat st;
	off_t at = 0;
	ssize_t n;

	if (fstat(o->src, &st) || ftruncate(o->fd, st.st_size))
		die("copying %s: size", o->path);
	while (at < st.st_size) {
		n = sendfile(o->fd, o->src, &at, st.st_size - at);
		if (n <= 0)
			die("copying %s: sendfile", o->path);
	}
	if (o->seals && fcntl(o->fd, F_ADD_SEALS, o->seals))
		die("sealing %s", o->path);
}

/*
 * The bytes in flight to the source's socket @src, read without taking them
 * (one MSG_PEEK of all of them), written into @into: the new pair's other end,
 * so that they wait at this one. Descriptors in flight are refused.
 */
static void copy_in_flight(int src, int into)
{
	char control[CMSG_SPACE(sizeof(int) * 64)];
	struct msghdr msg = { 0 };
	struct iovec iov;
	struct cmsghdr *c;
	int queued = 0;
	char *buf;
	ssize_t n;

	if (ioctl(src, FIONREAD, &queued) || queued <= 0)
		return;
	buf = malloc(queued);
	if (!buf)
		die("out of memory");
	iov = (struct iovec){ buf, queued };
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = control;
	msg.msg_controllen = sizeof(control);
	n = recvmsg(src, &msg, MSG_PEEK | MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	for (c = CMSG_FIRSTHDR(&msg); n > 0 && c; c = CMSG_NXTHDR(&msg, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
			errno = EOPNOTSUPP;
			die("a socket with descriptors in flight");
		}
	if (n != queued)
		die("peeking at a socket's %d bytes in flight (got %zd)", queued, n);
	if (write(into, buf, n) != n)
		die("writing a socket's bytes in flight");
	free(buf);
}

/* @fd bound to @name ("@name" abstract, "-" none) */
static void bind_unix(int fd, const char *name)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	socklen_t len = sizeof(addr);
	struct stat old;
	int had = 0;

	if (!strcmp(name, "-"))
		return;
	if (strlen(name) >= sizeof(addr.sun_path))
		die("a Unix socket name too long: %s", name);
	if (name[0] == '@') {
		memcpy(addr.sun_path + 1, name + 1, strlen(name) - 1);
		len = offsetof(struct sockaddr_un, sun_path) + strlen(name);
	} else {
		/*
		 * the snapshot holds the source's socket file: this one takes its place, with
		 * its owner and mode (who may connect: the agent to its accessibility bus)
		 */
		had = !lstat(name, &old);
		if (unlink(name) && errno != ENOENT)
			die("unlink %s", name);
		strcpy(addr.sun_path, name);
	}
	if (bind(fd, (struct sockaddr *)&addr, len))
		die("bind %s", name);
	if (had && (lchown(name, old.st_uid, old.st_gid) || chmod(name, old.st_mode & 07777)))
		die("giving %s its source's owner and mode", name);
}

static int unix_bound(int type, const char *name, int listening)
{
	int fd = socket(AF_UNIX, type, 0);

	if (fd < 0)
		die("socket(AF_UNIX)");
	bind_unix(fd, name);
	if (listening && listen(fd, SOMAXCONN))
		die("listen %s", name);
	return fd;
}

static int tcp_listener(int family, int port, const char *address)
{
	struct sockaddr_storage addr = { 0 };
	socklen_t len;
	int fd = socket(family, SOCK_STREAM, 0), one = 1;

	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)))
		die("socket for %s:%d", address, port);
	if (family == AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)&addr;

		in->sin_family = AF_INET;
		in->sin_port = htons(port);
		len = sizeof(*in);
		if (inet_pton(AF_INET, address, &in->sin_addr) != 1)
			die("an IPv4 address: %s", address);
	} else {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&addr;

		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons(port);
		len = sizeof(*in6);
		if (inet_pton(AF_INET6, address, &in6->sin6_addr) != 1)
			die("an IPv6 address: %s", address);
	}
	if (bind(fd, (struct sockaddr *)&addr, len) || listen(fd, SOMAXCONN))
		die("listening at %s:%d", address, port);
	return fd;
}

/* a socket pair's end: its source's options, and its name (an autobound one, with SO_PASSCRED) */
static void pair_end(struct obj *o)
{
	int one = 1;

	if (o->options & SOCKET_PASSCRED && setsockopt(o->fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)))
		die("SO_PASSCRED");
	bind_unix(o->fd, o->path);
}

/*
 * An inotify instance whose watches get their source's descriptor numbers:
 * numbers are handed out in increasing order, so a watch added too early is
 * removed and added again until it gets its number. The removals' IN_IGNORED
 * events are read away (nothing else can be queued: nothing runs yet).
 */
static int make_inotify(struct obj *o)
{
	char buf[4096];
	int fd = inotify_init1(IN_NONBLOCK), i, wd, tries;

	if (fd < 0)
		die("inotify_init1");
	for (i = 0; i < o->nwatches; i++) {
		for (tries = 0; ; tries++) {
			wd = inotify_add_watch(fd, o->watches[i].path, o->watches[i].mask);
			if (wd < 0)
				die("inotify_add_watch %s", o->watches[i].path);
			if (wd == o->watches[i].wd)
				break;
			if (wd > o->watches[i].wd || tries > 1 << 16)
				die("inotify watch %s: descriptor %d, not %d", o->watches[i].path, wd, o->watches[i].wd);
			if (inotify_rm_watch(fd, wd))
				die("inotify_rm_watch");
		}
	}
	while (read(fd, buf, sizeof(buf)) > 0)
		;
	if (fcntl(fd, F_SETFL, 0))
		die("F_SETFL on an inotify instance");
	return fd;
}

/*
 * A SysV segment made again in the clone's IPC namespace (the builder is in
 * it): the same id (kernel.shm_next_id, set just before), key, size, mode and
 * owner, its pages copied where the source's has data (SEEK_DATA: a segment
 * is mostly holes, X's MIT-SHM reserves far more than it draws). The builder
 * attaches it, and every helper inherits the attach: the module moves the
 * clone's mappings onto that attach's file. A removed segment is removed
 * again at once: it lives on while attached, its key private.
 */
static void make_sysv(struct obj *o)
{
	struct shmid_ds ds;
	char name[64];
	off_t data = 0, hole;
	int next, id;
	ssize_t n;

	next = openat(proc_dir, "sys/kernel/shm_next_id", O_WRONLY | O_CLOEXEC);
	if (next < 0 || dprintf(next, "%d\n", o->sysv.id) < 0 || close(next))
		die("kernel.shm_next_id = %d", o->sysv.id);
	id = shmget(o->sysv.key ? o->sysv.key : IPC_PRIVATE, o->count, (o->sysv.mode & 0777) | IPC_CREAT | IPC_EXCL);
	if (id < 0)
		die("shmget of SysV segment %d", o->sysv.id);
	if (id != o->sysv.id)
		die("SysV segment %d made with id %d", o->sysv.id, id);
	o->sysv.at = shmat(id, NULL, 0);
	if (o->sysv.at == (void *)-1)
		die("shmat of SysV segment %d", id);
	while ((data = lseek(o->src, data, SEEK_DATA)) >= 0 && (unsigned long long)data < o->count) {
		hole = lseek(o->src, data, SEEK_HOLE);
		if (hole < 0)
			die("SEEK_HOLE in SysV segment %d", id);
		while (data < hole) {
			n = pread(o->src, (char *)o->sysv.at + data, hole - data, data);
			if (n <= 0)
				die("copying SysV segment %d", id);
			data += n;
		}
	}
	if (shmctl(id, IPC_STAT, &ds))
		die("IPC_STAT of SysV segment %d", id);
	ds.shm_perm.uid = o->sysv.uid;
	ds.shm_perm.gid = o->sysv.gid;
	ds.shm_perm.mode = o->sysv.mode & 0777;
	if (shmctl(id, IPC_SET, &ds))
		die("IPC_SET of SysV segment %d", id);
	if (o->sysv.mode & SHM_DEST && shmctl(id, IPC_RMID, NULL))
		die("IPC_RMID of SysV segment %d", id);
	/* its shmem file, as the remap's table wants it (the module finds the attach's own) */
	snprintf(name, sizeof(name), "self/map_files/%lx-%lx", (unsigned long)o->sysv.at,
		 (unsigned long)o->sysv.at + (unsigned long)((o->count + 4095) & ~4095ULL));
	o->fd = openat(proc_dir, name, O_RDWR | O_CLOEXEC);
	if (o->fd < 0)
		die("opening SysV segment %d's file", id);
}

/* once the clone is grafted: the builder's attaches go (the clone's hold the segments) */
static void detach_sysv(void)
{
	int i;

	for (i = 0; i < nobjs; i++)
		if (objs[i].kind == OBJ_SYSV && objs[i].sysv.at && shmdt(objs[i].sysv.at))
			die("shmdt of SysV segment %d", objs[i].sysv.id);
}

static void make_obj(int id)
{
	struct obj *o = &objs[id];
	int ends[2];
	ssize_t n;

	switch (o->kind) {
	case OBJ_NONE:
	case OBJ_PROC:	/* opened by its process's helper, in the clone's /proc */
	case OBJ_PIDFD:	/* likewise, once the process it refers to is made */
		return;
	case OBJ_PIPE:
		if (pipe2(ends, 0))
			die("pipe2");
		o->fd = ends[0];
		o->peer = high(ends[1]);	/* the write end, taken by its OBJ_PIPE_W */
		if (o->pipe_size && fcntl(o->peer, F_SETPIPE_SZ, o->pipe_size) < 0)
			die("F_SETPIPE_SZ %d", o->pipe_size);
		if (o->src >= 0) {
			n = tee(o->src, o->peer, INT32_MAX, SPLICE_F_NONBLOCK);
			if (n < 0 && errno != EAGAIN)
				die("tee() of a pipe's bytes in flight");
		}
		break;
	case OBJ_PIPE_W:
		if (o->peer < 0 || o->peer >= nobjs || objs[o->peer].kind != OBJ_PIPE)
			die("plan: pipe_w %d names no pipe", id);
		o->fd = objs[o->peer].peer;
		break;
	case OBJ_FILE:
		o->fd = open(o->path, o->flags & ~(O_CREAT | O_TRUNC | O_EXCL));
		if (o->fd < 0)
			die("open %s", o->path);
		if (lseek(o->fd, o->offset, SEEK_SET) < 0 && errno != ESPIPE)
			die("lseek %s", o->path);
		break;
	case OBJ_DIR:
		/* its open flags and its position in the directory's stream */
		o->fd = open(o->path, o->flags & ~(O_CREAT | O_TRUNC | O_EXCL));
		if (o->fd < 0)
			die("open directory %s", o->path);
		if (o->offset && lseek(o->fd, o->offset, SEEK_SET) < 0)
			die("lseek in directory %s", o->path);
		break;
	case OBJ_EVENTFD:
		o->fd = eventfd(0, 0);
		if (o->fd < 0 || (o->count && eventfd_write(o->fd, o->count)))
			die("eventfd");
		break;
	case OBJ_MEMFD:
		o->fd = memfd_create(o->path, o->seals ? MFD_ALLOW_SEALING : 0);
		if (o->fd < 0)
			die("memfd_create %s", o->path);
		copy_contents(o);
		if (lseek(o->fd, o->offset, SEEK_SET) < 0)
			die("lseek %s", o->path);
		break;
	case OBJ_SHM:
		/*
		 * a file in the clone's /dev/shm (a tmpfs), or a deleted file (a ghost), made at
		 * its path (which must be free: never clobbered, no link followed), then
		 * unlinked again if the source's was
		 */
		o->fd = open(o->path, O_RDWR | O_CREAT | O_EXCL, 0600);
		if (o->fd < 0)
			die("creating %s", o->path);
		copy_contents(o);
		if (lseek(o->fd, o->offset, SEEK_SET) < 0)
			die("lseek %s", o->path);
		if (o->count && unlink(o->path))
			die("unlinking %s", o->path);
		break;
	case OBJ_SYSV:
		make_sysv(o);
		break;
	case OBJ_INHERIT:
		o->fd = o->src_fd;	/* moved high below, like every object */
		break;
	case OBJ_EPOLL:
		o->fd = epoll_create1(0);
		if (o->fd < 0)
			die("epoll_create1");
		break;
	case OBJ_SOCKETPAIR:
		if (socketpair(AF_UNIX, o->type, 0, ends))
			die("socketpair");
		o->fd = ends[0];
		o->peer = high(ends[1]);	/* the other end, taken by its OBJ_SOCKETPAIR_B */
		copy_in_flight(o->src, o->peer);
		pair_end(o);
		break;
	case OBJ_ACCEPTED: {
		/* connected to the clone's listener and accepted there: it has the listener's name */
		struct sockaddr_un addr;
		socklen_t len = sizeof(addr);
		struct obj *l = o->listener >= 0 && o->listener < nobjs ? &objs[o->listener] : NULL;
		int client;

		if (!l || l->kind != OBJ_UNIX_LISTEN || l->fd < 0)
			die("plan: accepted %d names no listener", id);
		if (getsockname(l->fd, (struct sockaddr *)&addr, &len))
			die("getsockname");
		client = socket(AF_UNIX, SOCK_STREAM, 0);
		if (client < 0 || connect(client, (struct sockaddr *)&addr, len))
			die("connecting to %s", l->path);
		o->fd = accept4(l->fd, NULL, NULL, 0);
		if (o->fd < 0)
			die("accepting at %s", l->path);
		o->peer = high(client);	/* the client's end, taken by its OBJ_SOCKETPAIR_B */
		copy_in_flight(o->src, o->peer);
		break;
	}
	case OBJ_SOCKETPAIR_B:
		if (o->peer < 0 || o->peer >= nobjs ||
		    (objs[o->peer].kind != OBJ_SOCKETPAIR && objs[o->peer].kind != OBJ_ACCEPTED))
			die("plan: socketpair_b %d names no socket pair", id);
		o->fd = objs[o->peer].peer;
		copy_in_flight(o->src, objs[o->peer].fd);
		pair_end(o);
		break;
	case OBJ_UNIX_LISTEN:
	case OBJ_UNIX:
		o->fd = unix_bound(o->type, o->path, o->kind == OBJ_UNIX_LISTEN);
		break;
	case OBJ_TCP_LISTEN:
		o->fd = tcp_listener(o->family, o->type, o->path);
		break;
	case OBJ_REOPEN: {
		/* another open file of a copy: opened again through /proc with its own access mode */
		char name[16];

		if (o->peer < 0 || o->peer >= nobjs || (objs[o->peer].kind != OBJ_MEMFD && objs[o->peer].kind != OBJ_SHM))
			die("plan: reopen %d names no shared-memory copy", id);
		snprintf(name, sizeof(name), "%d", objs[o->peer].fd);
		o->fd = openat(self_fds, name, (o->flags & O_ACCMODE) | O_CLOEXEC);
		if (o->fd < 0 || lseek(o->fd, o->offset, SEEK_SET) < 0)
			die("opening object %d again", o->peer);
		o->flags &= ~O_ACCMODE;	/* what is left is for F_SETFL */
		break;
	}
	case OBJ_INOTIFY:
		o->fd = make_inotify(o);
		break;
	case OBJ_PTMX:	/* made before every other object: make_terminals() */
		break;
	case OBJ_PTS:
		/* never anyone's controlling terminal by opening it: its session's leader takes it (TIOCSCTTY) */
		if (o->peer < 0 || o->peer >= nobjs || objs[o->peer].kind != OBJ_PTMX || objs[o->peer].fd < 0)
			die("plan: pts %d names no pty master", id);
		/*
		 * through its master (TIOCGPTPEER), as glibc's openpty() does: the open file gets the
		 * source's flags exactly (an open() would add O_LARGEFILE, which no fcntl takes away)
		 */
		o->fd = ioctl(objs[o->peer].fd, TIOCGPTPEER, (o->flags & ~(O_CREAT | O_TRUNC | O_EXCL)) | O_NOCTTY);
		if (o->fd < 0)
			die("opening %s through its master", o->path);
		break;
	case OBJ_NETLINK: {
		/* in the clone's network namespace, at the source's port id (unique there too) and groups */
		struct sockaddr_nl addr = { .nl_family = AF_NETLINK, .nl_pid = o->nl_port,
					    .nl_groups = o->nl_groups };

		o->fd = socket(AF_NETLINK, o->type, o->family);
		if (o->fd < 0)
			die("netlink socket of protocol %d", o->family);
		if ((o->nl_port || o->nl_groups) && bind(o->fd, (struct sockaddr *)&addr, sizeof(addr)))
			die("binding a netlink socket to port %u groups %#x", o->nl_port, o->nl_groups);
		break;
	}
	}
	o->fd = high(o->fd);
	if (o->kind != OBJ_FILE && o->kind != OBJ_DIR && o->kind != OBJ_PTMX && o->kind != OBJ_PTS && o->flags &&
	    fcntl(o->fd, F_SETFL, o->flags))
		die("F_SETFL on object %d", id);
}

/*
 * The pty masters, in the order of their indexes: the clone's devpts is a new instance, which hands
 * out the lowest free index, so each is opened until it has its source's (the ones below it not in
 * the plan are held by spares, closed once all are made); then unlocked, with its slave's termios,
 * window size and packet mode.
 */
static void make_terminals(void)
{
	int spares[256], nspares = 0, unlock = 0, got, i;
	struct obj *o;

	for (;;) {
		o = NULL;
		for (i = 0; i < nobjs; i++)
			if (objs[i].kind == OBJ_PTMX && objs[i].fd < 0 && (!o || objs[i].pty.index < o->pty.index))
				o = &objs[i];
		if (!o)
			break;
		for (;;) {
			int fd = open(o->path, (o->flags & ~(O_CREAT | O_TRUNC | O_EXCL)) | O_NOCTTY);

			if (fd < 0)
				die("open %s", o->path);
			if (ioctl(fd, TIOCGPTN, &got))
				die("TIOCGPTN");
			if (got == o->pty.index) {
				o->fd = fd;
				break;
			}
			if (got > o->pty.index || nspares == (int)(sizeof(spares) / sizeof(spares[0])))
				die("pty %d cannot be had in the clone's devpts (it gave %d)", o->pty.index, got);
			spares[nspares++] = fd;
		}
		if (ioctl(o->fd, TIOCSPTLCK, &unlock))
			die("unlocking pty %d", o->pty.index);
		if (o->pty.termios_len && ioctl(o->fd, TCSETS, o->pty.termios))
			die("setting pty %d's termios", o->pty.index);
		if (ioctl(o->fd, TIOCSWINSZ, o->pty.winsize))
			die("setting pty %d's window size", o->pty.index);
		if (o->pty.packet && ioctl(o->fd, TIOCPKT, &o->pty.packet))
			die("setting pty %d's packet mode", o->pty.index);
	}
	while (nspares)
		close(spares[--nspares]);
}

static void make_objs(void)
{
	int i;

	make_terminals();

	/* in three passes: what the others need (listeners), accepted connections, the far ends of pairs */
	for (i = 0; i < nobjs; i++)
		if (objs[i].kind != OBJ_PIPE_W && objs[i].kind != OBJ_SOCKETPAIR_B && objs[i].kind != OBJ_ACCEPTED &&
		    objs[i].kind != OBJ_REOPEN)
			make_obj(i);
	for (i = 0; i < nobjs; i++)
		if (objs[i].kind == OBJ_ACCEPTED)
			make_obj(i);
	for (i = 0; i < nobjs; i++)
		if (objs[i].kind == OBJ_PIPE_W || objs[i].kind == OBJ_SOCKETPAIR_B || objs[i].kind == OBJ_REOPEN)
			make_obj(i);
	for (i = 0; i < nobjs; i++)
		if (objs[i].src >= 0)
			close(objs[i].src);
}

/*
 * Every open file the builder made, once the clone has its own descriptors of them: a pipe's end,
 * a socket, a pty or the caller's channel the builder kept would keep its peer from EOF or its
 * hang-up when the clone closes its last descriptor (and an end no clone process has, a pipe's
 * end whose source's is gone, is closed in the clone as in the source).
 */
static void close_objs(void)
{
	int i;

	for (i = 0; i < nobjs; i++) {
		struct obj *o = &objs[i];

		/* the far end a pipe or socket pair keeps for the object that takes it, if none did */
		if ((o->kind == OBJ_PIPE || o->kind == OBJ_SOCKETPAIR || o->kind == OBJ_ACCEPTED) && o->peer >= 0) {
			close(o->peer);
			o->peer = -1;
		}
		if (o->kind == OBJ_PIPE_W || o->kind == OBJ_SOCKETPAIR_B) {
			o->fd = -1;	/* the far end, closed above with the object that made it */
			continue;
		}
		if (o->fd >= 0)
			close(o->fd);
		o->fd = -1;
	}
}

/* ---- entering the clone's namespaces and root ---- */

static void enter_clone_world(void)
{
	struct ifreq ifr = { .ifr_name = "lo" };
	int sock;

	if (unshare(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET))
		die("unshare");
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL))
		die("making mounts private");
	if (hostname && sethostname(hostname, strlen(hostname)))
		die("sethostname");
	sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (sock < 0 || ioctl(sock, SIOCGIFFLAGS, &ifr))
		die("loopback");
	ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
	if (ioctl(sock, SIOCSIFFLAGS, &ifr))
		die("bringing loopback up");
	close(sock);
	if (root_dir && (chroot(root_dir) || chdir("/")))
		die("chroot %s", root_dir);
}

static int cgroup_procs = -1;	/* the clone's cgroup.procs, which its pid 1 joins */
static int builder_pidfd = -1;	/* ours, for the clone's pid 1 to see that we died before it could die with us */

static void open_cgroup(void)
{
	char path[4096];
	int i, below = 0;

	if (!cgroup_dir || !strcmp(cgroup_dir, "-"))
		return;
	snprintf(path, sizeof(path), "%s/cgroup.procs", cgroup_dir);
	cgroup_procs = open(path, O_WRONLY | O_CLOEXEC);
	if (cgroup_procs < 0)
		die("opening %s", path);
	for (i = 0; i < nprocs && !below; i++)
		below = procs[i].cgroup_rel != NULL;
	/* with a process below the clone's cgroup, each joins its own (a child is born in its parent's) */
	for (i = 0; i < nprocs && below; i++) {
		if (procs[i].cgroup_rel)
			snprintf(path, sizeof(path), "%s/%s/cgroup.procs", cgroup_dir, procs[i].cgroup_rel);
		else
			snprintf(path, sizeof(path), "%s/cgroup.procs", cgroup_dir);
		procs[i].cgroup_fd = open(path, O_WRONLY | O_CLOEXEC);
		if (procs[i].cgroup_fd < 0)
			die("opening %s", path);
	}
}

/* ---- helpers: one per process of the clone ---- */

static void helper_fail(struct proc *p, const char *what)
{
	struct report r = { .pid = p->pid, .err = errno };

	snprintf(r.what, sizeof(r.what), "%s", what);
	if (write(p->status_w, &r, sizeof(r)) != sizeof(r))
		_exit(3);
	_exit(2);
}

static long raw_syscall3(long nr, long a, long b, long c)
{
	long ret;

	asm volatile ("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
	return ret;
}

struct thread_start {
	int session;
	struct bunshin_graft req;
	struct proc *p;
};

/*
 * A parked thread: no libc (it shares the helper's TLS), raw system calls
 * only. Credentials are per thread: it takes the source's itself (it was
 * created with the helper's, which set_tid needs), then parks.
 */
static void park_thread(void *arg)
{
	struct thread_start *t = arg;
	struct proc *p = t->p;

	if (raw_syscall3(SYS_setgroups, p->ngroups, (long)p->groups, 0) ||
	    raw_syscall3(SYS_setresgid, p->gid, p->gid, p->gid) ||
	    raw_syscall3(SYS_setresuid, p->uid, p->uid, p->uid))
		raw_syscall3(SYS_exit_group, 2, 0, 0);	/* no thread may graft with more rights */
	raw_syscall3(SYS_ioctl, t->session, BUNSHIN_IOC_GRAFT_THREAD, (long)&t->req);
	/* only a failed graft returns here */
	raw_syscall3(SYS_exit, 0, 0, 0);
}

/* clone3() of a thread running @fn(@arg) on its own stack, then exiting */
static long clone3_thread(struct clone_args *args, void (*fn)(void *), void *arg)
{
	long ret;

	asm volatile (
		"mov %[fn], %%r12\n\t"
		"mov %[arg], %%r13\n\t"
		"syscall\n\t"
		"test %%rax, %%rax\n\t"
		"jnz 1f\n\t"
		"xor %%ebp, %%ebp\n\t"
		"mov %%r13, %%rdi\n\t"
		"call *%%r12\n\t"
		"mov $60, %%eax\n\t"
		"xor %%edi, %%edi\n\t"
		"syscall\n\t"
		"1:\n\t"
		: "=a"(ret)
		: "a"((long)SYS_clone3), "D"(args), "S"(sizeof(*args)), [fn] "r"(fn), [arg] "r"(arg)
		: "rcx", "r11", "r12", "r13", "memory");
	return ret;
}

static void start_threads(struct proc *p)
{
	int i;

	for (i = 0; i < p->nthreads; i++) {
		struct thread_start *t = calloc(1, sizeof(*t));
		size_t size = 64 << 10;
		char *stack = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		pid_t tid = p->threads[i];
		struct clone_args args = {
			.flags = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD |
				 CLONE_SYSVSEM,
			.stack = (uintptr_t)stack, .stack_size = size,
			.set_tid = (uintptr_t)&tid, .set_tid_size = 1,
		};

		if (!t || stack == MAP_FAILED)
			helper_fail(p, "thread stack");
		t->session = p->session;
		t->p = p;
		t->req = (struct bunshin_graft){ .flags = BUNSHIN_GRAFT_PIDFD, .source = p->pidfd,
						 .tid = (uint32_t)tid };
		if (clone3_thread(&args, park_thread, t) < 0)
			helper_fail(p, "clone3 of a thread with its tid");
	}
}

static int keep_cmp(const void *a, const void *b)
{
	return *(const int *)a - *(const int *)b;
}

/*
 * After @p's helper made its children: wait until each zombie child's helper
 * has exited (it exits at once, but may not have yet: the builder reports the
 * clone grafted without waiting for it, and a fork of the clone made right
 * after would find it running with the builder's descriptors), without
 * reaping it; then drop the SIGCHLD (or other exit signal) that its exit and
 * a placeholder's sent us, blocked until now: the clone carries no pending
 * signal of its source's, and must not get one the source never had.
 */
static void settle_zombies(struct proc *p)
{
	struct timespec zero = { 0, 0 };
	sigset_t sent;
	siginfo_t si;
	int i;

	sigemptyset(&sent);
	for (i = 0; i < nprocs; i++) {
		if (procs[i].ppid != p->pid || &procs[i] == p || procs[i].maker)
			continue;
		if (procs[i].zombie && waitid(P_PID, procs[i].pid, &si, WEXITED | WNOWAIT | __WALL))
			helper_fail(p, "waiting for a zombie's helper to exit");
		if ((procs[i].zombie || procs[i].placeholder) && procs[i].exit_signal > 0)
			sigaddset(&sent, procs[i].exit_signal);
	}
	while (sigtimedwait(&sent, NULL, &zero) > 0)
		;
}

/* close every descriptor but the planned ones (below close_from) and @keep (at or above it) */
static void close_others(struct proc *p, int *keep, int nkeep)
{
	unsigned int from = 0;
	int i, j, planned;

	for (i = 0; i < close_from; i++) {
		planned = 0;
		for (j = 0; j < p->nfds && !planned; j++)
			planned = p->fds[j].num == i;
		if (!planned)
			close(i);
	}
	qsort(keep, nkeep, sizeof(int), keep_cmp);
	from = close_from;
	for (i = 0; i < nkeep; i++) {
		if ((unsigned int)keep[i] > from)
			syscall(SYS_close_range, from, keep[i] - 1, 0);
		from = keep[i] + 1;
	}
	syscall(SYS_close_range, from, ~0U, 0);
}

static pid_t start_helper(struct proc *p, int newpid);

static void helper(struct proc *p)
{
	struct bunshin_remap *remaps = NULL;
	struct bunshin_graft req;
	int *keep, nkeep = 0;
	sigset_t all;
	siginfo_t info;
	struct timespec zero = { 0 };
	int i;

	if (p->pid == 1) {
		/* the builder's death (an orchestrator killed) takes the clone with it, wherever it is */
		struct pollfd builder = { .fd = builder_pidfd, .events = POLLIN };

		if (prctl(PR_SET_PDEATHSIG, SIGKILL))
			helper_fail(p, "PR_SET_PDEATHSIG");
		/* dead already (killed before the line above): nobody would ever release or kill us */
		if (poll(&builder, 1, 0) != 0)
			_exit(128 + SIGKILL);
		/* the clone's cgroup, before any child: they are born in it (the builder stays out) */
		if (cgroup_procs >= 0 && (write(cgroup_procs, "0\n", 2) != 2 || close(cgroup_procs)))
			helper_fail(p, "joining the clone's cgroup");
		if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL))
			helper_fail(p, "mounting /proc");
	}
	if (p->cgroup_fd >= 0 && write(p->cgroup_fd, "0\n", 2) != 2)
		helper_fail(p, "joining its cgroup below the clone's");
	/* a session or group numbered 0 is led from outside the pid namespace: the builder's, inherited */
	if (p->sid == p->pid) {
		if (setsid() < 0)
			helper_fail(p, "setsid");
		/* its controlling terminal, before any child: they are born in its session, with it */
		if (p->ctty >= 0 && ioctl(objs[p->ctty].fd, TIOCSCTTY, 0))
			helper_fail(p, "taking its controlling terminal (TIOCSCTTY)");
	} else if (p->pgid && getpgid(0) != p->pgid && setpgid(0, p->pgid)) {
		helper_fail(p, "setpgid");
	}
	if (p->foreground >= 0) {
		/* its group, the terminal's foreground one (from the background: SIGTTOU blocked meanwhile) */
		sigset_t ttou, old;

		sigemptyset(&ttou);
		sigaddset(&ttou, SIGTTOU);
		sigprocmask(SIG_BLOCK, &ttou, &old);
		if (tcsetpgrp(objs[p->foreground].fd, getpgrp()))
			helper_fail(p, "making its group the terminal's foreground group");
		sigprocmask(SIG_SETMASK, &old, NULL);
	}
	if (p->zombie) {
		/* its parent reaps it as the source's would: with the same status, under the same name */
		prctl(PR_SET_NAME, p->comm);
		if (WIFSIGNALED(p->exit_code)) {
			sigset_t one;

			sigemptyset(&one);
			sigaddset(&one, WTERMSIG(p->exit_code));
			signal(WTERMSIG(p->exit_code), SIG_DFL);
			sigprocmask(SIG_UNBLOCK, &one, NULL);
			raise(WTERMSIG(p->exit_code));
		}
		_exit(WEXITSTATUS(p->exit_code));
	}
	if (p->placeholder) {
		/* the session is started: its members are made in it, as its parent's children */
		for (i = 0; i < nprocs; i++)
			if (procs[i].maker == p->pid && start_helper(&procs[i], 0) < 0)
				helper_fail(p, "clone3 of a session member with its pid");
		_exit(0);
	}
	for (i = 0; i < nprocs; i++) {
		int status;
		pid_t child;

		if (procs[i].ppid != p->pid || &procs[i] == p || procs[i].maker)
			continue;
		child = start_helper(&procs[i], 0);
		if (child < 0)
			helper_fail(p, "clone3 of a child with its pid");
		/* a placeholder is reaped as soon as it has made its session's members */
		if (procs[i].placeholder && (waitpid(child, &status, __WALL) != child || status))
			helper_fail(p, "a session placeholder failed");
	}
	/* members of its session its parent adopted (their parent died): made with CLONE_PARENT */
	for (i = 0; i < nprocs; i++)
		if (procs[i].maker == p->pid && start_helper(&procs[i], 0) < 0)
			helper_fail(p, "clone3 of a session member with its pid");
	settle_zombies(p);
	fault("helper", "children", p->pid, 0);

	for (i = 0; i < p->nfds; i++) {
		struct obj *o = &objs[p->fds[i].obj];
		int waited;

		if (o->kind == OBJ_PIDFD) {
			/* the process is made by another helper, maybe not yet: wait for it (10 s at most) */
			for (waited = 0; (o->fd = syscall(SYS_pidfd_open, o->src_pid, o->flags & O_NONBLOCK)) < 0 &&
			     errno == ESRCH && waited < 10000; waited++)
				usleep(1000);
			if (o->fd < 0)
				helper_fail(p, "pidfd_open of a process of the clone");
			o->fd = high(o->fd);
			continue;
		}
		if (o->kind != OBJ_PROC)
			continue;
		o->fd = open(o->path, o->flags & ~(O_CREAT | O_TRUNC | O_EXCL));
		if (o->fd < 0 || lseek(o->fd, o->offset, SEEK_SET) < 0) {
			char what[sizeof(((struct report *)0)->what)];

			snprintf(what, sizeof(what), "opening %s", o->path);
			helper_fail(p, what);
		}
		o->fd = high(o->fd);
	}
	for (i = 0; i < p->nfds; i++) {
		struct fd_entry *f = &p->fds[i];

		if (dup2(objs[f->obj].fd, f->num) < 0 || fcntl(f->num, F_SETFD, f->cloexec ? FD_CLOEXEC : 0))
			helper_fail(p, "installing a descriptor");
	}
	for (i = 0; i < p->nwatches; i++) {
		struct epoll_event ev = { .events = p->watches[i].events, .data.u64 = p->watches[i].data };

		if (epoll_ctl(p->watches[i].epoll, EPOLL_CTL_ADD, p->watches[i].target, &ev))
			helper_fail(p, "adding an epoll's interest list entry");
	}
	if (p->cwd && chdir(p->cwd))
		helper_fail(p, "chdir");
	for (i = 0; i < RLIM_NLIMITS; i++)
		if (p->has_rlim[i] && setrlimit(i, &p->rlim[i]))
			helper_fail(p, "setrlimit");

	if (p->nremaps > BUNSHIN_REMAP_MAX)
		helper_fail(p, "more mappings to remap than BUNSHIN_REMAP_MAX");
	keep = calloc(4 + 2 * p->nremaps, sizeof(*keep));
	remaps = calloc(p->nremaps + 1, sizeof(*remaps));
	if (!keep || !remaps)
		helper_fail(p, "out of memory");
	keep[nkeep++] = p->status_w;
	keep[nkeep++] = trace_fd;
	keep[nkeep++] = p->session;
	keep[nkeep++] = p->pidfd;
	for (i = 0; i < p->nremaps; i++) {
		remaps[i].from = keep[nkeep++] = p->remaps[i].from;
		remaps[i].to = keep[nkeep++] = objs[p->remaps[i].obj].fd;
	}
	close_others(p, keep, nkeep);

	/* threads first: set_tid needs the helper's rights; each takes the source's credentials itself */
	step("descriptors installed");
	fault("helper", "descriptors", p->pid, 0);
	start_threads(p);
	step("threads started");
	fault("helper", "threads", p->pid, 0);
	if (raw_syscall3(SYS_setgroups, p->ngroups, (long)p->groups, 0) ||
	    raw_syscall3(SYS_setresgid, p->gid, p->gid, p->gid) ||
	    raw_syscall3(SYS_setresuid, p->uid, p->uid, p->uid))
		helper_fail(p, "taking the source's credentials");
	/* a graft takes the stricter of both sides' dumpable modes: the helper's must not be stricter */
	prctl(PR_SET_DUMPABLE, 1);
	/* nothing pending in the clone that the source did not have (a helper's SIGCHLD) */
	sigfillset(&all);
	while (sigtimedwait(&all, &info, &zero) > 0)
		;
	req = (struct bunshin_graft){
		.flags = BUNSHIN_GRAFT_PIDFD | BUNSHIN_GRAFT_CLOSE | (hold ? BUNSHIN_GRAFT_HOLD : 0) |
			 (p->nremaps ? BUNSHIN_GRAFT_REMAP : 0),
		.source = p->pidfd, .tid = 0, .close_from = close_from,
		.remap = p->nremaps ? (uintptr_t)remaps : 0, .nr_remap = p->nremaps,
	};
	step("grafting");
	fault("helper", "graft", p->pid, 0);
	if (ioctl(p->session, BUNSHIN_IOC_GRAFT, &req))
		helper_fail(p, "BUNSHIN_IOC_GRAFT");
	_exit(4);	/* not reached: the ioctl returns into the source's code */
}

static pid_t start_helper(struct proc *p, int newpid)
{
	pid_t tid = p->pid;
	/* a placeholder's session member is its parent's child (its exit signal is the placeholder's) */
	struct clone_args args = {
		.flags = (newpid ? CLONE_NEWPID : 0) | (p->maker ? CLONE_PARENT : 0),
		.exit_signal = p->maker ? 0 : p->exit_signal,
		.set_tid = (uintptr_t)&tid, .set_tid_size = 1,
	};
	pid_t pid = syscall(SYS_clone3, &args, sizeof(args));

	if (pid == 0)
		helper(p);
	return pid;
}

/* ---- the builder ---- */

static void open_sources(void)
{
	struct bunshin_api api;
	int i;

	for (i = 0; i < nprocs; i++) {
		struct proc *p = &procs[i];

		if (p->placeholder)
			continue;	/* nothing of it in the source */
		p->pidfd = syscall(SYS_pidfd_open, p->host_pid, 0);
		if (p->pidfd < 0)
			die("pidfd_open(%d)", p->host_pid);
		p->session = open("/dev/bunshin", O_RDWR);
		api = (struct bunshin_api){ .api = BUNSHIN_API, .features = BUNSHIN_FEATURE_PIDFD |
			BUNSHIN_FEATURE_THREADS | BUNSHIN_FEATURE_CLOSE | BUNSHIN_FEATURE_REMAP |
			BUNSHIN_FEATURE_HOLD };
		if (p->session < 0 || ioctl(p->session, BUNSHIN_IOC_API, &api))
			die("/dev/bunshin");
	}
	/* a socket pair's ends: the source's sockets, to peek at their bytes in flight */
	for (i = 0; i < nobjs; i++) {
		struct obj *o = &objs[i];
		int j;

		if (o->kind != OBJ_SOCKETPAIR && o->kind != OBJ_SOCKETPAIR_B && o->kind != OBJ_ACCEPTED)
			continue;
		for (j = 0; j < nprocs && procs[j].host_pid != o->src_pid; j++)
			;
		if (j == nprocs)
			die("plan: a socket of process %d, not in the plan", o->src_pid);
		o->src = syscall(SYS_pidfd_getfd, procs[j].pidfd, o->src_fd, 0);
		if (o->src < 0)
			die("pidfd_getfd of %d's descriptor %d", o->src_pid, o->src_fd);
	}
}

/* every builder-owned descriptor above the clone's */
static void move_high(void)
{
	int i, j;

	for (i = 0; i < nprocs; i++) {
		procs[i].pidfd = high(procs[i].pidfd);
		procs[i].session = high(procs[i].session);
		procs[i].cgroup_fd = high(procs[i].cgroup_fd);
		for (j = 0; j < procs[i].nremaps; j++)
			procs[i].remaps[j].from = high(procs[i].remaps[j].from);
	}
}

static void kill_clone(pid_t init)
{
	if (init > 0) {
		kill(init, SIGKILL);
		waitpid(init, NULL, __WALL);
	}
}

/*
 * Wait until every helper's graft is done, every thread of it with its state
 * (poll() on the sessions the builder kept), or one failed: a report on its
 * status pipe, a hang-up of that pipe before its session is done (the helper
 * died), or a session in error. (A graft's closing of the helper's own
 * descriptors comes late: their last release waits for the held clone's
 * return to user space.) Return 0, or the errno of the failure.
 */
static int wait_grafted(struct report *r)
{
	struct pollfd *pfd = calloc(2 * nprocs, sizeof(*pfd));
	int i, done;
	ssize_t n;

	if (!pfd)
		die("out of memory");
	for (i = 0; i < nprocs; i++) {
		/* a zombie's or placeholder's helper exits instead of grafting: nothing to wait for */
		int none = procs[i].zombie || procs[i].placeholder;

		pfd[2 * i] = (struct pollfd){ .fd = none ? -1 : procs[i].session, .events = POLLIN };
		pfd[2 * i + 1] = (struct pollfd){ .fd = none ? -1 : procs[i].status_r, .events = POLLIN };
	}
	for (;;) {
		if (poll(pfd, 2 * nprocs, -1) < 0 && errno != EINTR)
			die("poll");
		for (i = 0, done = 0; i < nprocs; i++) {
			short session = pfd[2 * i].revents, status = pfd[2 * i + 1].revents;

			*r = (struct report){ .pid = procs[i].pid, .err = EPROTO };
			if (status & POLLIN) {
				n = read(procs[i].status_r, r, sizeof(*r));
				if (n == sizeof(*r) && r->err == FAULT_KILL_ENGINE) {
					kill(engine, SIGKILL);	/* and the builder dies with it */
					for (;;)
						pause();
				}
				if (n == sizeof(*r))
					return r->err ? r->err : EPROTO;
			}
			if ((status & (POLLHUP | POLLERR)) && !(session & (POLLIN | POLLERR))) {
				/*
				 * A graft closes the helper's end of this pipe only once its session
				 * reads done (or failed); but poll() looked at the session before the
				 * pipe, and the graft may have ended in between. Look again before
				 * taking the hang-up for the helper's death.
				 */
				struct pollfd again = { .fd = procs[i].session, .events = POLLIN };

				if (poll(&again, 1, 0) == 1)
					session = again.revents;
			}
			if (session & POLLERR) {
				/* its helper's report says why, if it comes */
				struct pollfd one = { .fd = procs[i].status_r, .events = POLLIN };

				if (poll(&one, 1, 1000) == 1 &&
				    read(procs[i].status_r, r, sizeof(*r)) == sizeof(*r))
					return r->err ? r->err : EPROTO;
				*r = (struct report){ .pid = procs[i].pid, .err = EPROTO };
				snprintf(r->what, sizeof(r->what), "its graft failed");
				return EPROTO;
			}
			if (session & POLLIN || procs[i].zombie || procs[i].placeholder) {
				done++;
				pfd[2 * i + 1].fd = -1;	/* its pipe closes late, and means nothing now */
			} else if (status & (POLLHUP | POLLERR)) {
				*r = (struct report){ .pid = procs[i].pid, .err = ECHILD };
				snprintf(r->what, sizeof(r->what), "its helper died before its graft");
				return ECHILD;
			}
		}
		if (done == nprocs)
			return 0;
	}
}

int main(void)
{
	char command[64] = "";
	struct report r;
	int ends[2], status, i;
	sigset_t all;
	pid_t init;

	started_ns = now_ns();
	die_with_engine();
	setvbuf(stdout, NULL, _IOLBF, 0);
	setvbuf(stderr, NULL, _IOLBF, 0);
	read_plan();
	if (!nprocs || procs[0].pid != 1)
		die("plan: the first process must be the tree's pid 1");
	step("plan read");
	fault_setup();
	fault("builder", "plan", getpid(), procs[0].host_pid);
	open_sources();
	proc_dir = open("/proc", O_PATH | O_DIRECTORY | O_CLOEXEC);
	self_fds = open("/proc/self/fd", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (self_fds < 0)
		die("/proc/self/fd");
	open_cgroup();
	enter_clone_world();
	step("in the clone's namespaces and root");
	fault("builder", "namespaces", getpid(), procs[0].host_pid);
	make_objs();
	step("open files made");
	fault("builder", "files", getpid(), procs[0].host_pid);
	move_high();
	for (i = 0; i < nprocs; i++) {
		if (pipe2(ends, O_CLOEXEC))
			die("pipe2");
		procs[i].status_r = high(ends[0]);
		procs[i].status_w = high(ends[1]);
	}
	cgroup_procs = high(cgroup_procs);
	trace_fd = high(dup(2));
	builder_pidfd = high(syscall(SYS_pidfd_open, getpid(), 0));
	if (builder_pidfd < 0)
		die("pidfd_open of the builder");
	/* helpers run with every signal blocked (the graft sets the source's mask) */
	sigfillset(&all);
	sigprocmask(SIG_BLOCK, &all, NULL);
	init = start_helper(&procs[0], 1);
	if (init < 0)
		die("clone3 of the clone's pid 1");
	for (i = 0; i < nprocs; i++)
		close(procs[i].status_w);
	step("pid 1 started");
	fault("builder", "init", getpid(), procs[0].host_pid);
	if (wait_grafted(&r)) {
		kill_clone(init);
		printf("error %d %d %s\n", r.pid, r.err, r.what);
		return 1;
	}
	detach_sysv();
	close_objs();
	printf("grafted %d %.3f\n", nprocs, (now_ns() - started_ns) / 1e6);
	fault("builder", "grafted", getpid(), procs[0].host_pid);
	if (hold) {
		if (!fgets(command, sizeof(command), stdin) || strcmp(command, "release\n")) {
			kill_clone(init);
			printf("error 0 %d not released: the clone was killed\n", ECANCELED);
			return 1;
		}
		for (i = 0; i < nprocs; i++)
			if (procs[i].session >= 0 && ioctl(procs[i].session, BUNSHIN_IOC_RELEASE, 0))
				die("BUNSHIN_IOC_RELEASE");
		printf("released %.3f\n", (now_ns() - started_ns) / 1e6);
		fault("builder", "released", getpid(), procs[0].host_pid);
	}
	for (i = 0; i < nprocs; i++)
		if (procs[i].session >= 0)
			close(procs[i].session);
	fclose(stdout);
	if (waitpid(init, &status, __WALL) != init)
		return 1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
