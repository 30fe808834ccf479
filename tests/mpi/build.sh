#!/bin/sh
# Compile every test program with both Open MPI and MPICH into OUTDIR as
# <name>.openmpi and <name>.mpich (NAME.f90 becomes NAME_f90.*; interposer.c
# becomes a shared library of that name).
# Any compiler output counts as a failure: the programs are warning-free, and
# a new warning usually means a changed MPI header or compiler worth a look.
# Exits non-zero if anything failed; prints each binary it built.
set -u
if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
src=$(cd "$(dirname "$0")" && pwd)
out=$1
mkdir -p "$out" || exit 1
status=0

build() { # build COMPILER SOURCE OUTPUT FLAGS...
    cc=$1 file=$2 bin=$3
    shift 3
    if msg=$("$cc" -o "$bin" "$file" "$@" 2>&1) && [ -z "$msg" ]; then
        echo "built $bin"
    else
        echo "FAILED: $cc -o $bin $file $*" >&2
        [ -n "$msg" ] && echo "$msg" >&2
        rm -f "$bin" # never leave a binary that did not build cleanly
        status=1
    fi
}

for mpi in openmpi mpich; do
    for prog in counts burst_timing callsites demo call_loop imbalance imbalance_io phases io pop oncpu sweep workload distributor stencil role_switch halo solver poll_loop shared_slot escape families; do
        build "mpicc.$mpi" "$src/$prog.c" "$out/$prog.$mpi" -O2 -g -Wall
    done
    # Needs the maths library.
    build "mpicc.$mpi" "$src/fft.c" "$out/fft.$mpi" -O2 -g -Wall -lm
    # A shared library to preload, not a program.
    build "mpicc.$mpi" "$src/interposer.c" "$out/interposer.$mpi" -shared -fPIC -O2 -g -Wall
    build "mpicc.$mpi" "$src/interposer.c" "$out/interposer_tail.$mpi" -shared -fPIC -O2 -g -Wall -DTAIL_CALLS
    for prog in counts pop call_loop; do
        build "mpif90.$mpi" "$src/$prog.f90" "$out/${prog}_f90.$mpi" -O2 -g -Wall
    done
done
exit $status
