/*
 * families.c - one or more calls of every family of MPI calls that communicate, synchronise or
 * wait, with the program's own count of every call and its own POP account.
 *
 * Families: communicator and topology constructors (after an imbalance: rank 0 computes 200 ms
 * before MPI_Comm_split, so the other ranks wait inside it), neighbourhood and vector
 * collectives, the non-blocking collectives, persistent point-to-point requests, buffered and
 * ready non-blocking sends and a cancelled receive, one-sided windows (fence, passive target with
 * request-based and atomic operations, post-start-complete-wait with MPI_Win_test), MPI-IO
 * (views, non-blocking, shared and ordered file pointers, split collectives) and dynamic
 * processes (connect, accept and disconnect between the two halves of the job). Under an MPI-4
 * library (MPICH 4) also MPI_Isendrecv, persistent collectives and partitioned communication.
 *
 * Every probed MPI call goes through CALL, which counts it under its name and adds its wall time
 * to the rank's MPI time. Calls the profiler does not probe (local ones: MPI_Comm_rank,
 * MPI_Type_size, MPI_Comm_group, MPI_Open_port …) are made directly and counted nowhere. The
 * region of interest runs from MPI_Init's return to MPI_Finalize's entry, as in the POP
 * methodology; a loop of balanced phases with an imbalanced one gives the run a known shape.
 *
 * Usage: families OUTDIR [dynamic=0] (4 to 64 ranks, an even number); dynamic=0 leaves out
 * the dynamic processes, for an MPI whose transport has no ports (MPICH over UCX).
 * Writes OUTDIR/families.RANK.json: {"rank", "pid", "calls": {name: n}, "region_s", "mpi_s",
 * "split_s"} after MPI_Finalize (split_s: the time in MPI_Comm_split).
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "clock.h"

#define MAX_NAMES 160
static const char *names[MAX_NAMES];
static long long counts[MAX_NAMES];
static int nnames;
static double mpi_s;

static void note(const char *name, double seconds)
{
    int i = 0;
    while (i < nnames && strcmp(names[i], name))
        i++;
    if (i == nnames) {
        if (nnames == MAX_NAMES) {
            fprintf(stderr, "families: more than %d functions\n", MAX_NAMES);
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
        names[nnames++] = name;
    }
    counts[i]++;
    mpi_s += seconds;
}

/* A probed call: counted under its name, its wall time added to the MPI time. */
#define CALL(name, ...)                       \
    do {                                      \
        double t0_ = now_s();                 \
        name(__VA_ARGS__);                    \
        note(#name, now_s() - t0_);           \
    } while (0)

static int rank, size;

static void wait_for(MPI_Request *req)
{
    CALL(MPI_Wait, req, MPI_STATUS_IGNORE);
}

static void connect_halves(MPI_Comm half);

static void communicators(double *split_s, int dynamic)
{
    /* The imbalance: the other ranks wait in the split for rank 0. */
    if (rank == 0)
        spin(0.2);
    MPI_Comm half, dup, node, created, grouped, cart, row, graph, dist, inter, merged, idup;
    double t0 = now_s();
    CALL(MPI_Comm_split, MPI_COMM_WORLD, rank % 2, rank, &half);
    *split_s = now_s() - t0;
    CALL(MPI_Comm_dup, MPI_COMM_WORLD, &dup);
    CALL(MPI_Comm_split_type, MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    MPI_Request req;
    CALL(MPI_Comm_idup, MPI_COMM_WORLD, &idup, &req);
    wait_for(&req);

    MPI_Group world_group, even_group;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    int evens[64], n_even = 0;
    for (int r = 0; r < size && n_even < 64; r += 2)
        evens[n_even++] = r;
    MPI_Group_incl(world_group, n_even, evens, &even_group);
    CALL(MPI_Comm_create, MPI_COMM_WORLD, even_group, &created);
    if (rank % 2 == 0)
        CALL(MPI_Comm_create_group, MPI_COMM_WORLD, even_group, 7, &grouped);

    int dims[2] = {2, size / 2}, periods[2] = {1, 1}, keep[2] = {0, 1};
    CALL(MPI_Cart_create, MPI_COMM_WORLD, 2, dims, periods, 0, &cart);
    CALL(MPI_Cart_sub, cart, keep, &row);
    /* A ring as a graph: node i's neighbours are i-1 and i+1. */
    int index[64], edges[128];
    for (int i = 0; i < size && i < 64; i++) {
        index[i] = 2 * (i + 1);
        edges[2 * i] = (i + size - 1) % size;
        edges[2 * i + 1] = (i + 1) % size;
    }
    CALL(MPI_Graph_create, MPI_COMM_WORLD, size, index, edges, 0, &graph);
    /* Real weights rather than MPI_UNWEIGHTED: gcc 12 warns (-Wstringop-overread) about the
     * latter. */
    int sources[2] = {(rank + size - 1) % size, (rank + 1) % size}, weights[2] = {1, 1};
    CALL(MPI_Dist_graph_create_adjacent, MPI_COMM_WORLD, 2, sources, weights, 2, sources, weights,
         MPI_INFO_NULL, 0, &dist);
    /* The two halves meet through their leaders, world ranks 0 and 1. */
    CALL(MPI_Intercomm_create, half, 0, MPI_COMM_WORLD, 1 - rank % 2, 11, &inter);
    CALL(MPI_Intercomm_merge, inter, rank % 2, &merged);

    /* The neighbourhood collectives on the Cartesian grid (4 neighbours) and the ring. */
    int sendbuf[8] = {rank, rank, rank, rank, rank, rank, rank, rank}, recvbuf[8];
    CALL(MPI_Neighbor_allgather, sendbuf, 1, MPI_INT, recvbuf, 1, MPI_INT, cart);
    CALL(MPI_Neighbor_alltoall, sendbuf, 1, MPI_INT, recvbuf, 1, MPI_INT, dist);
    CALL(MPI_Ineighbor_alltoall, sendbuf, 1, MPI_INT, recvbuf, 1, MPI_INT, cart, &req);
    wait_for(&req);
    int ones[2] = {1, 1}, displs[2] = {0, 1};
    CALL(MPI_Neighbor_allgatherv, sendbuf, 1, MPI_INT, recvbuf, ones, displs, MPI_INT, dist);

    CALL(MPI_Comm_free, &merged);
    CALL(MPI_Comm_free, &inter);
    CALL(MPI_Comm_free, &dist);
    CALL(MPI_Comm_free, &graph);
    CALL(MPI_Comm_free, &row);
    CALL(MPI_Comm_free, &cart);
    if (rank % 2 == 0) {
        CALL(MPI_Comm_free, &grouped);
        CALL(MPI_Comm_free, &created);
    }
    CALL(MPI_Comm_free, &idup);
    CALL(MPI_Comm_free, &node);
    CALL(MPI_Comm_free, &dup);
    MPI_Group_free(&even_group);
    MPI_Group_free(&world_group);

    if (dynamic)
        connect_halves(half);
    CALL(MPI_Comm_free, &half);
}

/* Dynamic processes: the odd half connects to a port the even half accepts on. */
static void connect_halves(MPI_Comm half)
{
    char port[MPI_MAX_PORT_NAME] = "";
    MPI_Comm joined;
    if (rank == 0) {
        MPI_Open_port(MPI_INFO_NULL, port);
        CALL(MPI_Send, port, MPI_MAX_PORT_NAME, MPI_CHAR, 1, 12, MPI_COMM_WORLD);
    } else if (rank == 1) {
        CALL(MPI_Recv, port, MPI_MAX_PORT_NAME, MPI_CHAR, 0, 12, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    if (rank % 2 == 0)
        CALL(MPI_Comm_accept, port, MPI_INFO_NULL, 0, half, &joined);
    else
        CALL(MPI_Comm_connect, port, MPI_INFO_NULL, 0, half, &joined);
    CALL(MPI_Comm_disconnect, &joined);
    if (rank == 0)
        MPI_Close_port(port);
}

static void collectives(void)
{
    int n = size;
    int *send = calloc(4 * n, sizeof *send), *recv = calloc(4 * n, sizeof *recv);
    int *counts_ = malloc(n * sizeof *counts_), *displs = malloc(n * sizeof *displs);
    int *bytes_displs = malloc(n * sizeof *bytes_displs);
    MPI_Datatype *types = malloc(n * sizeof *types);
    for (int i = 0; i < n; i++) {
        counts_[i] = 1;
        displs[i] = i;
        bytes_displs[i] = i * (int)sizeof(int);
        types[i] = MPI_INT;
    }
    MPI_Request req;
    CALL(MPI_Alltoallw, send, counts_, bytes_displs, types, recv, counts_, bytes_displs, types, MPI_COMM_WORLD);
    CALL(MPI_Igatherv, send, 1, MPI_INT, recv, counts_, displs, MPI_INT, 0, MPI_COMM_WORLD, &req);
    wait_for(&req);
    CALL(MPI_Iscatterv, send, counts_, displs, MPI_INT, recv, 1, MPI_INT, 0, MPI_COMM_WORLD, &req);
    wait_for(&req);
    CALL(MPI_Iallgatherv, send, 1, MPI_INT, recv, counts_, displs, MPI_INT, MPI_COMM_WORLD, &req);
    wait_for(&req);
    CALL(MPI_Ialltoallv, send, counts_, displs, MPI_INT, recv, counts_, displs, MPI_INT, MPI_COMM_WORLD, &req);
    wait_for(&req);
    CALL(MPI_Ialltoallw, send, counts_, bytes_displs, types, recv, counts_, bytes_displs, types, MPI_COMM_WORLD, &req);
    wait_for(&req);
    CALL(MPI_Ireduce_scatter, send, recv, counts_, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &req);
    wait_for(&req);
    CALL(MPI_Ireduce_scatter_block, send, recv, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &req);
    wait_for(&req);
    CALL(MPI_Iscan, send, recv, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &req);
    wait_for(&req);
    CALL(MPI_Iexscan, send, recv, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &req);
    wait_for(&req);
#if MPI_VERSION >= 4
    /* A persistent collective, started three times. */
    CALL(MPI_Allreduce_init, send, recv, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, MPI_INFO_NULL, &req);
    for (int i = 0; i < 3; i++) {
        CALL(MPI_Start, &req);
        wait_for(&req);
    }
    MPI_Request_free(&req);
#endif
    free(types);
    free(bytes_displs);
    free(displs);
    free(counts_);
    free(recv);
    free(send);
}

static void point_to_point(void)
{
    const int right = (rank + 1) % size, left = (rank + size - 1) % size;
    double out[4] = {rank, rank, rank, rank}, in[4];
    MPI_Request reqs[2];
    MPI_Status statuses[2];
    /* Persistent requests, started one by one and together. */
    CALL(MPI_Send_init, out, 4, MPI_DOUBLE, right, 20, MPI_COMM_WORLD, &reqs[0]);
    CALL(MPI_Recv_init, in, 4, MPI_DOUBLE, left, 20, MPI_COMM_WORLD, &reqs[1]);
    for (int i = 0; i < 3; i++) {
        CALL(MPI_Startall, 2, reqs);
        CALL(MPI_Waitall, 2, reqs, statuses);
    }
    for (int i = 0; i < 2; i++) {
        CALL(MPI_Start, &reqs[1]);
        CALL(MPI_Start, &reqs[0]);
        CALL(MPI_Waitall, 2, reqs, statuses);
    }
    MPI_Request_free(&reqs[0]);
    MPI_Request_free(&reqs[1]);

    /* A buffered non-blocking send: the buffer's detach waits for its delivery. */
    int buffer_size = 4 * sizeof(double) + MPI_BSEND_OVERHEAD;
    void *buffer = malloc(buffer_size);
    MPI_Buffer_attach(buffer, buffer_size);
    CALL(MPI_Irecv, in, 4, MPI_DOUBLE, left, 21, MPI_COMM_WORLD, &reqs[1]);
    CALL(MPI_Ibsend, out, 4, MPI_DOUBLE, right, 21, MPI_COMM_WORLD, &reqs[0]);
    CALL(MPI_Waitall, 2, reqs, statuses);
    CALL(MPI_Buffer_detach, &buffer, &buffer_size);
    free(buffer);

    /* A ready send: its receive is posted before the barrier that precedes it. */
    CALL(MPI_Irecv, in, 4, MPI_DOUBLE, left, 22, MPI_COMM_WORLD, &reqs[1]);
    CALL(MPI_Barrier, MPI_COMM_WORLD);
    CALL(MPI_Irsend, out, 4, MPI_DOUBLE, right, 22, MPI_COMM_WORLD, &reqs[0]);
    CALL(MPI_Waitall, 2, reqs, statuses);

    /* A receive nobody sends to, cancelled. */
    CALL(MPI_Irecv, in, 4, MPI_DOUBLE, left, 23, MPI_COMM_WORLD, &reqs[0]);
    CALL(MPI_Cancel, &reqs[0]);
    wait_for(&reqs[0]);
#if MPI_VERSION >= 4
    CALL(MPI_Isendrecv, out, 4, MPI_DOUBLE, right, 24, in, 4, MPI_DOUBLE, left, 24, MPI_COMM_WORLD, &reqs[0]);
    wait_for(&reqs[0]);
    /* Partitioned communication: two partitions of two doubles. */
    if (rank % 2 == 0) {
        CALL(MPI_Psend_init, out, 2, 2, MPI_DOUBLE, rank + 1, 25, MPI_COMM_WORLD, MPI_INFO_NULL, &reqs[0]);
        CALL(MPI_Start, &reqs[0]);
        CALL(MPI_Pready, 0, reqs[0]);
        CALL(MPI_Pready, 1, reqs[0]);
    } else {
        CALL(MPI_Precv_init, in, 2, 2, MPI_DOUBLE, rank - 1, 25, MPI_COMM_WORLD, MPI_INFO_NULL, &reqs[0]);
        CALL(MPI_Start, &reqs[0]);
    }
    wait_for(&reqs[0]);
    MPI_Request_free(&reqs[0]);
#endif
}

static void one_sided(void)
{
    int right = (rank + 1) % size;
    double *base;
    double local[4] = {0}, result[4], origin[4] = {1, 1, 1, 1};
    MPI_Win created, allocated;
    CALL(MPI_Win_create, local, sizeof local, sizeof(double), MPI_INFO_NULL, MPI_COMM_WORLD, &created);
    CALL(MPI_Win_allocate, 4 * sizeof(double), sizeof(double), MPI_INFO_NULL, MPI_COMM_WORLD, &base, &allocated);

    /* Active target with fences. */
    CALL(MPI_Win_fence, 0, created);
    CALL(MPI_Put, origin, 1, MPI_DOUBLE, right, 0, 1, MPI_DOUBLE, created);
    CALL(MPI_Win_fence, 0, created);

    /* Passive target: request-based and atomic operations. */
    MPI_Request req;
    CALL(MPI_Win_lock_all, 0, allocated);
    CALL(MPI_Rput, origin, 2, MPI_DOUBLE, right, 0, 2, MPI_DOUBLE, allocated, &req);
    wait_for(&req);
    CALL(MPI_Rget, result, 2, MPI_DOUBLE, right, 0, 2, MPI_DOUBLE, allocated, &req);
    wait_for(&req);
    CALL(MPI_Get_accumulate, origin, 1, MPI_DOUBLE, result, 1, MPI_DOUBLE, right, 2, 1, MPI_DOUBLE, MPI_SUM, allocated);
    CALL(MPI_Fetch_and_op, origin, result, MPI_DOUBLE, right, 3, MPI_SUM, allocated);
    CALL(MPI_Win_flush_local, right, allocated);
    /* An integer: compare-and-swap takes no floating-point datatype. */
    long long compare = 0, swap = rank, old;
    CALL(MPI_Compare_and_swap, &swap, &compare, &old, MPI_LONG_LONG, right, 3, allocated);
    CALL(MPI_Win_flush, right, allocated);
    CALL(MPI_Win_unlock_all, allocated);

    /* Generalised active target: each rank exposes its window to its left neighbour, accesses
     * its right one's, and tests for the end of its exposure. */
    MPI_Group world_group, left_group, right_group;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    int left = (rank + size - 1) % size;
    MPI_Group_incl(world_group, 1, &left, &left_group);
    MPI_Group_incl(world_group, 1, &right, &right_group);
    CALL(MPI_Win_post, left_group, 0, created);
    CALL(MPI_Win_start, right_group, 0, created);
    CALL(MPI_Put, origin, 1, MPI_DOUBLE, right, 1, 1, MPI_DOUBLE, created);
    CALL(MPI_Win_complete, created);
    int done = 0;
    while (!done)
        CALL(MPI_Win_test, created, &done);
    MPI_Group_free(&right_group);
    MPI_Group_free(&left_group);
    MPI_Group_free(&world_group);

    CALL(MPI_Win_free, &allocated);
    CALL(MPI_Win_free, &created);
}

static void file_io(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/families.dat", dir);
    MPI_File fh;
    int mine[4] = {rank, rank, rank, rank}, theirs[4];
    MPI_Request req;
    CALL(MPI_File_open, MPI_COMM_WORLD, path, MPI_MODE_CREATE | MPI_MODE_RDWR, MPI_INFO_NULL, &fh);
    CALL(MPI_File_set_size, fh, 0);
    CALL(MPI_File_set_view, fh, 0, MPI_INT, MPI_INT, "native", MPI_INFO_NULL);
    CALL(MPI_File_iwrite_at, fh, 4 * rank, mine, 4, MPI_INT, &req);
    wait_for(&req);
    CALL(MPI_File_write_ordered, fh, mine, 4, MPI_INT, MPI_STATUS_IGNORE);
    CALL(MPI_File_write_shared, fh, mine, 4, MPI_INT, MPI_STATUS_IGNORE);
    CALL(MPI_File_sync, fh);
    CALL(MPI_File_seek_shared, fh, 0, MPI_SEEK_SET);
    CALL(MPI_File_read_ordered, fh, theirs, 4, MPI_INT, MPI_STATUS_IGNORE);
    CALL(MPI_File_read_at_all_begin, fh, 4 * rank, theirs, 4, MPI_INT);
    CALL(MPI_File_read_at_all_end, fh, theirs, MPI_STATUS_IGNORE);
    CALL(MPI_File_iread_at, fh, 4 * rank, theirs, 4, MPI_INT, &req);
    wait_for(&req);
    CALL(MPI_File_close, &fh);
    CALL(MPI_Barrier, MPI_COMM_WORLD);
    if (rank == 0)
        CALL(MPI_File_delete, path, MPI_INFO_NULL);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    double region_start = now_s();
    note("MPI_Init", 0);
    mpi_s = 0; /* MPI_Init is outside the region of interest */
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int dynamic = argc == 3 ? strcmp(argv[2], "dynamic=0") != 0 : 1;
    if (argc < 2 || argc > 3 || size < 4 || size % 2 || size > 64) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np N %s OUTDIR [dynamic=0] (N even, 4 to 64)\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    double split_s = 0;
    communicators(&split_s, dynamic);
    collectives();
    point_to_point();
    one_sided();
    file_io(argv[1]);
    /* Balanced work after the families' calls, so that the run has a useful part: long enough
     * that the few scheduler time slices a loaded machine puts between a clock read and the call
     * it times move the load balance by far less than 0.01 (with 0.6 s of it, a loaded run once
     * moved it by 0.0108). */
    double x = rank;
    for (int i = 0; i < 100; i++) {
        spin(0.015);
        CALL(MPI_Allreduce, MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    }
    double region_s = now_s() - region_start;
    note("MPI_Finalize", 0);
    double region_mpi_s = mpi_s;
    MPI_Finalize();

    char path[4096];
    snprintf(path, sizeof path, "%s/families.%d.json", argv[1], rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return 1;
    }
    fprintf(f, "{\"rank\":%d,\"pid\":%ld,\"region_s\":%.9f,\"mpi_s\":%.9f,\"split_s\":%.9f,\"calls\":{", rank,
            (long)getpid(), region_s, region_mpi_s, split_s);
    for (int i = 0; i < nnames; i++)
        fprintf(f, "%s\"%s\":%lld", i ? "," : "", names[i], counts[i]);
    fprintf(f, "}}\n");
    return fclose(f) == 0 ? 0 : 1;
}
