/*
 * dirty_tracking.c - compare two userfaultfd dirty-page tracking schemes.
 *
 *   Option A: synchronous uffd write-protect (MODE_MISSING|MODE_WP). Every first
 *             write to a protected page is a WP fault delivered to a handler
 *             thread, which records the page dirty and un-protects it with
 *             UFFDIO_WRITEPROTECT(mode 0) (that ioctl also wakes the faulter).
 *   Option B: asynchronous uffd write-protect (UFFD_FEATURE_WP_ASYNC). The kernel
 *             resolves WP faults itself; dirty pages are collected (and
 *             re-protected) with the PAGEMAP_SCAN ioctl on /proc/self/pagemap.
 *
 * It also runs an eviction race test (scan/copy-out/MADV_DONTNEED while a writer
 * thread keeps writing) for both options and counts lost writes.
 *
 * Build: gcc -O2 -pthread -o dirty_tracking dirty_tracking.c
 * Run  : ./dirty_tracking [npages=16384] [reps=5] [race_seconds=2]   (needs root or
 *        vm.unprivileged_userfaultfd=1)
 *
 * Host headers (Debian 12, linux-libc-dev 6.1) predate WP_ASYNC and PAGEMAP_SCAN,
 * so the missing definitions are provided below. Values copied from the kernel
 * UAPI headers include/uapi/linux/userfaultfd.h and include/uapi/linux/fs.h
 * (Linux >= 6.7; unchanged through 6.18).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <linux/fs.h>
#include <linux/userfaultfd.h>

/* ---- definitions missing from older UAPI headers (values from kernel UAPI) ---- */
#ifndef USERFAULTFD_IOC
#define USERFAULTFD_IOC 0xAA
#endif
#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(USERFAULTFD_IOC, 0x00)
#endif
#ifndef UFFD_FEATURE_WP_HUGETLBFS_SHMEM
#define UFFD_FEATURE_WP_HUGETLBFS_SHMEM (1 << 12)
#endif
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef UFFD_FEATURE_POISON
#define UFFD_FEATURE_POISON (1 << 14)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif
#ifndef UFFD_FEATURE_MOVE
#define UFFD_FEATURE_MOVE (1 << 16)
#endif
#ifndef UFFDIO_COPY_MODE_WP
#define UFFDIO_COPY_MODE_WP ((__u64)1 << 1)
#endif
#ifndef UFFDIO_WRITEPROTECT_MODE_WP
#define UFFDIO_WRITEPROTECT_MODE_WP ((__u64)1 << 0)
#endif
#ifndef _UFFDIO_WRITEPROTECT
#define _UFFDIO_WRITEPROTECT (0x06)
#endif

#ifndef PAGEMAP_SCAN
/* include/uapi/linux/fs.h */
#define PAGE_IS_WPALLOWED (1 << 0)
#define PAGE_IS_WRITTEN (1 << 1)
#define PAGE_IS_FILE (1 << 2)
#define PAGE_IS_PRESENT (1 << 3)
#define PAGE_IS_SWAPPED (1 << 4)
#define PAGE_IS_PFNZERO (1 << 5)
#define PAGE_IS_HUGE (1 << 6)
#define PAGE_IS_SOFT_DIRTY (1 << 7)
struct page_region {
	__u64 start;
	__u64 end;
	__u64 categories;
};
#define PM_SCAN_WP_MATCHING (1 << 0)   /* Write protect the pages matched. */
#define PM_SCAN_CHECK_WPASYNC (1 << 1) /* Abort the scan when a non-WP-enabled page is found. */
struct pm_scan_arg {
	__u64 size;
	__u64 flags;
	__u64 start;
	__u64 end;
	__u64 walk_end;
	__u64 vec;
	__u64 vec_len;
	__u64 max_pages;
	__u64 category_inverted;
	__u64 category_mask;
	__u64 category_anyof_mask;
	__u64 return_mask;
};
#define PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)
#endif

/* ------------------------------------------------------------------------- */
static size_t PG;
static int NCPU;
static char *zero_page;
static int pagemap_fd = -1;

#define DIE(...)                                                                                   \
	do {                                                                                       \
		fprintf(stderr, "FATAL %s:%d: ", __FILE__, __LINE__);                              \
		fprintf(stderr, __VA_ARGS__);                                                      \
		fprintf(stderr, "\n");                                                             \
		exit(1);                                                                           \
	} while (0)

static inline uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static void spin_ns(uint64_t ns)
{
	if (!ns)
		return;
	uint64_t end = now_ns() + ns;
	while (now_ns() < end)
		__builtin_ia32_pause();
}

static void pin_self(int cpu)
{
	cpu_set_t s;
	CPU_ZERO(&s);
	if (cpu < 0) {
		for (int i = 0; i < NCPU; i++)
			CPU_SET(i, &s);
	} else {
		CPU_SET(cpu % NCPU, &s);
	}
	pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void print_features(const char *tag, uint64_t f)
{
	static const struct {
		uint64_t bit;
		const char *name;
	} names[] = {
		{UFFD_FEATURE_PAGEFAULT_FLAG_WP, "PAGEFAULT_FLAG_WP"},
		{UFFD_FEATURE_EVENT_FORK, "EVENT_FORK"},
		{UFFD_FEATURE_EVENT_REMAP, "EVENT_REMAP"},
		{UFFD_FEATURE_EVENT_REMOVE, "EVENT_REMOVE"},
		{UFFD_FEATURE_MISSING_HUGETLBFS, "MISSING_HUGETLBFS"},
		{UFFD_FEATURE_MISSING_SHMEM, "MISSING_SHMEM"},
		{UFFD_FEATURE_EVENT_UNMAP, "EVENT_UNMAP"},
		{UFFD_FEATURE_SIGBUS, "SIGBUS"},
		{UFFD_FEATURE_THREAD_ID, "THREAD_ID"},
		{UFFD_FEATURE_MINOR_HUGETLBFS, "MINOR_HUGETLBFS"},
		{UFFD_FEATURE_MINOR_SHMEM, "MINOR_SHMEM"},
		{UFFD_FEATURE_EXACT_ADDRESS, "EXACT_ADDRESS"},
		{UFFD_FEATURE_WP_HUGETLBFS_SHMEM, "WP_HUGETLBFS_SHMEM"},
		{UFFD_FEATURE_WP_UNPOPULATED, "WP_UNPOPULATED"},
		{UFFD_FEATURE_POISON, "POISON"},
		{UFFD_FEATURE_WP_ASYNC, "WP_ASYNC"},
		{UFFD_FEATURE_MOVE, "MOVE"},
	};
	printf("%s0x%" PRIx64 " =", tag, f);
	uint64_t known = 0;
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		known |= names[i].bit;
		if (f & names[i].bit)
			printf(" %s", names[i].name);
	}
	if (f & ~known)
		printf(" UNKNOWN(0x%" PRIx64 ")", f & ~known);
	printf("\n");
}

/* ---------------------------- uffd helpers -------------------------------- */
/* Open a userfaultfd and run UFFDIO_API with `features`. Returns fd or -errno;
 * *reported receives the feature set the kernel reports. */
static int uffd_open(uint64_t features, uint64_t *reported)
{
	int fd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (fd < 0) {
		int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
		if (dev < 0)
			return -errno;
		fd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
		int e = errno;
		close(dev);
		if (fd < 0)
			return -e;
	}
	struct uffdio_api api = {.api = UFFD_API, .features = features};
	if (ioctl(fd, UFFDIO_API, &api) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	if (reported)
		*reported = api.features;
	return fd;
}

static int uffd_wp(int uffd, void *addr, size_t len, int protect)
{
	struct uffdio_writeprotect wp = {
		.range = {.start = (uintptr_t)addr, .len = len},
		.mode = protect ? UFFDIO_WRITEPROTECT_MODE_WP : 0,
	};
	return ioctl(uffd, UFFDIO_WRITEPROTECT, &wp);
}

static void uffd_wake(int uffd, void *addr, size_t len)
{
	struct uffdio_range r = {.start = (uintptr_t)addr, .len = len};
	ioctl(uffd, UFFDIO_WAKE, &r);
}

/* UFFDIO_COPY npages from src (src_stride 0 = same page every time). */
static int uffd_fill(int uffd, char *dst, size_t npages, const char *src, uint64_t mode)
{
	for (size_t i = 0; i < npages; i++) {
		struct uffdio_copy c = {
			.dst = (uintptr_t)(dst + i * PG),
			.src = (uintptr_t)src,
			.len = PG,
			.mode = mode,
		};
		if (ioctl(uffd, UFFDIO_COPY, &c) < 0) {
			if (errno == EAGAIN) {
				i--;
				continue;
			}
			return -errno;
		}
	}
	return 0;
}

struct region {
	int uffd;
	char *base;
	size_t npages;
	uint64_t reg_ioctls;
	uint64_t features;
	uint64_t regmode;
};

static int region_setup(struct region *r, size_t npages, uint64_t features, uint64_t regmode)
{
	memset(r, 0, sizeof *r);
	r->npages = npages;
	r->uffd = uffd_open(features, &r->features);
	if (r->uffd < 0) {
		fprintf(stderr, "UFFDIO_API(features=0x%" PRIx64 ") failed: %s\n", features,
			strerror(-r->uffd));
		return r->uffd;
	}
	r->base = mmap(NULL, npages * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (r->base == MAP_FAILED)
		DIE("mmap: %s", strerror(errno));
	/* keep 4K PTEs so per-page numbers mean what they say (THP=always here) */
	madvise(r->base, npages * PG, MADV_NOHUGEPAGE);
	struct uffdio_register reg = {
		.range = {.start = (uintptr_t)r->base, .len = npages * PG},
		.mode = regmode,
	};
	if (ioctl(r->uffd, UFFDIO_REGISTER, &reg) < 0) {
		int e = errno;
		fprintf(stderr, "UFFDIO_REGISTER(mode=0x%" PRIx64 ") failed: %s\n", regmode, strerror(e));
		munmap(r->base, npages * PG);
		close(r->uffd);
		return -e;
	}
	r->regmode = regmode;
	r->reg_ioctls = reg.ioctls;
	if (!(reg.ioctls & (1ull << _UFFDIO_WRITEPROTECT)))
		fprintf(stderr, "warning: UFFDIO_WRITEPROTECT not offered for range (ioctls=0x%" PRIx64 ")\n",
			(uint64_t)reg.ioctls);
	return 0;
}

static void region_destroy(struct region *r)
{
	munmap(r->base, r->npages * PG);
	close(r->uffd);
}

/* ------------------------------ handler thread ----------------------------- */
struct handler {
	int uffd, stopfd, busy, cpu;
	atomic_int stop;
	char *base;
	size_t npages;
	const char *backing;  /* MISSING refill source (per page); NULL -> zero page */
	int lockproto;        /* option-A eviction protocol: hold page lock while un-protecting */
	atomic_uchar *lock;   /* per-page lock */
	atomic_uchar *dirty;  /* per-page dirty flag maintained by the handler */
	unsigned char *pending;
	size_t npending;
	uint64_t wp_faults, missing_faults, other_events, eexist, errors;
	int first_errno;
	pthread_t th;
};

static inline int try_lock(atomic_uchar *l)
{
	unsigned char z = 0;
	return atomic_compare_exchange_strong(l, &z, 1);
}
static inline void spin_lock(atomic_uchar *l)
{
	while (!try_lock(l))
		__builtin_ia32_pause();
}
static inline void spin_unlock(atomic_uchar *l) { atomic_store(l, 0); }

static void note_err(struct handler *h, int e)
{
	if (!h->errors++)
		h->first_errno = e;
}

/* returns 1 if resolved, 0 if deferred */
static int resolve_wp(struct handler *h, size_t p)
{
	char *a = h->base + p * PG;
	if (h->lockproto) {
		if (!try_lock(&h->lock[p]))
			return 0;
	}
	if (h->dirty)
		atomic_store(&h->dirty[p], 1);
	if (uffd_wp(h->uffd, a, PG, 0) < 0) {
		/* e.g. page got zapped meanwhile: still wake the faulter so it retries */
		if (errno != ENOENT)
			note_err(h, errno);
		uffd_wake(h->uffd, a, PG);
	}
	if (h->lockproto)
		spin_unlock(&h->lock[p]);
	return 1;
}

static void resolve_missing(struct handler *h, size_t p)
{
	char *a = h->base + p * PG;
	struct uffdio_copy c = {
		.dst = (uintptr_t)a,
		.src = (uintptr_t)(h->backing ? h->backing + p * PG : zero_page),
		.len = PG,
		.mode = UFFDIO_COPY_MODE_WP, /* re-arm tracking on refill */
	};
	if (ioctl(h->uffd, UFFDIO_COPY, &c) < 0) {
		if (errno == EEXIST)
			h->eexist++;
		else
			note_err(h, errno);
		uffd_wake(h->uffd, a, PG);
	}
}

static void retry_pending(struct handler *h)
{
	for (size_t p = 0; p < h->npages && h->npending; p++) {
		if (h->pending[p] && resolve_wp(h, p)) {
			h->pending[p] = 0;
			h->npending--;
		}
	}
}

static void process_msgs(struct handler *h, struct uffd_msg *m, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (m[i].event != UFFD_EVENT_PAGEFAULT) {
			h->other_events++;
			continue;
		}
		uint64_t addr = m[i].arg.pagefault.address & ~(uint64_t)(PG - 1);
		size_t p = (addr - (uintptr_t)h->base) / PG;
		if (p >= h->npages) {
			note_err(h, ERANGE);
			continue;
		}
		if (m[i].arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP) {
			h->wp_faults++;
			if (h->pending && h->pending[p])
				continue; /* already queued */
			if (!resolve_wp(h, p)) {
				h->pending[p] = 1;
				h->npending++;
			}
		} else {
			h->missing_faults++;
			resolve_missing(h, p);
		}
	}
}

static void *handler_main(void *arg)
{
	struct handler *h = arg;
	struct uffd_msg msgs[32];
	pin_self(h->cpu);
	for (;;) {
		if (h->busy) {
			ssize_t n = read(h->uffd, msgs, sizeof msgs);
			if (n < 0) {
				if (errno == EAGAIN) {
					if (h->npending)
						retry_pending(h);
					if (atomic_load_explicit(&h->stop, memory_order_relaxed))
						break;
					continue;
				}
				if (errno == EINTR)
					continue;
				note_err(h, errno);
				break;
			}
			process_msgs(h, msgs, n / sizeof msgs[0]);
		} else {
			struct pollfd pf[2] = {{.fd = h->uffd, .events = POLLIN},
					       {.fd = h->stopfd, .events = POLLIN}};
			int r = poll(pf, 2, h->npending ? 0 : -1);
			if (r < 0) {
				if (errno == EINTR)
					continue;
				note_err(h, errno);
				break;
			}
			if (pf[1].revents)
				break;
			if (pf[0].revents & POLLIN) {
				ssize_t n = read(h->uffd, msgs, sizeof msgs);
				if (n > 0)
					process_msgs(h, msgs, n / sizeof msgs[0]);
				else if (n < 0 && errno != EAGAIN && errno != EINTR)
					note_err(h, errno);
			}
			if (pf[0].revents & (POLLERR | POLLHUP))
				break;
			if (h->npending)
				retry_pending(h);
		}
	}
	return NULL;
}

static void handler_start(struct handler *h, struct region *r, int busy, int cpu)
{
	memset(h, 0, sizeof *h);
	h->uffd = r->uffd;
	h->base = r->base;
	h->npages = r->npages;
	h->busy = busy;
	h->cpu = cpu;
	h->stopfd = eventfd(0, EFD_CLOEXEC);
	if (h->stopfd < 0)
		DIE("eventfd: %s", strerror(errno));
}
static void handler_run(struct handler *h)
{
	if (pthread_create(&h->th, NULL, handler_main, h))
		DIE("pthread_create");
}
static void handler_stop(struct handler *h)
{
	atomic_store(&h->stop, 1);
	uint64_t one = 1;
	if (write(h->stopfd, &one, sizeof one) != sizeof one)
		DIE("eventfd write");
	pthread_join(h->th, NULL);
	close(h->stopfd);
}

/* ------------------------------ PAGEMAP_SCAN ------------------------------- */
static long pm_scan(uint64_t start, uint64_t end, struct page_region *vec, size_t vlen, uint64_t *walk_end)
{
	struct pm_scan_arg a = {
		.size = sizeof a,
		.flags = PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
		.start = start,
		.end = end,
		.vec = (uintptr_t)vec,
		.vec_len = vlen,
		.category_mask = PAGE_IS_WRITTEN,
		.return_mask = PAGE_IS_WRITTEN,
	};
	long r = ioctl(pagemap_fd, PAGEMAP_SCAN, &a);
	if (walk_end)
		*walk_end = a.walk_end;
	return r;
}

/* Scan [start,end) completely; marks found pages in `found` (may be NULL).
 * Returns number of dirty pages found, or -errno. */
static long pm_scan_all(struct region *r, uint64_t start, uint64_t end, struct page_region *vec, size_t vlen,
			unsigned char *found)
{
	long pages = 0;
	while (start < end) {
		uint64_t we = 0;
		long n = pm_scan(start, end, vec, vlen, &we);
		if (n < 0)
			return -errno;
		for (long i = 0; i < n; i++) {
			pages += (vec[i].end - vec[i].start) / PG;
			if (found)
				for (uint64_t a = vec[i].start; a < vec[i].end; a += PG)
					found[(a - (uintptr_t)r->base) / PG] = 1;
		}
		if (we >= end || we <= start)
			break;
		start = we;
	}
	return pages;
}

/* ------------------------------ statistics --------------------------------- */
#define MAXREP 64
struct metric {
	const char *name;
	const char *unit;
	double v[MAXREP];
	int n;
};
static int cmpd(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}
static void madd(struct metric *m, double v)
{
	if (m->n < MAXREP)
		m->v[m->n++] = v;
}
static void mprint(struct metric *m)
{
	if (!m->n) {
		printf("  %-62s %10s\n", m->name, "n/a");
		return;
	}
	double s[MAXREP];
	memcpy(s, m->v, m->n * sizeof(double));
	qsort(s, m->n, sizeof(double), cmpd);
	double med = (m->n & 1) ? s[m->n / 2] : (s[m->n / 2 - 1] + s[m->n / 2]) / 2;
	printf("  %-62s %10.3f  [min %8.3f max %8.3f] %s\n", m->name, med, s[0], s[m->n - 1], m->unit);
}

/* ------------------------------ baseline ----------------------------------- */
static double baseline_demand_zero(size_t npages)
{
	char *b = mmap(NULL, npages * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (b == MAP_FAILED)
		DIE("mmap");
	madvise(b, npages * PG, MADV_NOHUGEPAGE);
	uint64_t t0 = now_ns();
	for (size_t i = 0; i < npages; i++)
		((volatile char *)b)[i * PG] = 1;
	uint64_t t1 = now_ns();
	munmap(b, npages * PG);
	return (t1 - t0) / 1e3 / npages;
}

/* ------------------------------ Option A ----------------------------------- */
struct resA {
	double fill, first_write, reprot32, rewrite, reprot_range;
	uint64_t wp_faults;
	int ok;
};

static struct resA run_optionA(size_t N, int busy, int hcpu, int extras)
{
	struct resA res = {0};
	struct region r;
	if (region_setup(&r, N, UFFD_FEATURE_PAGEFAULT_FLAG_WP,
			 UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP) < 0)
		return res;
	struct handler h;
	handler_start(&h, &r, busy, hcpu);
	handler_run(&h);

	char *src = aligned_alloc(PG, PG);
	memset(src, 0x5a, PG);
	uint64_t t0 = now_ns();
	int e = uffd_fill(r.uffd, r.base, N, src, UFFDIO_COPY_MODE_WP);
	uint64_t t1 = now_ns();
	if (e < 0)
		DIE("optionA UFFDIO_COPY(MODE_WP): %s", strerror(-e));
	res.fill = (t1 - t0) / 1e3 / N;

	/* first write to each write-protected page: WP fault -> handler -> WRITEPROTECT(0) */
	t0 = now_ns();
	for (size_t i = 0; i < N; i++)
		((volatile char *)r.base)[i * PG] = 1;
	t1 = now_ns();
	res.first_write = (t1 - t0) / 1e3 / N;
	uint64_t wpf = h.wp_faults; /* racy read but handler is idle now */

	if (extras) {
		/* re-protect batches of 32 scattered (every other) pages, one ioctl per page */
		size_t nb = (N / 2) / 32, cnt = 0;
		t0 = now_ns();
		for (size_t b = 0; b < nb; b++)
			for (size_t j = 0; j < 32; j++) {
				size_t p = 2 * (b * 32 + j);
				if (uffd_wp(r.uffd, r.base + p * PG, PG, 1) < 0)
					DIE("UFFDIO_WRITEPROTECT(WP) page %zu: %s", p, strerror(errno));
				cnt++;
			}
		t1 = now_ns();
		res.reprot32 = (t1 - t0) / 1e3 / cnt;

		/* write the re-protected pages again (second-round fault cost) */
		t0 = now_ns();
		for (size_t b = 0; b < nb; b++)
			for (size_t j = 0; j < 32; j++)
				((volatile char *)r.base)[2 * (b * 32 + j) * PG] = 2;
		t1 = now_ns();
		res.rewrite = (t1 - t0) / 1e3 / cnt;

		/* whole range re-protect with a single ioctl (all pages currently writable) */
		t0 = now_ns();
		if (uffd_wp(r.uffd, r.base, N * PG, 1) < 0)
			DIE("UFFDIO_WRITEPROTECT(WP) range: %s", strerror(errno));
		t1 = now_ns();
		res.reprot_range = (t1 - t0) / 1e3 / N;
	}
	handler_stop(&h);
	res.wp_faults = wpf;
	res.ok = (wpf == N) && h.errors == 0;
	if (h.errors)
		fprintf(stderr, "optionA handler errors: %" PRIu64 " (first: %s)\n", h.errors,
			strerror(h.first_errno));
	free(src);
	region_destroy(&r);
	return res;
}

/* ------------------------------ Option B ----------------------------------- */
struct resB {
	double fill, first_write;
	double full_all_pp, full_all_pd;       /* full-range scan, all pages dirty */
	double full_clean_pp;                   /* full-range scan, nothing dirty */
	double write_third;                     /* first write after re-protect, every 3rd page */
	double full_third_pp, full_third_pd;   /* full-range scan, every 3rd page dirty */
	double batch_all_pp, batch_all_pd;     /* 32-page scattered batches, all dirty */
	double batch_third_pp, batch_third_pd; /* 32-page scattered batches, every 3rd dirty */
	int verify_full_all, verify_full_third, verify_clean, verify_batch_all, verify_batch_third;
	int ok;
};

static uint64_t B_regmode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP;

static int check_set(size_t N, const unsigned char *found, int (*expect)(size_t), const char *what)
{
	size_t fp = 0, fn = 0;
	for (size_t i = 0; i < N; i++) {
		int e = expect(i);
		if (found[i] && !e)
			fp++;
		if (!found[i] && e)
			fn++;
	}
	if (fp || fn)
		fprintf(stderr, "VERIFY FAIL (%s): %zu reported-but-not-written, %zu written-but-missed\n", what,
			fp, fn);
	return !fp && !fn;
}
static int exp_all(size_t i) { (void)i; return 1; }
static int exp_none(size_t i) { (void)i; return 0; }
static int exp_third(size_t i) { return i % 3 == 0; }
static int exp_even(size_t i) { return i % 2 == 0; }
static int exp_sixth(size_t i) { return i % 6 == 0; }

/* scan every other page in batches of 32 pages, one PAGEMAP_SCAN per page */
static long batch_scan(struct region *r, size_t N, struct page_region *vec, unsigned char *found, double *us,
		       size_t *scanned)
{
	size_t nb = (N / 2) / 32, cnt = 0;
	long dirty = 0;
	uint64_t t0 = now_ns();
	for (size_t b = 0; b < nb; b++)
		for (size_t j = 0; j < 32; j++) {
			size_t p = 2 * (b * 32 + j);
			uint64_t a = (uintptr_t)(r->base + p * PG);
			long n = pm_scan(a, a + PG, vec, 1, NULL);
			if (n < 0)
				DIE("PAGEMAP_SCAN page %zu: %s", p, strerror(errno));
			if (n > 0) {
				dirty++;
				found[p] = 1;
			}
			cnt++;
		}
	uint64_t t1 = now_ns();
	*us = (t1 - t0) / 1e3;
	*scanned = cnt;
	return dirty;
}

static struct resB run_optionB(size_t N)
{
	struct resB res = {0};
	struct region r;
	if (region_setup(&r, N, UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED, B_regmode) < 0)
		return res;
	struct handler h; /* only MISSING faults can reach it (none expected here) */
	handler_start(&h, &r, 0, 1);
	handler_run(&h);

	struct page_region *vec = calloc(N + 1, sizeof *vec);
	unsigned char *found = calloc(N, 1);
	char *src = aligned_alloc(PG, PG);
	memset(src, 0x5a, PG);
	uint64_t base = (uintptr_t)r.base, end = base + N * PG;

	uint64_t t0 = now_ns();
	int e = uffd_fill(r.uffd, r.base, N, src, UFFDIO_COPY_MODE_WP);
	uint64_t t1 = now_ns();
	if (e < 0)
		DIE("optionB UFFDIO_COPY(MODE_WP): %s", strerror(-e));
	res.fill = (t1 - t0) / 1e3 / N;

	/* 1. first write to every page: resolved by the kernel, no uffd message */
	t0 = now_ns();
	for (size_t i = 0; i < N; i++)
		((volatile char *)r.base)[i * PG] = 1;
	t1 = now_ns();
	res.first_write = (t1 - t0) / 1e3 / N;

	/* 2. full-range scan, all dirty (also re-protects) */
	memset(found, 0, N);
	t0 = now_ns();
	long d = pm_scan_all(&r, base, end, vec, N + 1, found);
	t1 = now_ns();
	if (d < 0)
		DIE("PAGEMAP_SCAN full range: %s", strerror((int)-d));
	res.full_all_pp = (t1 - t0) / 1e3 / N;
	res.full_all_pd = d ? (t1 - t0) / 1e3 / d : 0;
	res.verify_full_all = check_set(N, found, exp_all, "full scan, all written");

	/* 3. full-range scan again: nothing dirty */
	memset(found, 0, N);
	t0 = now_ns();
	d = pm_scan_all(&r, base, end, vec, N + 1, found);
	t1 = now_ns();
	res.full_clean_pp = (t1 - t0) / 1e3 / N;
	res.verify_clean = (d == 0) && check_set(N, found, exp_none, "full scan, none written");

	/* 4. second round: write every 3rd page, full scan, verify exact set */
	size_t n3 = 0;
	t0 = now_ns();
	for (size_t i = 0; i < N; i += 3, n3++)
		((volatile char *)r.base)[i * PG] = 3;
	t1 = now_ns();
	res.write_third = (t1 - t0) / 1e3 / n3;
	memset(found, 0, N);
	t0 = now_ns();
	d = pm_scan_all(&r, base, end, vec, N + 1, found);
	t1 = now_ns();
	res.full_third_pp = (t1 - t0) / 1e3 / N;
	res.full_third_pd = d ? (t1 - t0) / 1e3 / d : 0;
	res.verify_full_third = (d == (long)n3) && check_set(N, found, exp_third, "full scan, every 3rd written");

	/* 5. 32-page scattered batches, all dirty */
	for (size_t i = 0; i < N; i++)
		((volatile char *)r.base)[i * PG] = 5;
	memset(found, 0, N);
	double us;
	size_t scanned;
	d = batch_scan(&r, N, vec, found, &us, &scanned);
	res.batch_all_pp = us / scanned;
	res.batch_all_pd = d ? us / d : 0;
	/* only even pages were scanned; all were written */
	res.verify_batch_all = (d == (long)scanned) && check_set(N, found, exp_even, "batch scan, all written");

	/* 6. 32-page scattered batches, every 3rd page dirty */
	pm_scan_all(&r, base, end, vec, N + 1, NULL); /* re-protect everything (odd pages still dirty) */
	for (size_t i = 0; i < N; i += 3)
		((volatile char *)r.base)[i * PG] = 6;
	memset(found, 0, N);
	d = batch_scan(&r, N, vec, found, &us, &scanned);
	res.batch_third_pp = us / scanned;
	res.batch_third_pd = d ? us / d : 0;
	/* scanned = even pages < 2*32*nb; expected dirty = multiples of 6 within that */
	{
		size_t lim = 2 * scanned;
		size_t fp = 0, fn = 0;
		for (size_t i = 0; i < N; i++) {
			int exp = (i < lim) && exp_sixth(i);
			if (found[i] && !exp)
				fp++;
			if (!found[i] && exp)
				fn++;
		}
		if (fp || fn)
			fprintf(stderr, "VERIFY FAIL (batch scan, every 3rd): fp=%zu fn=%zu\n", fp, fn);
		res.verify_batch_third = !fp && !fn;
	}

	handler_stop(&h);
	if (h.missing_faults || h.wp_faults || h.errors)
		fprintf(stderr, "optionB: unexpected handler activity: missing=%" PRIu64 " wp=%" PRIu64
			" errors=%" PRIu64 "\n", h.missing_faults, h.wp_faults, h.errors);
	res.ok = res.verify_full_all && res.verify_clean && res.verify_full_third && res.verify_batch_all &&
		 res.verify_batch_third;
	free(src);
	free(found);
	free(vec);
	region_destroy(&r);
	return res;
}

/* ------------------------------ race test ---------------------------------- */
/*
 * K hot pages. Writer thread: for a random page p, read the 8-byte counter at
 * the start of the page; it must equal the last value this thread wrote there
 * (nobody else writes it). Then store last+1. A mismatch means a write vanished.
 *
 * Evictor thread (option B): PAGEMAP_SCAN(p) with WP_MATCHING -> if written,
 * copy page to backing store -> [optional delay] -> MADV_DONTNEED(p). The next
 * touch is a MISSING fault; the handler refills from the backing store with
 * UFFDIO_COPY(MODE_WP).
 *
 * Evictor thread (option A control): lock(p) -> UFFDIO_WRITEPROTECT(p, WP) ->
 * if handler marked p dirty, copy out -> [delay] -> DONTNEED -> unlock(p). The
 * handler takes lock(p) before it un-protects p (deferring while the evictor
 * holds it), so the blocked writer can only proceed after eviction completes.
 * A negative control runs option A without that lock.
 */
struct race {
	int sync; /* 1 = option A protocol, 0 = option B */
	int nolock; /* option A without the eviction lock (shows the lock is required) */
	size_t K;
	uint64_t delay_ns;
	double seconds;
	struct region r;
	struct handler h;
	char *backing;
	uint64_t *last;
	atomic_uchar *lock, *dirty;
	atomic_int stop;
	/* results */
	uint64_t writes, lost_events, lost_increments, evictions, dirty_evictions, final_mismatch;
	uint64_t scan_errors;
};

static void copy_page_words(char *dst, const char *src)
{
	volatile const uint64_t *s = (volatile const uint64_t *)src;
	uint64_t *d = (uint64_t *)dst;
	for (size_t i = 0; i < PG / 8; i++)
		d[i] = s[i];
}

static void *race_writer(void *arg)
{
	struct race *R = arg;
	pin_self(0);
	uint64_t x = 0x9e3779b97f4a7c15ull;
	while (!atomic_load_explicit(&R->stop, memory_order_relaxed)) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		size_t p = x % R->K;
		volatile uint64_t *w = (volatile uint64_t *)(R->r.base + p * PG);
		uint64_t v = *w;
		if (v != R->last[p]) {
			R->lost_events++;
			if (v < R->last[p])
				R->lost_increments += R->last[p] - v;
			R->last[p] = v; /* resync and keep going */
		}
		*w = R->last[p] + 1;
		R->last[p]++;
		R->writes++;
	}
	return NULL;
}

static void *race_evictor(void *arg)
{
	struct race *R = arg;
	pin_self(1);
	struct page_region vec[1];
	uint64_t x = 0x2545f4914f6cdd1dull;
	while (!atomic_load_explicit(&R->stop, memory_order_relaxed)) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		size_t p = x % R->K;
		char *a = R->r.base + p * PG;
		if (!R->sync) {
			long n = pm_scan((uintptr_t)a, (uintptr_t)a + PG, vec, 1, NULL);
			if (n < 0) {
				R->scan_errors++;
				continue;
			}
			if (n > 0) { /* dirty: copy out */
				copy_page_words(R->backing + p * PG, a);
				R->dirty_evictions++;
			}
			/* clean per the scan: backing copy is current -> just drop it */
			spin_ns(R->delay_ns);
			madvise(a, PG, MADV_DONTNEED);
		} else {
			if (!R->nolock)
				spin_lock(&R->lock[p]);
			if (uffd_wp(R->r.uffd, a, PG, 1) < 0 && errno != ENOENT)
				R->scan_errors++;
			if (atomic_exchange(&R->dirty[p], 0)) {
				copy_page_words(R->backing + p * PG, a);
				R->dirty_evictions++;
			}
			spin_ns(R->delay_ns);
			madvise(a, PG, MADV_DONTNEED);
			if (!R->nolock)
				spin_unlock(&R->lock[p]);
		}
		R->evictions++;
	}
	return NULL;
}

static int run_race(struct race *R)
{
	uint64_t feat = R->sync ? UFFD_FEATURE_PAGEFAULT_FLAG_WP : (UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED);
	uint64_t mode = R->sync ? (UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP) : B_regmode;
	if (region_setup(&R->r, R->K, feat, mode) < 0)
		return -1;
	R->backing = aligned_alloc(PG, R->K * PG);
	memset(R->backing, 0, R->K * PG);
	R->last = calloc(R->K, sizeof *R->last);
	R->lock = calloc(R->K, 1);
	R->dirty = calloc(R->K, 1);
	handler_start(&R->h, &R->r, 0, -1);
	R->h.backing = R->backing;
	if (R->sync) {
		R->h.lockproto = !R->nolock;
		R->h.lock = R->lock;
		R->h.dirty = R->dirty;
		R->h.pending = calloc(R->K, 1);
	}
	handler_run(&R->h);
	/* initial population: zeros, write-protected */
	if (uffd_fill(R->r.uffd, R->r.base, R->K, zero_page, UFFDIO_COPY_MODE_WP) < 0)
		DIE("race fill: %s", strerror(errno));

	pthread_t w, ev;
	pthread_create(&w, NULL, race_writer, R);
	pthread_create(&ev, NULL, race_evictor, R);
	uint64_t end = now_ns() + (uint64_t)(R->seconds * 1e9);
	while (now_ns() < end)
		usleep(10000);
	atomic_store(&R->stop, 1);
	pthread_join(w, NULL);
	pthread_join(ev, NULL);
	/* final check: every page must hold the writer's last value (may refill) */
	for (size_t p = 0; p < R->K; p++)
		if (*(volatile uint64_t *)(R->r.base + p * PG) != R->last[p])
			R->final_mismatch++;
	handler_stop(&R->h);
	if (R->h.errors)
		fprintf(stderr, "race(%s) handler errors: %" PRIu64 " first=%s\n", R->sync ? "A" : "B",
			R->h.errors, strerror(R->h.first_errno));
	free(R->h.pending);
	region_destroy(&R->r);
	free(R->backing);
	free(R->last);
	free((void *)R->lock);
	free((void *)R->dirty);
	return 0;
}

/* ------------------------------ main --------------------------------------- */
int main(int argc, char **argv)
{
	size_t N = argc > 1 ? strtoull(argv[1], NULL, 0) : 16384;
	int reps = argc > 2 ? atoi(argv[2]) : 5;
	double race_s = argc > 3 ? atof(argv[3]) : 2.0;
	if (N < 64)
		N = 64;
	if (reps < 1)
		reps = 1;
	if (reps > MAXREP)
		reps = MAXREP;
	PG = sysconf(_SC_PAGESIZE);
	NCPU = sysconf(_SC_NPROCESSORS_ONLN);
	if (NCPU < 1)
		NCPU = 1;
	zero_page = aligned_alloc(PG, PG);
	memset(zero_page, 0, PG);
	pin_self(0);
	setvbuf(stdout, NULL, _IOLBF, 0);

	printf("dirty_tracking: N=%zu pages (%zu MiB), page=%zu, reps=%d, cpus=%d, race=%.1fs/variant\n", N,
	       N * PG >> 20, PG, reps, NCPU, race_s);

	/* feature probe: UFFDIO_API with features=0 reports everything supported */
	uint64_t feats = 0;
	int pfd = uffd_open(0, &feats);
	if (pfd < 0)
		DIE("userfaultfd/UFFDIO_API: %s", strerror(-pfd));
	close(pfd);
	print_features("UFFDIO_API reported features: ", feats);
	if (!(feats & UFFD_FEATURE_WP_ASYNC))
		printf("!! kernel does not report WP_ASYNC: option B will fail\n");

	uint64_t asyncf = 0;
	pfd = uffd_open(UFFD_FEATURE_WP_ASYNC, &asyncf);
	printf("UFFDIO_API(features=WP_ASYNC only): %s\n", pfd < 0 ? strerror(-pfd) : "ok (kernel adds WP_UNPOPULATED itself)");
	if (pfd >= 0)
		close(pfd);

	pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	if (pagemap_fd < 0)
		DIE("open /proc/self/pagemap: %s", strerror(errno));

	/* does async WP accept MISSING|WP? (needed for refill-on-fault) */
	{
		struct region t;
		if (region_setup(&t, 64, UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED,
				 UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP) == 0) {
			printf("async-WP uffd: REGISTER(MISSING|WP) ok, range ioctls=0x%" PRIx64 "\n", t.reg_ioctls);
			region_destroy(&t);
		} else {
			printf("async-WP uffd: REGISTER(MISSING|WP) failed; falling back to MODE_WP only\n");
			B_regmode = UFFDIO_REGISTER_MODE_WP;
		}
	}

	struct metric m_base = {.name = "baseline: plain anon demand-zero first write (no uffd)", .unit = "us/page"};
	struct metric a_fill = {.name = "A  fill: UFFDIO_COPY(MODE_WP), 1 ioctl/page", .unit = "us/page"};
	struct metric a_fw = {.name = "A1 first write, WP fault -> handler (blocking poll)", .unit = "us/page"};
	struct metric a_fwb = {.name = "A2 first write, WP fault -> handler (busy-poll read)", .unit = "us/page"};
	struct metric a_fws = {.name = "A1s first write, handler on SAME cpu as writer (blocking poll)", .unit = "us/page"};
	struct metric a_rp = {.name = "A3 re-protect 32 scattered pages, 1 WRITEPROTECT ioctl/page", .unit = "us/page"};
	struct metric a_rw = {.name = "A3' write after re-protect (fault again, blocking poll)", .unit = "us/page"};
	struct metric a_rr = {.name = "A4 re-protect whole range, 1 WRITEPROTECT ioctl", .unit = "us/page"};
	struct metric b_fill = {.name = "B  fill: UFFDIO_COPY(MODE_WP), 1 ioctl/page", .unit = "us/page"};
	struct metric b_fw = {.name = "B1 first write, async WP (kernel-resolved)", .unit = "us/page"};
	struct metric b_w3 = {.name = "B1' first write after PAGEMAP_SCAN re-protect (every 3rd)", .unit = "us/page"};
	struct metric b_fa_pp = {.name = "B2 scan full range, all dirty: per page scanned", .unit = "us/page"};
	struct metric b_fa_pd = {.name = "B2 scan full range, all dirty: per dirty page found", .unit = "us/dirty"};
	struct metric b_fc_pp = {.name = "B3 scan full range, none dirty: per page scanned", .unit = "us/page"};
	struct metric b_f3_pp = {.name = "B4 scan full range, 1/3 dirty: per page scanned", .unit = "us/page"};
	struct metric b_f3_pd = {.name = "B4 scan full range, 1/3 dirty: per dirty page found", .unit = "us/dirty"};
	struct metric b_ba_pp = {.name = "B5 scan 32 scattered pages, 1 ioctl/page, all dirty: /page", .unit = "us/page"};
	struct metric b_ba_pd = {.name = "B5   ... per dirty page found", .unit = "us/dirty"};
	struct metric b_b3_pp = {.name = "B6 scan 32 scattered pages, 1 ioctl/page, 1/3 dirty: /page", .unit = "us/page"};
	struct metric b_b3_pd = {.name = "B6   ... per dirty page found", .unit = "us/dirty"};
	int a_ok = 1, b_ok = 1;
	uint64_t a_wpf = 0;

	for (int rep = 0; rep < reps; rep++) {
		madd(&m_base, baseline_demand_zero(N));
		struct resA ra = run_optionA(N, 0, 1, 1);
		a_ok &= ra.ok;
		a_wpf = ra.wp_faults;
		madd(&a_fill, ra.fill);
		madd(&a_fw, ra.first_write);
		madd(&a_rp, ra.reprot32);
		madd(&a_rw, ra.rewrite);
		madd(&a_rr, ra.reprot_range);
		struct resA rb = run_optionA(N, 1, 1, 0);
		a_ok &= rb.ok;
		madd(&a_fwb, rb.first_write);
		struct resA rs = run_optionA(N, 0, 0, 0);
		a_ok &= rs.ok;
		madd(&a_fws, rs.first_write);
		struct resB b = run_optionB(N);
		b_ok &= b.ok;
		madd(&b_fill, b.fill);
		madd(&b_fw, b.first_write);
		madd(&b_w3, b.write_third);
		madd(&b_fa_pp, b.full_all_pp);
		madd(&b_fa_pd, b.full_all_pd);
		madd(&b_fc_pp, b.full_clean_pp);
		madd(&b_f3_pp, b.full_third_pp);
		madd(&b_f3_pd, b.full_third_pd);
		madd(&b_ba_pp, b.batch_all_pp);
		madd(&b_ba_pd, b.batch_all_pd);
		madd(&b_b3_pp, b.batch_third_pp);
		madd(&b_b3_pd, b.batch_third_pd);
	}

	printf("\n=== results: median over %d reps [min max] ===\n", reps);
	mprint(&m_base);
	printf(" Option A: synchronous WP (MISSING|WP, handler thread)\n");
	mprint(&a_fill);
	mprint(&a_fw);
	mprint(&a_fwb);
	mprint(&a_fws);
	mprint(&a_rp);
	mprint(&a_rw);
	mprint(&a_rr);
	printf("  A sanity: WP faults seen by handler in last rep = %" PRIu64 " (expect %zu): %s\n", a_wpf, N,
	       a_ok ? "OK" : "FAIL");
	printf(" Option B: async WP (WP_ASYNC) + PAGEMAP_SCAN(WP_MATCHING|CHECK_WPASYNC, WRITTEN)\n");
	mprint(&b_fill);
	mprint(&b_fw);
	mprint(&b_w3);
	mprint(&b_fa_pp);
	mprint(&b_fa_pd);
	mprint(&b_fc_pp);
	mprint(&b_f3_pp);
	mprint(&b_f3_pd);
	mprint(&b_ba_pp);
	mprint(&b_ba_pd);
	mprint(&b_b3_pp);
	mprint(&b_b3_pd);
	printf("  B dirty-set verification (all / none / every-3rd / batch-all / batch-every-3rd): %s\n",
	       b_ok ? "EXACT MATCH in every rep" : "MISMATCH (see stderr)");

	printf("\n=== eviction race test: writer vs evictor, K=64 hot pages, %.1fs each ===\n", race_s);
	printf("  %-34s %10s %10s %10s %8s %10s %8s\n", "variant", "writes", "evictions", "dirty-ev", "refills",
	       "lost-evts", "final");
	struct {
		int sync, nolock;
		uint64_t delay;
		const char *name;
	} variants[] = {
		{0, 0, 0, "B async: scan->copy->DONTNEED"},
		{0, 0, 20000, "B async: + 20us scan..DONTNEED gap"},
		{1, 0, 0, "A sync+lock: WP->copy->DONTNEED"},
		{1, 0, 20000, "A sync+lock: + 20us gap"},
		{1, 1, 20000, "A sync, NO lock (neg. ctrl) + 20us"},
	};
	uint64_t lostB = 0, lostA = 0, lostAnl = 0;
	for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
		struct race R;
		memset(&R, 0, sizeof R);
		R.sync = variants[v].sync;
		R.nolock = variants[v].nolock;
		R.delay_ns = variants[v].delay;
		R.K = 64;
		R.seconds = race_s;
		if (run_race(&R) < 0) {
			printf("  %-34s setup failed\n", variants[v].name);
			continue;
		}
		printf("  %-34s %10" PRIu64 " %10" PRIu64 " %10" PRIu64 " %8" PRIu64 " %10" PRIu64 " %8" PRIu64 "\n",
		       variants[v].name, R.writes, R.evictions, R.dirty_evictions, R.h.missing_faults,
		       R.lost_events, R.final_mismatch);
		if (R.scan_errors)
			printf("    (evictor ioctl errors: %" PRIu64 ")\n", R.scan_errors);
		if (R.sync && R.nolock)
			lostAnl += R.lost_events + R.final_mismatch;
		else if (R.sync)
			lostA += R.lost_events + R.final_mismatch;
		else
			lostB += R.lost_events + R.final_mismatch;
	}
	printf("  RACE RESULT: option B lost writes observed: %s (%" PRIu64 "); option A (locked protocol): %s (%" PRIu64
	       "); option A without lock: %s (%" PRIu64 ")\n",
	       lostB ? "YES" : "no", lostB, lostA ? "YES" : "no", lostA, lostAnl ? "YES" : "no", lostAnl);
	return (a_ok && b_ok) ? 0 : 2;
}
