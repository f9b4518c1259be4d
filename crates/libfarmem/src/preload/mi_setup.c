/* mimalloc configuration for the transparent mode (see mi.rs).
 *
 * mimalloc gets one arena: the far-memory part of the preload's reservation, handed over
 * uncommitted with a commit callback, so that mimalloc asks before it touches any part of it
 * and tells us when it purges. It may not take memory from the OS for blocks: every block it
 * hands to the program is then in far memory. */
#include <stdbool.h>
#include <stddef.h>
#include <mimalloc.h>

void fm_mi_configure(void) {
    mi_option_set(mi_option_disallow_os_alloc, 1);
    mi_option_set(mi_option_reserve_os_memory, 0);
    mi_option_set(mi_option_allow_large_os_pages, 0);
    mi_option_set(mi_option_allow_thp, 0);
    /* Failures become NULL and ENOMEM for the program, as with any malloc. */
    mi_option_set(mi_option_show_errors, 0);
}

/* One more arena (at most 8 GiB: mimalloc's per-arena bookkeeping must fit in 32 MiB). */
int fm_mi_add_arena(void *start, size_t size, mi_commit_fun_t *commit) {
    bool ok = mi_manage_memory(start, size, /*is_committed*/ false, /*is_pinned*/ false,
                               /*is_zero*/ true, /*numa_node*/ -1, /*exclusive*/ false,
                               commit, NULL, NULL);
    return ok ? 0 : -1;
}
