"""Benchmark workload: a CPU-bound pure-Python program with a fixed amount
of work, run by the system's python3 (a real, large C program not written
here: the interpreter's eval loop, dict and sort code).

usage: python3 cpu_heavy.py [ROUNDS]   (default 30)
"""
import sys


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def shuffle_words(seed, count):
    words = []
    x = seed
    for _ in range(count):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        words.append(format(x, "x"))
    return words


def one_round(seed):
    total = fib(20)
    words = shuffle_words(seed, 5000)
    index = {w: i for i, w in enumerate(words)}
    total += sum(index[w] for w in sorted(words)[:100])
    total += len(" ".join(words).split("a"))
    return total


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    print(sum(one_round(r + 1) for r in range(rounds)))


main()
