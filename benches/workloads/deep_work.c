/* Benchmark workload: the call tree of tests/fixtures/rec_deep.c, but with a
 * fixed amount of work instead of a fixed run time, so that a profiler's
 * cost shows up as extra CPU time.
 *
 * usage: deep_work [UNITS] [DEPTH]   (default 10000 units, depth 300)
 *
 *   main -> run -> descend x DEPTH -> deep_leaf
 *
 * Each descend frame holds a 96-byte local array, so DEPTH 300 is about
 * 40 KiB of stack between deep_leaf and main, five times perf's default
 * 8 KiB stack copy. deep_leaf does UNITS x 100,000 additions. Built with
 * -O2 -fomit-frame-pointer -g: only DWARF CFI can unwind it.
 */
#include <stdlib.h>

static volatile unsigned long sink;

__attribute__((noinline)) void deep_leaf(long units) {
    for (long u = 0; u < units; u++)
        for (unsigned long i = 0; i < 100000; i++) sink += i;
}

__attribute__((noinline)) void descend(int depth, long units) {
    volatile char pad[96];
    pad[0] = (char)depth;
    if (depth > 0)
        descend(depth - 1, units);
    else
        deep_leaf(units);
    /* Using pad after the call keeps this from being a tail call. */
    sink += pad[0];
}

__attribute__((noinline)) void run(int depth, long units) { descend(depth, units); sink++; }

int main(int argc, char **argv) {
    long units = argc > 1 ? atol(argv[1]) : 10000;
    run(argc > 2 ? atoi(argv[2]) : 300, units);
    return 0;
}
