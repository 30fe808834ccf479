/* Monotonic clock helpers shared by the test programs. static inline: each program uses only
 * some of them, and unused ones must not warn. */
#ifndef MPIBURST_TEST_CLOCK_H
#define MPIBURST_TEST_CLOCK_H

#include <time.h>

static inline long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* CPU time of the calling thread: what the thread actually ran, however loaded the machine. */
static inline long long thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline double now_s(void)
{
    return now_ns() * 1e-9;
}

/* Busy, not sleeping: the bursts must be on-CPU time. */
static inline void spin(double seconds)
{
    double t0 = now_s();
    while (now_s() - t0 < seconds)
        ;
}

/* Busy for this much on-CPU time of the calling thread: the same work however many ranks share
 * a core. */
static inline void spin_cpu(double seconds)
{
    long long t0 = thread_cpu_ns();
    while ((thread_cpu_ns() - t0) * 1e-9 < seconds)
        ;
}

#endif
