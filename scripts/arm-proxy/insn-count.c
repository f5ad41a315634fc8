/*
 * insn-count: a qemu TCG plugin counting the guest instructions a run executes.
 *
 * Build (host compiler, shared object):
 *   cc -O2 -shared -fPIC -o insn-count.so scripts/arm-proxy/insn-count.c
 * Use:
 *   qemu-aarch64 -cpu cortex-a53 -plugin ./insn-count.so,out=FILE,top=N BINARY ARGS...
 *
 * At translation each block gets an inline add of its instruction count to one counter (no
 * helper call per block: the count costs a few host instructions). With top=N the counter is
 * the one of the block's symbol (binaries with a symbol table) and the N largest are listed.
 * Output, to FILE (default: qemu's log, stderr): `insns TOTAL`, then `sym COUNT NAME` lines.
 * The counters are not atomic: count single-threaded compute (the engine's --threads 1); idle
 * threads add nothing.
 *
 * No qemu headers are needed: the declarations below are the few entry points of qemu's
 * documented plugin API (docs/devel/tcg-plugins.rst, API version 1, qemu 4.2 .. 8.x) this
 * plugin calls, written out here so the plugin builds without qemu's source tree.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 = 0 };

extern void qemu_plugin_register_vcpu_tb_trans_cb(
    qemu_plugin_id_t id, void (*cb)(qemu_plugin_id_t, struct qemu_plugin_tb *));
extern void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id,
                                           void (*cb)(qemu_plugin_id_t, void *), void *udata);
extern size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
extern struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb,
                                                        size_t idx);
extern const char *qemu_plugin_insn_symbol(const struct qemu_plugin_insn *insn);
extern void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb,
                                                     enum qemu_plugin_op op, void *ptr,
                                                     uint64_t imm);
extern void qemu_plugin_outs(const char *string);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

/* One counter per symbol (slot 0: blocks without a symbol, or all blocks when top=0). */
#define MAX_SYMS 8192
static struct {
    const char *name;
    uint64_t count;
} syms[MAX_SYMS];
static int n_syms = 1;
static int top;
static char out_path[4096];

static uint64_t *counter_for(const char *name) {
    if (!top || !name) return &syms[0].count;
    /* Linear probe over a small open-addressed table keyed by the name pointer's string. */
    uint64_t h = 1469598103934665603ull;
    for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    for (int i = 0; i < MAX_SYMS - 1; i++) {
        int slot = 1 + (int)((h + i) % (MAX_SYMS - 1));
        if (!syms[slot].name) {
            syms[slot].name = strdup(name);
            n_syms++;
            return &syms[slot].count;
        }
        if (strcmp(syms[slot].name, name) == 0) return &syms[slot].count;
    }
    return &syms[0].count;
}

static void on_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    (void)id;
    size_t n = qemu_plugin_tb_n_insns(tb);
    const char *name = NULL;
    if (top && n > 0) name = qemu_plugin_insn_symbol(qemu_plugin_tb_get_insn(tb, 0));
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, counter_for(name),
                                             n);
}

static int by_count(const void *a, const void *b) {
    uint64_t x = ((const typeof(syms[0]) *)a)->count, y = ((const typeof(syms[0]) *)b)->count;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void on_exit_cb(qemu_plugin_id_t id, void *udata) {
    (void)id;
    (void)udata;
    uint64_t total = 0;
    for (int i = 0; i < MAX_SYMS; i++) total += syms[i].count;
    FILE *f = out_path[0] ? fopen(out_path, "w") : NULL;
    char line[512];
    snprintf(line, sizeof line, "insns %llu\n", (unsigned long long)total);
    if (f) fputs(line, f); else qemu_plugin_outs(line);
    if (top) {
        if (!syms[0].name) syms[0].name = "?";
        qsort(syms, MAX_SYMS, sizeof syms[0], by_count);
        for (int i = 0; i < top && i < MAX_SYMS && syms[i].count; i++) {
            snprintf(line, sizeof line, "sym %llu %.400s\n",
                     (unsigned long long)syms[i].count, syms[i].name ? syms[i].name : "?");
            if (f) fputs(line, f); else qemu_plugin_outs(line);
        }
    }
    if (f) fclose(f);
}

__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id,
                                                               const void *info, int argc,
                                                               char **argv) {
    (void)info;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "out=", 4) == 0) {
            snprintf(out_path, sizeof out_path, "%s", argv[i] + 4);
        } else if (strncmp(argv[i], "top=", 4) == 0) {
            top = atoi(argv[i] + 4);
        } else {
            fprintf(stderr, "insn-count: unknown argument %s (out=FILE, top=N)\n", argv[i]);
            return -1;
        }
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_trans);
    qemu_plugin_register_atexit_cb(id, on_exit_cb, NULL);
    return 0;
}
