/* Calibrated, deterministic work shared by the test programs: a fixed amount of arithmetic per
 * millisecond of one core, measured on one rank and shared, so a work item costs the same on-CPU
 * time in every rank even when ranks share cores. static inline: each program uses only some of
 * it, and unused parts must not warn. */
#ifndef MPIBURST_TEST_WORK_H
#define MPIBURST_TEST_WORK_H

#include <time.h>

/* volatile keeps the compiler from folding the arithmetic away. */
static volatile double work_sink;

static inline void work(long units)
{
    double x = 1.0;
    for (long i = 0; i < units; i++)
        x = x * 1.0000001 + 1e-9;
    work_sink = x;
}

/* Work units per millisecond of this thread's CPU time (not wall time, so a busy machine does
 * not inflate it). The caller shares the result so all ranks do identical work. */
static inline double work_units_per_ms(void)
{
    struct timespec a, b;
    long units = 2000000;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    work(units);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    double ms = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) * 1e-6;
    return units / ms;
}

#endif
