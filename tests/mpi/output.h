/* Per-rank JSON output shared by the test programs that record their own bursts. */
#ifndef MPIBURST_TEST_OUTPUT_H
#define MPIBURST_TEST_OUTPUT_H

#include <stdio.h>
#include <unistd.h>

/* Writes DIR/PREFIX.RANK.json: {"rank":R,"pid":PID,"bursts":[[a,b],...]}; 0 on success. Call it
 * after MPI_Finalize, so its file I/O does not fall inside a recorded burst. */
static inline int write_bursts(const char *dir, const char *prefix, int rank, long long (*bursts)[2], int n)
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
        fprintf(f, "%s[%lld,%lld]", j ? "," : "", bursts[j][0], bursts[j][1]);
    fprintf(f, "]}\n");
    return fclose(f) == 0 ? 0 : 1;
}

#endif
