// SPDX-License-Identifier: GPL-2.0
/*
 * A multi-threaded workload for the tree fork (`treefork: threads`): four
 * threads that each check their own state, and a pipe carrying a counted byte
 * stream between two of them, watched through an epoll with an eventfd.
 *
 *   ticker   counts in a shared memfd page, checks its TLS and %r12
 *   writer   writes bytes 0, 1, 2, ... (mod 256) into the pipe, 1000 per second
 *   reader   waits on the epoll (pipe and eventfd), checks every byte follows
 *            the one before (a byte lost or duplicated in flight is caught)
 *   main     every 100 ms rewrites its report at offset 0 of an open file:
 *            "ticks T bytes B bad X heap H" (X counts any check that failed,
 *            H is the heap's address)
 *
 * It also holds @heap_mib MiB of private memory, written once (argv[1]), so
 * that the clone's sharing of it can be measured, and a zombie child (exit
 * status 3, never reaped).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAGIC 0x7472656566726b21ULL

struct shared {
	volatile uint64_t ticks, bytes, bad;
};

static struct shared *sh;
static int pipe_fds[2], epfd, evfd;
static __thread uint64_t tls;

static void nap(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000 };

	while (nanosleep(&ts, &ts))
		;
}

static void *ticker(void *arg)
{
	register uint64_t r12 asm("r12") = MAGIC;

	tls = MAGIC + 1;
	for (;;) {
		asm volatile ("" : "+r"(r12));
		if (r12 != MAGIC || tls != MAGIC + 1)
			sh->bad++;
		sh->ticks++;
		nap(10);
	}
	return arg;
}

static void *writer(void *arg)
{
	uint8_t next = 0;

	for (;;) {
		if (write(pipe_fds[1], &next, 1) == 1)
			next++;
		nap(1);
	}
	return arg;
}

static void *reader(void *arg)
{
	struct epoll_event ev[2];
	uint8_t buf[256], want = 0;
	uint64_t kicks;
	ssize_t n, i;
	int k, got;

	for (;;) {
		got = epoll_wait(epfd, ev, 2, 1000);
		for (k = 0; k < got; k++) {
			if (ev[k].data.u64 == 2) {
				if (read(evfd, &kicks, sizeof(kicks)) != sizeof(kicks))
					sh->bad++;
				continue;
			}
			n = read(pipe_fds[0], buf, sizeof(buf));
			for (i = 0; i < n; i++) {
				if (buf[i] != want)
					sh->bad++;
				want = buf[i] + 1;
			}
			if (n > 0)
				sh->bytes += n;
		}
	}
	return arg;
}

int main(int argc, char **argv)
{
	struct epoll_event ev = { .events = EPOLLIN };
	size_t heap = (argc > 1 ? atol(argv[1]) : 16) << 20;
	int memfd = memfd_create("treefork-threads", 0);
	int report = open(argc > 2 ? argv[2] : "/tmp/threads.out", O_WRONLY | O_CREAT | O_TRUNC, 0644);
	char *mem = mmap(NULL, heap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char line[160];
	pthread_t t;
	size_t i;
	int len;

	if (memfd < 0 || report < 0 || mem == MAP_FAILED || ftruncate(memfd, 4096) || pipe(pipe_fds))
		return 2;
	/* a child that exits with status 3 and is never reaped: a zombie the clone must have too */
	if (fork() == 0)
		_exit(3);
	for (i = 0; i < heap; i += 4096)
		mem[i] = (char)(i >> 12);
	sh = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	epfd = epoll_create1(EPOLL_CLOEXEC);
	evfd = eventfd(0, EFD_NONBLOCK);
	if (sh == MAP_FAILED || epfd < 0 || evfd < 0)
		return 2;
	ev.data.u64 = 1;
	epoll_ctl(epfd, EPOLL_CTL_ADD, pipe_fds[0], &ev);
	ev.data.u64 = 2;
	epoll_ctl(epfd, EPOLL_CTL_ADD, evfd, &ev);
	pthread_create(&t, NULL, ticker, NULL);
	pthread_create(&t, NULL, writer, NULL);
	pthread_create(&t, NULL, reader, NULL);
	for (;;) {
		nap(100);
		eventfd_write(evfd, 1);
		len = snprintf(line, sizeof(line), "ticks %llu bytes %llu bad %llu heap %llu\n",
			       (unsigned long long)sh->ticks, (unsigned long long)sh->bytes,
			       (unsigned long long)sh->bad, (unsigned long long)(uintptr_t)mem);
		if (pwrite(report, line, len, 0) != len || ftruncate(report, len))
			sh->bad++;
	}
}
