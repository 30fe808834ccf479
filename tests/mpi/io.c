/*
 * io.c - file writes of a known request size, for the per-job I/O properties.
 *
 * Every rank opens DIR/io.<rank>, then per iteration computes for MS milliseconds
 * and writes one request of SIZE bytes with write(2) (a short write is completed
 * and so counts as more requests, which the program reports), then calls
 * MPI_Barrier. The file is closed and removed at the end. The compute between
 * requests keeps the bandwidth well below what the node can do, so the request
 * size is what the I/O properties judge.
 *
 * Usage: io size=BYTES count=N ms=MS dir=DIR
 * Prints, from rank 0, "requests=<per rank> bytes=<per rank>".
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "clock.h"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    long size = 1 << 20, count = 10;
    double ms = 10;
    const char *dir = "/tmp";
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "size=", 5))
            size = atol(argv[i] + 5);
        else if (!strncmp(argv[i], "count=", 6))
            count = atol(argv[i] + 6);
        else if (!strncmp(argv[i], "ms=", 3))
            ms = atof(argv[i] + 3);
        else if (!strncmp(argv[i], "dir=", 4))
            dir = argv[i] + 4;
        else {
            fprintf(stderr, "io: unknown argument %s (expected size=, count=, ms=, dir=)\n", argv[i]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/io.%d", dir, rank);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    char *buf = malloc(size);
    if (fd < 0 || !buf) {
        perror(path);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(buf, rank + 1, size);
    long requests = 0;
    for (long i = 0; i < count; i++) {
        spin(ms * 1e-3);
        for (long done = 0; done < size; requests++) {
            ssize_t n = write(fd, buf + done, size - done);
            if (n <= 0) {
                perror(path);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            done += n;
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }
    close(fd);
    unlink(path);
    free(buf);
    if (rank == 0)
        printf("requests=%ld bytes=%ld\n", requests, size * count);
    MPI_Finalize();
    return 0;
}
