/*
 * shared_slot.c - MPI calls from a thread whose slot of thread state another live thread holds.
 *
 * The probes keep a thread's state in slot (tid mod SLOTS) of an array; a thread whose slot a
 * live thread already holds keeps its state in a hash map instead. The main thread makes MPI
 * calls (so it holds its slot), then creates and joins threads that make no MPI call until one
 * gets a tid of the main thread's slot. That thread makes BURSTS bursts of known CPU time
 * between MPI_Barrier calls on MPI_COMM_SELF while the main thread waits for it, still holding
 * the slot; then the main thread makes BURSTS more of its own. MPI_THREAD_SERIALIZED suffices:
 * one thread calls MPI at a time.
 *
 * Usage: shared_slot OUTDIR SLOTS [BURSTS=50]
 * Writes OUTDIR/shared_slot.RANK.json: {"rank","pid","bursts":[[start_ns,cpu_ns,tid],...]}, the
 * bursts of both threads, start_ns from CLOCK_MONOTONIC after the opening call returned. No
 * burst has the other thread's tid when no thread of the main thread's slot came up (the
 * search gives up after 20 rounds of SLOTS threads).
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "clock.h"
#include "output.h"

static long long (*bursts)[3];
static int recorded, per_thread;

/* per_thread bursts of 1 ms of CPU time each, closed by MPI_Barrier on MPI_COMM_SELF. */
static void make_bursts(void)
{
    long long tid = gettid();
    MPI_Barrier(MPI_COMM_SELF);
    for (int i = 0; i < per_thread; i++) {
        long long start = now_ns(), cpu0 = thread_cpu_ns();
        spin_cpu(1e-3);
        bursts[recorded][0] = start;
        bursts[recorded][1] = thread_cpu_ns() - cpu0;
        bursts[recorded][2] = tid;
        recorded++;
        MPI_Barrier(MPI_COMM_SELF);
    }
}

static long slots, main_slot;

/* A thread that makes bursts if its tid falls on the main thread's slot; returns whether. */
static void *candidate(void *found)
{
    if (gettid() % slots == main_slot) {
        make_bursts();
        *(int *)found = 1;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int provided, rank;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (argc < 3 || provided < MPI_THREAD_SERIALIZED) {
        if (rank == 0)
            fprintf(stderr, argc < 3 ? "usage: %s OUTDIR SLOTS [BURSTS]\n"
                                     : "%s: MPI_THREAD_SERIALIZED is not provided\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    slots = atol(argv[2]);
    per_thread = argc > 3 ? atoi(argv[3]) : 50;
    bursts = malloc(2 * (size_t)per_thread * sizeof *bursts);
    main_slot = gettid() % slots;

    MPI_Barrier(MPI_COMM_SELF);
    int found = 0;
    for (long i = 0; i < 20 * slots && !found; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, candidate, &found) != 0 || pthread_join(t, NULL) != 0) {
            perror("pthread");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    make_bursts();

    MPI_Finalize();
    return write_bursts(argv[1], "shared_slot", rank, &bursts[0][0], recorded, 3);
}
