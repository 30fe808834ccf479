/*
 * call_loop.c - micro-benchmark of the cost of one probed MPI call, per class of function.
 *
 * Each function is called so that it does almost nothing, so the time per call is dominated by
 * the call itself plus whatever the probes add.  Running it with and without the profiler (or
 * with empty BPF programs) gives the per-call overhead of each class of probe:
 *
 *   barrier    MPI_Barrier(MPI_COMM_SELF)               collective, no argument read
 *   allreduce  MPI_Allreduce of 1 double on MPI_COMM_SELF  bytes from (count, datatype)
 *   sendrecv   MPI_Sendrecv of 1 double with itself on MPI_COMM_WORLD
 *                                                       bytes, and the peer with its
 *                                                       communicator (argument 10, on the stack)
 *   waitall    MPI_Waitall of 0 requests                completion
 *   test       MPI_Test of a receive that stays pending polling
 *   iprobe     MPI_Iprobe of a message that never comes polling, peer and communicator
 *
 * Usage: call_loop [N=1000000] [FUNCTION=barrier] [PERIOD_NS=0] [LATE=catch-up]
 *   every rank runs its own loop, with itself as the peer.  With PERIOD_NS > 0 the calls are
 *   paced: call i starts at i * PERIOD_NS after the first, the time in between spent computing
 *   (busy), so that the calls, and the bursts between them, come at a steady rate of
 *   10^9 / PERIOD_NS per second whatever a call costs (as long as it costs less than the period).
 *   A rank that was off its CPU makes up the calls it missed at once (LATE=catch-up), or leaves
 *   them out (LATE=skip): then no stretch of time T holds more than T / PERIOD_NS + 2 calls.
 *   The 10,000 warm-up calls before the timed ones are paced the same way.
 * Prints one line to stdout: {"function":"F","calls":N,"ns_per_call":X}
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "clock.h"

/* A tag no message carries: the pending receive and the probe never match. */
#define NEVER_TAG 4242

static double sent = 1.0, received;
static MPI_Request pending;
/* This rank in MPI_COMM_WORLD: the peer of its own point-to-point calls. */
static int me;

static void call_barrier(void) { MPI_Barrier(MPI_COMM_SELF); }

static void call_allreduce(void)
{
    MPI_Allreduce(&sent, &received, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_SELF);
}

static void call_sendrecv(void)
{
    MPI_Sendrecv(&sent, 1, MPI_DOUBLE, me, 0, &received, 1, MPI_DOUBLE, me, 0, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
}

static void call_waitall(void)
{
    /* Real arrays, not MPI_STATUSES_IGNORE: MPICH's header declares their sizes to the compiler. */
    MPI_Request requests[1];
    MPI_Status statuses[1];
    MPI_Waitall(0, requests, statuses);
}

static void call_test(void)
{
    int done;
    MPI_Test(&pending, &done, MPI_STATUS_IGNORE);
}

static void call_iprobe(void)
{
    int found;
    MPI_Iprobe(me, NEVER_TAG + 1, MPI_COMM_WORLD, &found, MPI_STATUS_IGNORE);
}

static const struct {
    const char *name;
    void (*call)(void);
} FUNCTIONS[] = {
    {"barrier", call_barrier}, {"allreduce", call_allreduce}, {"sendrecv", call_sendrecv},
    {"waitall", call_waitall}, {"test", call_test},           {"iprobe", call_iprobe},
};

/* Makes n calls, paced at period_ns if it is > 0 (leaving out the calls it is late for if
 * skip); returns the ns they took. */
static long long calls(void (*call)(void), long n, long long period_ns, int skip)
{
    long long t0 = now_ns();
    if (period_ns == 0) {
        for (long i = 0; i < n; i++)
            call();
    } else {
        long long next = t0;
        for (long i = 0; i < n; i++) {
            call();
            next += period_ns;
            long long t = now_ns();
            if (skip && t > next)
                next += ((t - next) / period_ns + 1) * period_ns;
            while (t < next)
                t = now_ns();
        }
    }
    return now_ns() - t0;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    const char *name = argc > 2 ? argv[2] : "barrier";
    long long period_ns = argc > 3 ? atoll(argv[3]) : 0;
    const char *late = argc > 4 ? argv[4] : "catch-up";
    int skip = strcmp(late, "skip") == 0;
    void (*call)(void) = NULL;
    for (size_t i = 0; i < sizeof FUNCTIONS / sizeof FUNCTIONS[0]; i++)
        if (strcmp(FUNCTIONS[i].name, name) == 0)
            call = FUNCTIONS[i].call;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (call == NULL || n < 0 || period_ns < 0 || (!skip && strcmp(late, "catch-up") != 0)) {
        fprintf(stderr, "usage: call_loop [N >= 0] [barrier|allreduce|sendrecv|waitall|test|iprobe] "
                        "[PERIOD_NS >= 0] [catch-up|skip]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Irecv(&received, 1, MPI_DOUBLE, me, NEVER_TAG, MPI_COMM_WORLD, &pending);

    /* Warm-up: page in the code paths and fill the caches before timing; paced as the timed
     * calls are, so that the rate of calls is steady from the first one. */
    calls(call, 10000, period_ns, skip);
    long long ns = calls(call, n, period_ns, skip);

    /* Complete the pending receive, so that MPI_Finalize finds nothing in flight. */
    MPI_Send(&sent, 1, MPI_DOUBLE, me, NEVER_TAG, MPI_COMM_WORLD);
    MPI_Wait(&pending, MPI_STATUS_IGNORE);
    printf("{\"function\":\"%s\",\"calls\":%ld,\"ns_per_call\":%.2f}\n", name, n,
           (double)ns / (n > 0 ? n : 1));
    MPI_Finalize();
    return 0;
}
