/* Per-rank JSON output shared by the test programs that record their own bursts. */
#ifndef MPIBURST_TEST_OUTPUT_H
#define MPIBURST_TEST_OUTPUT_H

#include <stdio.h>
#include <unistd.h>

/* Writes DIR/PREFIX.RANK.json: {"rank":R,"pid":PID,"bursts":[[v1,v2,...],...]} from N rows of
 * COLUMNS values each; 0 on success. Call it after MPI_Finalize, so its file I/O does not fall
 * inside a recorded burst. */
static inline int write_bursts(const char *dir, const char *prefix, int rank, const long long *rows, int n, int columns)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%d.json", dir, prefix, rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return 1;
    }
    fprintf(f, "{\"rank\":%d,\"pid\":%ld,\"bursts\":[", rank, (long)getpid());
    for (int j = 0; j < n; j++)
        for (int c = 0; c < columns; c++)
            fprintf(f, "%s%lld%s", c ? "," : j ? ",[" : "[", rows[j * columns + c], c + 1 < columns ? "" : "]");
    fprintf(f, "]}\n");
    return fclose(f) == 0 ? 0 : 1;
}

#endif
