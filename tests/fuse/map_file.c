/* Maps the file named by its argument without touching its pages, prints its pid, and waits to
 * be killed: a process that maps a library on a hung file system, found by the daemon's scan
 * after exec (tests/attach.rs). C, so that the mapping is there within a millisecond of the
 * exec, before the first scan. The open is read-write: a read-only open of a library path the
 * daemon has not handled holds the process, and this one is for the scan. */
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FILE\n", argv[0]);
        return 2;
    }
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) {
        perror(argv[1]);
        return 1;
    }
    if (mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0) == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    printf("%d\n", (int)getpid());
    fflush(stdout);
    for (;;)
        pause();
}
