/*
 * imbalance_io.c - a known load imbalance plus small-request file I/O, for tests that need every
 * kind of job metric at once (POP efficiencies, phases, kernel CPU, memory and I/O counts).
 *
 * Per iteration rank 1 spins WORK_MS and every other rank a tenth of that (as imbalance.c). Then
 * each rank writes its own file DIR/imbalance_io.<rank> in REQUESTS requests of 4 KiB (open,
 * write, close), reads it back in 4 KiB requests (open, read, close), and all call
 * MPI_Allreduce. The reduction also carries rank 0's decision to stop, so every rank leaves the
 * loop after the same iteration: when SECONDS have passed, or as soon as DIR/stop exists (a test
 * ends the run early by creating it).
 *
 * Usage: imbalance_io DIR [SECONDS=60] [WORK_MS=20] [REQUESTS=16]    (meant for 2 ranks)
 * Prints nothing except errors; removes its files at the end.
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "clock.h"

#define REQUEST 4096

static void fail(const char *what, const char *path)
{
    perror(what);
    fprintf(stderr, "imbalance_io: %s %s failed\n", what, path);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Small requests on purpose: the I/O properties flag them (request size far below 2 MiB). */
static void write_then_read(const char *path, int requests)
{
    static char block[REQUEST];
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        fail("open for writing", path);
    for (int i = 0; i < requests; i++) {
        memset(block, 'a' + i % 26, sizeof block);
        if (write(fd, block, sizeof block) != (ssize_t)sizeof block)
            fail("write", path);
    }
    if (close(fd) != 0)
        fail("close", path);
    fd = open(path, O_RDONLY);
    if (fd < 0)
        fail("open for reading", path);
    for (int i = 0; i < requests; i++)
        if (read(fd, block, sizeof block) != (ssize_t)sizeof block)
            fail("read", path);
    if (close(fd) != 0)
        fail("close", path);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 2 || size < 2) {
        fprintf(stderr, "usage: imbalance_io DIR [SECONDS=60] [WORK_MS=20] [REQUESTS=16], on 2 or more ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *dir = argv[1];
    double seconds = argc > 2 ? atof(argv[2]) : 60.0;
    double work = (argc > 3 ? atof(argv[3]) : 20.0) * 1e-3;
    int requests = argc > 4 ? atoi(argv[4]) : 16;
    if (rank != 1)
        work *= 0.1;
    char path[4096], stop[4096];
    snprintf(path, sizeof path, "%s/imbalance_io.%d", dir, rank);
    snprintf(stop, sizeof stop, "%s/stop", dir);

    double start = now_s();
    for (int done = 0; !done;) {
        spin(work);
        write_then_read(path, requests);
        int local = rank == 0 && (now_s() - start >= seconds || access(stop, F_OK) == 0);
        MPI_Allreduce(&local, &done, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    }
    unlink(path);
    MPI_Finalize();
    return 0;
}
