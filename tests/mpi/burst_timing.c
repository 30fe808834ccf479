/*
 * burst_timing.c - ground truth for burst boundaries and durations.
 *
 * A CPU burst is the time between the return of one MPI call and the entry of
 * the next.  This program makes bursts of known length and records, for each,
 * the CLOCK_MONOTONIC time right after the previous MPI call returned (start)
 * and right before the next MPI call (end).  The kernel's bpf_ktime_get_ns()
 * uses the same clock, so a test can match the profiler's bursts one to one.
 *
 * Usage: burst_timing OUTDIR [ITERATIONS=20] [DURATION_US...=1000 5000 20000]
 * Each iteration makes one burst per duration, each ended by MPI_Barrier.
 * Writes OUTDIR/timing.<rank>.json:
 *   {"rank":R,"pid":PID,"bursts":[[start_ns,duration_ns,cpu_ns,task_clock_ns],...]}
 * cpu_ns is the thread's own CPU time over the same interval (CLOCK_THREAD_CPUTIME_ID): the
 * ground truth for on-CPU time when ranks share cores.
 * task_clock_ns is the thread's own perf task-clock over the same interval: the time it was the
 * running task of a CPU, which is what a per-CPU cpu-clock counter virtualised at every context
 * switch counts. Unlike cpu_ns it includes time the hypervisor stole from the virtual CPU while
 * the thread ran on it (the scheduler leaves stolen time out of a thread's CPU time).
 * The first burst starts when MPI_Init returns.
 */
#define _GNU_SOURCE
#include <linux/perf_event.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "clock.h"
#include "output.h"

/* Opens the perf task-clock of the calling thread; exits if the kernel refuses. Called before
 * MPI_Init: the first perf event of a task can take milliseconds (the kernel turns on its
 * context-switch hooks), which must not fall in a burst. */
static int open_task_clock(void)
{
    struct perf_event_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    attr.type = PERF_TYPE_SOFTWARE;
    attr.config = PERF_COUNT_SW_TASK_CLOCK;
    int fd = (int)syscall(SYS_perf_event_open, &attr, 0 /* this thread */, -1 /* any CPU */, -1, 0);
    if (fd < 0) {
        perror("perf_event_open of this thread's task-clock (run as root)");
        exit(1);
    }
    return fd;
}

static long long task_clock_ns(int fd)
{
    unsigned long long value;
    if (read(fd, &value, sizeof value) != sizeof value) {
        perror("read of this thread's task-clock");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return (long long)value;
}

int main(int argc, char **argv)
{
    int task_clock = open_task_clock();
    MPI_Init(&argc, &argv);
    long long t_start = now_ns(); /* the first burst begins as MPI_Init returns */
    long long cpu_start = thread_cpu_ns();
    long long task_clock_start = task_clock_ns(task_clock);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank); /* not probed: does not end the burst */
    if (argc < 2) {
        if (rank == 0)
            fprintf(stderr, "usage: %s OUTDIR [ITERATIONS] [DURATION_US...]\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int iters = argc > 2 ? atoi(argv[2]) : 20;
    long default_us[] = { 1000, 5000, 20000 };
    long *dur_us = default_us;
    int ndur = 3;
    if (argc > 3) {
        ndur = argc - 3;
        dur_us = malloc(ndur * sizeof *dur_us);
        for (int k = 0; k < ndur; k++)
            dur_us[k] = atol(argv[3 + k]);
    }
    long long (*bursts)[4] = malloc((size_t)iters * ndur * sizeof *bursts);
    int n = 0;

    for (int i = 0; i < iters; i++)
        for (int k = 0; k < ndur; k++) {
            long long t_end;
            do /* busy: the burst must be on-CPU time, not sleep */
                t_end = now_ns();
            while (t_end - t_start < dur_us[k] * 1000LL);
            bursts[n][0] = t_start;
            bursts[n][1] = t_end - t_start;
            bursts[n][2] = thread_cpu_ns() - cpu_start;
            bursts[n][3] = task_clock_ns(task_clock) - task_clock_start;
            n++;
            MPI_Barrier(MPI_COMM_WORLD);
            t_start = now_ns();
            cpu_start = thread_cpu_ns();
            task_clock_start = task_clock_ns(task_clock);
        }

    MPI_Finalize();
    return write_bursts(argv[1], "timing", rank, &bursts[0][0], n, 4);
}
