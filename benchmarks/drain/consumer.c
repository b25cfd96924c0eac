/*
 * The queue consumer of benchmarks/drain.sh: as small as a consumer can be,
 * so that what the benchmark sees per batch is what runs it, not the consumer.
 *
 * Usage: consumer [--loop] QUEUE_DIR BATCH
 *
 * QUEUE_DIR/items holds the number of items left (decimal). A batch takes up
 * to BATCH of them under flock(2), releases the lock, works 1 ms per item,
 * appends "START_NS END_NS TAKEN" (CLOCK_REALTIME) to QUEUE_DIR/batches.log,
 * writes one line to stdout (so that a supervised batch has a journal stream
 * to feed), and exits 75 (EX_TEMPFAIL: the backlog_exit_code the benchmark
 * deploys) when it took a full batch, else 0.
 * --loop runs the same batch function again in the same process while it took
 * a full batch: the long-lived daemon of variant (b). A real daemon would wait
 * for more work; this one returns 0 at the empty queue so that its drain can
 * be timed with `systemctl start --wait`.
 *
 * Built static (gcc -O2 -static) so that its start is one execve with no
 * dynamic loader: drain.sh measures and prints that start cost.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#define BACKLOG 75
#define WORK_NS 1000000LL

static long long now_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/*
 * The work: 1 ms of busy CPU per item, each item ending at its own
 * CLOCK_MONOTONIC deadline, batch start + (i + 1) ms.
 * Busy, not nanosleep(): a sleeping batch leaves its core idle, so the cost of
 * starting the next batch (systemd, journald, the wrapper) would hide in idle
 * time, and every sleep overshoots by the timer slack (50 us by default,
 * 5 % of an item). Deadlines counted from the batch start, not 1 ms measured
 * per item: a batch of n items takes n ms of wall time whatever else runs on
 * the machine (a preempted item is made up by the next), so N items are
 * always N ms and load shows up only in the cost around the batches.
 */
static void work(long items)
{
    long long start = now_ns(CLOCK_MONOTONIC);
    for (long i = 1; i <= items; i++) {
        long long deadline = start + i * WORK_NS;
        while (now_ns(CLOCK_MONOTONIC) < deadline)
            ;
    }
}

static void die(const char *what)
{
    fprintf(stderr, "consumer: %s: %s\n", what, strerror(errno));
    exit(1);
}

/* Takes up to batch items off the queue; the lock is held only for that. */
static long take(int fd, long batch)
{
    char buf[32];
    if (flock(fd, LOCK_EX) != 0)
        die("flock");
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n < 0)
        die("read items");
    buf[n] = '\0';
    long left = strtol(buf, NULL, 10);
    long taken = left < batch ? (left > 0 ? left : 0) : batch;
    n = snprintf(buf, sizeof buf, "%ld\n", left - taken);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, buf, n, 0) != n)
        die("write items");
    flock(fd, LOCK_UN);
    return taken;
}

static long run_batch(int queue, int log, long batch)
{
    long long started = now_ns(CLOCK_REALTIME);
    long taken = take(queue, batch);
    work(taken);
    char line[80];
    int n = snprintf(line, sizeof line, "%lld %lld %ld\n", started, now_ns(CLOCK_REALTIME), taken);
    /* One O_APPEND write: lines of concurrent batches never interleave. */
    if (write(log, line, n) != n)
        die("write batches.log");
    printf("took %ld items\n", taken);
    fflush(stdout);
    return taken;
}

int main(int argc, char **argv)
{
    int loop = argc > 1 && strcmp(argv[1], "--loop") == 0;
    if (argc != 3 + loop) {
        fprintf(stderr, "usage: consumer [--loop] QUEUE_DIR BATCH\n");
        return 2;
    }
    const char *dir = argv[1 + loop];
    long batch = strtol(argv[2 + loop], NULL, 10);
    char path[4096];
    snprintf(path, sizeof path, "%s/items", dir);
    int queue = open(path, O_RDWR | O_CLOEXEC);
    if (queue < 0)
        die(path);
    snprintf(path, sizeof path, "%s/batches.log", dir);
    int log = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (log < 0)
        die(path);
    if (!loop)
        return run_batch(queue, log, batch) == batch ? BACKLOG : 0;
    while (run_batch(queue, log, batch) == batch)
        ;
    return 0;
}
