/* A child made by fork() (no exec) that fills more memory than the budget, reads it back,
 * and ends with _exit, which runs no exit handler: its statistics must still reach
 * `farmem run`'s report (written by its runtime's control thread).
 *
 * usage: fork_exit MiB     exit status: the child's (0: every word read back right) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    size_t words = (size_t)(argc > 1 ? atoi(argv[1]) : 48) << 17; /* MiB of 8-byte words */
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 2;
    }
    if (pid == 0) {
        uint64_t *a = malloc(words * 8);
        if (!a)
            _exit(3);
        for (size_t i = 0; i < words; i++)
            a[i] = i * 0x9e3779b97f4a7c15ULL;
        for (size_t i = 0; i < words; i++)
            if (a[i] != i * 0x9e3779b97f4a7c15ULL) {
                fprintf(stderr, "fork_exit: word %zu read back wrong\n", i);
                _exit(1);
            }
        _exit(0);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid)
        return 2;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 2;
}
