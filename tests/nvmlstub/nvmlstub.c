/*
 * nvmlstub.c: a C-level stand-in for libnvidia-ml.so.1, for tests.
 *
 * Built by tests/nvmlstub/build.py with `cc -Wall -Werror` against NVIDIA's nvml.h (the nvidia-nvml-dev
 * wheel): every function below is defined with the prototype NVIDIA declares, so the compiler checks
 * each definition against the header. The unmodified pynvml loads it with CDLL("libnvidia-ml.so.1").
 *
 * The machine comes from the description the simulator exports (agent/nvml/describe.py), read at
 * nvmlInitWithFlags / nvmlInit_v2 from the file named by NVMLSTUB_MACHINE. Faults and scripted errors
 * arrive as lines appended to the file named by NVMLSTUB_CONTROL (optional), read at every call; the
 * exporter translates the simulator's fault-file events into these lines (describe.fault_command).
 *
 * Behaviour follows the simulator's state model (agent/nvml/fake.py): the same error codes where the
 * simulator raises them, the same deterministic values (load from processes, virtual time advancing
 * one second per bulk field read that asks for total energy), and the driver's documented answers
 * where the simulator is silent: GPU_IS_LOST on every nvmlEventSetWait of a set that holds a lost GPU.
 *
 * Build variants (each its own library, loaded in its own process):
 *   -DNVMLSTUB_NO_PROCESSES_V3  no nvmlDeviceGetComputeRunningProcesses_v3 (the _v2 and v1 calls remain)
 *   -DNVMLSTUB_NO_FABRIC_V      no nvmlDeviceGetGpuFabricInfoV (the unversioned v1 call remains)
 *   -DNVMLSTUB_OLD_DRIVER       an older driver: no NVLink5 byte counters (fields 202/204 answer
 *                               NOT_SUPPORTED; 138/139 remain), no nvmlDeviceGetCurrentClocksEventReasons
 *                               (ClocksThrottleReasons remains), platform info v1 only, no
 *                               nvmlDeviceGetTemperatureV (nvmlDeviceGetTemperature remains)
 */
#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <nvml.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_GPUS 16
#define MAX_LINKS 36
#define MAX_PROFILES 8
#define MAX_MIG 7
#define MAX_PROCS 32
#define MAX_SETS 64 /* NVIDIA's plugin makes a set per restart of its plugins and frees the old one only when its 5 s wait ends */
#define MAX_QUEUE 256
#define MAX_RULES 32
#define MIB (1024ULL * 1024ULL)
#define NO_INSTANCE 0xFFFFFFFFu

#define NVLINK5_VERSION 7u /* NVML_NVLINK_VERSION_5_0 */
#define F_MEMORY_TEMP 1u
#define F_REMAPPED_ROWS 2u

typedef struct {
    unsigned nvml_enum, id, slices, placement_size, max_instances, sm_count, ce, dec, enc, jpeg, ofa;
    unsigned long long memory_mib;
    char name[64];
} profile_t;

typedef struct {
    unsigned gi_id, start;
    int profile; /* index into gpu_t.profiles */
    char uuid[96];
} instance_t;

typedef struct {
    unsigned pid, sm_percent;
    unsigned long long used_bytes; /* NVML_VALUE_NOT_AVAILABLE when unknown */
    int gi;                        /* GPU instance id, -1 on the whole GPU */
} proc_t;

typedef struct {
    /* static facts */
    char uuid[96], name[96], serial[32], bus_id[32], cpu_affinity[512];
    unsigned pci_device_id, minor, arch, brand, power_limit_w, idle_power_w, max_sm_clock, mem_clock;
    unsigned nvlink_version, module_id, features;
    int cc_major, cc_minor, numa;
    unsigned long long mem_total_mib, mem_reserved_mib, supported_events;
    int nlinks;
    unsigned link_type[MAX_LINKS];
    char link_bus[MAX_LINKS][32];
    unsigned pcie[MAX_GPUS];
    int has_fabric;
    unsigned char cluster_uuid[16];
    unsigned clique, fabric_state, fabric_status, health_mask, health_summary;
    int has_platform;
    char chassis[17];
    unsigned char slot, tray, host_id, platform_module, peer_type, ib_guid[16], rack_guid[16];
    int nprofiles;
    profile_t profiles[MAX_PROFILES];
    int mig_enabled, mig_pending, ninstances;
    instance_t instances[MAX_MIG];
    /* state */
    int lost, remapped_pending;
    int lost_silently; /* lost without an event: waits do not answer GPU_IS_LOST for it */
    int link_up[MAX_LINKS];
    unsigned long long link_errors[MAX_LINKS];
    unsigned long long ecc_sbe, ecc_dbe, ecc_sbe_aggregate, ecc_dbe_aggregate;
    int nprocs;
    proc_t procs[MAX_PROCS];
    double time_s, energy_j, energy_time_s, nvlink_bytes;
} gpu_t;

#define LOST_MARKER 0ULL /* an event type of 0 in a queue: the GPU fell off the bus here */

typedef struct {
    unsigned long long seq, type, data;
    int gpu;
    unsigned gi, ci;
} event_t;

struct nvmlDevice_st {
    int gpu, mig; /* mig: index into instances, -1 for the GPU itself */
};
struct nvmlGpuInstance_st {
    int gpu, slot;
};
struct nvmlComputeInstance_st {
    int gpu, slot;
};
struct nvmlEventSet_st {
    int used;
    unsigned long long mask[MAX_GPUS];
    event_t queue[MAX_QUEUE];
    int head, count;
};

typedef struct {
    int code, gpu, remaining; /* remaining < 0: forever */
    char call[96];            /* canonical name, "" for every call */
} rule_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int init_count;
static int loaded;
static char driver_version[80], nvml_version[80];
static int cuda_version;
static int ngpus;
static gpu_t gpus[MAX_GPUS];
static struct nvmlDevice_st gpu_handles[MAX_GPUS];
static struct nvmlDevice_st mig_handles[MAX_GPUS][MAX_MIG];
static struct nvmlGpuInstance_st gi_handles[MAX_GPUS][MAX_MIG];
static struct nvmlComputeInstance_st ci_handles[MAX_GPUS][MAX_MIG];
static struct nvmlEventSet_st sets[MAX_SETS];
static unsigned long long event_seq;
static rule_t rules[MAX_RULES];
static int nrules;
static int control_fd = -1;
static char control_buf[8192];
static size_t control_len;

/* --------------------------------------------------------------------------------------- helpers */

static void complain(const char *what, const char *where, int line) {
    fprintf(stderr, "nvmlstub: %s (%s line %d)\n", what, where, line);
}

static void copy_str(char *dst, size_t size, const char *src) {
    snprintf(dst, size, "%s", src);
}

static nvmlReturn_t put_str(char *dst, unsigned int length, const char *src) {
    if (dst == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* "nvmlDeviceGetUUID" / "device_get_uuid" / "nvmlEventSetWait_v2" -> "devicegetuuid" / "eventsetwait" */
static void canonical(const char *name, char *out, size_t size) {
    size_t n = 0;
    const char *p = name;
    const char *end = name + strlen(name);
    if (strncmp(p, "nvml", 4) == 0)
        p += 4;
    const char *v = strrchr(p, '_');
    if (v != NULL && v[1] == 'v' && isdigit((unsigned char)v[2]))
        end = v;
    for (; p < end && n + 1 < size; p++)
        if (*p != '_')
            out[n++] = (char)tolower((unsigned char)*p);
    out[n] = '\0';
}

static int parse_hex_bytes(const char *text, unsigned char *out, size_t size) {
    size_t n = 0;
    memset(out, 0, size);
    if (strncmp(text, "0x", 2) == 0)
        text += 2;
    while (text[0] && text[1] && n < size) {
        if (text[0] == '-') {
            text++;
            continue;
        }
        char byte[3] = {text[0], text[1], 0};
        char *stop;
        out[n++] = (unsigned char)strtoul(byte, &stop, 16);
        if (*stop)
            return -1;
        text += 2;
    }
    return (int)n;
}

/* ------------------------------------------------------------------------- machine description */

static int split(char *line, char **fields, int max) {
    int n = 0;
    char *save = line;
    char *tok;
    while (n < max && (tok = strsep(&save, "\t")) != NULL)
        fields[n++] = tok;
    return n;
}

#define U(i) ((unsigned)strtoul(f[i], NULL, 0))
#define ULL(i) (strtoull(f[i], NULL, 0))
#define I(i) ((int)strtol(f[i], NULL, 0))

static gpu_t *gpu_field(char **f, int n, const char *path, int line) {
    int index = n > 1 ? I(1) : -1;
    if (index < 0 || index >= ngpus) {
        complain("record names an unknown GPU", path, line);
        return NULL;
    }
    return &gpus[index];
}

static int load_machine(const char *path) {
    FILE *fp = fopen(path, "r");
    if (fp == NULL) {
        fprintf(stderr, "nvmlstub: cannot open NVMLSTUB_MACHINE %s: %s\n", path, strerror(errno));
        return -1;
    }
    char line[4096];
    char *f[32];
    int lineno = 0, ok = 0;
    memset(gpus, 0, sizeof gpus);
    ngpus = 0;
    while (fgets(line, sizeof line, fp) != NULL) {
        lineno++;
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '\0' || line[0] == '#')
            continue;
        int n = split(line, f, 32);
        const char *kind = f[0];
        gpu_t *g;
        if (strcmp(kind, "nvmlstub") == 0 && n == 2) {
            ok = I(1) == 1;
        } else if (strcmp(kind, "system") == 0 && n == 4) {
            copy_str(driver_version, sizeof driver_version, f[1]);
            copy_str(nvml_version, sizeof nvml_version, f[2]);
            cuda_version = I(3);
        } else if (strcmp(kind, "gpu") == 0 && n == 25) {
            if (I(1) != ngpus || ngpus >= MAX_GPUS) {
                complain("gpu records must come in index order", path, lineno);
                goto bad;
            }
            g = &gpus[ngpus++];
            copy_str(g->uuid, sizeof g->uuid, f[2]);
            copy_str(g->name, sizeof g->name, f[3]);
            copy_str(g->serial, sizeof g->serial, f[4]);
            copy_str(g->bus_id, sizeof g->bus_id, f[5]);
            g->pci_device_id = U(6);
            g->minor = U(7);
            g->mem_total_mib = ULL(8);
            g->mem_reserved_mib = ULL(9);
            g->cc_major = I(10);
            g->cc_minor = I(11);
            g->arch = U(12);
            g->brand = U(13);
            g->numa = I(14);
            copy_str(g->cpu_affinity, sizeof g->cpu_affinity, f[15]);
            g->power_limit_w = U(16);
            g->idle_power_w = U(17);
            g->max_sm_clock = U(18);
            g->mem_clock = U(19);
            g->nvlink_version = U(20);
            g->module_id = U(21);
            g->features = U(22);
            g->supported_events = ULL(23);
            g->mig_enabled = g->mig_pending = 0;
            (void)f[24]; /* reserved */
        } else if (strcmp(kind, "link") == 0 && n == 5) {
            if ((g = gpu_field(f, n, path, lineno)) == NULL)
                goto bad;
            int link = I(2);
            if (link != g->nlinks || link >= MAX_LINKS) {
                complain("link records must come in link order", path, lineno);
                goto bad;
            }
            g->link_type[link] = U(3);
            copy_str(g->link_bus[link], sizeof g->link_bus[link], f[4]);
            g->link_up[link] = 1;
            g->nlinks++;
        } else if (strcmp(kind, "pcie") == 0 && n == 4) {
            if ((g = gpu_field(f, n, path, lineno)) == NULL)
                goto bad;
            int other = I(2);
            if (other < 0 || other >= MAX_GPUS)
                goto bad;
            g->pcie[other] = U(3);
        } else if (strcmp(kind, "fabric") == 0 && n == 8) {
            if ((g = gpu_field(f, n, path, lineno)) == NULL)
                goto bad;
            g->has_fabric = 1;
            if (parse_hex_bytes(f[2], g->cluster_uuid, 16) != 16) {
                complain("fabric cluster uuid is not 16 bytes", path, lineno);
                goto bad;
            }
            g->clique = U(3);
            g->fabric_state = U(4);
            g->fabric_status = U(5);
            g->health_mask = U(6);
            g->health_summary = U(7);
        } else if (strcmp(kind, "platform") == 0 && n == 10) {
            if ((g = gpu_field(f, n, path, lineno)) == NULL)
                goto bad;
            g->has_platform = 1;
            copy_str(g->chassis, sizeof g->chassis, f[2]);
            g->slot = (unsigned char)U(3);
            g->tray = (unsigned char)U(4);
            g->host_id = (unsigned char)U(5);
            g->platform_module = (unsigned char)U(6);
            g->peer_type = (unsigned char)U(7);
            if (strcmp(f[8], "-") != 0 && parse_hex_bytes(f[8], g->ib_guid, 16) < 0)
                goto bad;
            if (strcmp(f[9], "-") != 0 && parse_hex_bytes(f[9], g->rack_guid, 16) < 0)
                goto bad;
        } else if (strcmp(kind, "migprofile") == 0 && n == 15) {
            if ((g = gpu_field(f, n, path, lineno)) == NULL || g->nprofiles >= MAX_PROFILES)
                goto bad;
            profile_t *p = &g->profiles[g->nprofiles++];
            p->nvml_enum = U(2);
            p->id = U(3);
            copy_str(p->name, sizeof p->name, f[4]);
            p->slices = U(5);
            p->placement_size = U(6);
            p->max_instances = U(7);
            p->memory_mib = ULL(8);
            p->sm_count = U(9);
            p->ce = U(10);
            p->dec = U(11);
            p->enc = U(12);
            p->jpeg = U(13);
            p->ofa = U(14);
        } else if (strcmp(kind, "mig") == 0 && n == 4) {
            if ((g = gpu_field(f, n, path, lineno)) == NULL)
                goto bad;
            g->mig_enabled = I(2);
            g->mig_pending = I(3);
        } else if (strcmp(kind, "gi") == 0 && n == 6) {
            if ((g = gpu_field(f, n, path, lineno)) == NULL || g->ninstances >= MAX_MIG)
                goto bad;
            instance_t *inst = &g->instances[g->ninstances];
            inst->gi_id = U(2);
            inst->profile = -1;
            for (int i = 0; i < g->nprofiles; i++)
                if (g->profiles[i].id == U(3))
                    inst->profile = i;
            if (inst->profile < 0) {
                complain("gi record names a profile id without a migprofile record", path, lineno);
                goto bad;
            }
            inst->start = U(4);
            copy_str(inst->uuid, sizeof inst->uuid, f[5]);
            g->ninstances++;
        } else {
            complain("unknown record or wrong number of fields", path, lineno);
            goto bad;
        }
    }
    fclose(fp);
    if (!ok || ngpus == 0) {
        fprintf(stderr, "nvmlstub: %s is not an nvmlstub 1 description with GPUs\n", path);
        return -1;
    }
    for (int i = 0; i < MAX_GPUS; i++) {
        gpu_handles[i].gpu = i;
        gpu_handles[i].mig = -1;
        for (int m = 0; m < MAX_MIG; m++) {
            mig_handles[i][m].gpu = gi_handles[i][m].gpu = ci_handles[i][m].gpu = i;
            mig_handles[i][m].mig = gi_handles[i][m].slot = ci_handles[i][m].slot = m;
        }
    }
    return 0;
bad:
    fclose(fp);
    return -1;
}

/* ------------------------------------------------------------------------------ the model */

static double now_s(const gpu_t *g) {
    return g->time_s;
}

static int load_of(const gpu_t *g, int index) {
    if (g->nprocs == 0)
        return 0;
    long long t = (long long)now_s(g);
    int base = 0;
    for (int i = 0; i < g->nprocs; i++)
        base += (int)g->procs[i].sm_percent;
    if (base > 100)
        base = 100;
    int value = base - 5 + (int)((t * 7 + index * 3) % 11);
    return value < 0 ? 0 : value > 100 ? 100 : value;
}

static double power_w(const gpu_t *g, int index) {
    return g->idle_power_w + (g->power_limit_w * 0.9 - g->idle_power_w) * load_of(g, index) / 100;
}

static void accumulate(gpu_t *g, int index) {
    double now = now_s(g);
    double dt = now - g->energy_time_s;
    if (dt < 0)
        dt = 0;
    if (dt != 0) {
        g->energy_j += power_w(g, index) * dt;
        int up = 0;
        for (int l = 0; l < g->nlinks; l++)
            up += g->link_up[l];
        g->nvlink_bytes += dt * load_of(g, index) / 100 * 20e9 * (up ? 1 : 0);
        g->energy_time_s = now;
    }
}

static unsigned long long link_bytes(const gpu_t *g, int link) {
    if (!g->link_up[link])
        return 0;
    return (unsigned long long)(g->nvlink_bytes / (g->nlinks > 1 ? g->nlinks : 1));
}

static void push(struct nvmlEventSet_st *set, unsigned long long seq, int gpu, unsigned long long type,
                 unsigned long long data, unsigned gi, unsigned ci) {
    if (set->count >= MAX_QUEUE)
        return;
    event_t *e = &set->queue[(set->head + set->count++) % MAX_QUEUE];
    e->seq = seq;
    e->type = type;
    e->data = data;
    e->gpu = gpu;
    e->gi = gi;
    e->ci = ci;
}

static void enqueue(int gpu, unsigned long long type, unsigned long long data, unsigned gi, unsigned ci) {
    unsigned long long seq = ++event_seq;
    for (int s = 0; s < MAX_SETS; s++)
        if (sets[s].used && (sets[s].mask[gpu] & type))
            push(&sets[s], seq, gpu, type, data, gi, ci);
}

/* The GPU falls off the bus: every set it is registered on gets a marker at this point of its queue. */
static void lose(int gpu) {
    if (gpus[gpu].lost)
        return;
    gpus[gpu].lost = 1;
    for (int s = 0; s < MAX_SETS; s++)
        if (sets[s].used && sets[s].mask[gpu])
            push(&sets[s], ++event_seq, gpu, LOST_MARKER, 0, NO_INSTANCE, NO_INSTANCE);
}

/* The GPU answers again without a reset: volatile ECC counters and a pending remap stay. */
static void recover(int gpu) {
    gpu_t *g = &gpus[gpu];
    if (!g->lost)
        return;
    g->lost = g->lost_silently = 0;
    for (int l = 0; l < g->nlinks; l++)
        g->link_up[l] = 1;
    g->nprocs = 0;
}

/* A GPU reset: answers again (if lost), volatile ECC counters to zero, a pending row remap applied. */
static void reset_gpu(int gpu) {
    gpu_t *g = &gpus[gpu];
    g->lost = g->lost_silently = 0;
    g->ecc_dbe = g->ecc_sbe = 0;
    g->remapped_pending = 0;
    for (int l = 0; l < g->nlinks; l++)
        g->link_up[l] = 1;
    g->nprocs = 0;
}

/* --------------------------------------------------------------------------- control lines */

static void apply_control(char *line) {
    char *f[16];
    int n = split(line, f, 16);
    if (n == 0 || f[0][0] == '\0' || f[0][0] == '#')
        return;
    const char *kind = f[0];
    static const char *const gpu_kinds[] = {"xid",         "lost",      "recover",       "ecc_dbe",
                                            "ecc_sbe",     "fabric",    "nvlink_down",   "nvlink_up",
                                            "process_start", "process_exit", "mig",
                                            "lost_silent", "reset", "ecc_rise"};
    int needs_gpu = 0;
    for (size_t i = 0; i < sizeof gpu_kinds / sizeof gpu_kinds[0]; i++)
        if (strcmp(kind, gpu_kinds[i]) == 0)
            needs_gpu = 1;
    if (!needs_gpu && strcmp(kind, "error") != 0 && strcmp(kind, "clear_errors") != 0) {
        fprintf(stderr, "nvmlstub: ignoring control line %s with %d fields\n", kind, n);
        return;
    }
    int gpu = n > 1 ? I(1) : -1;
    if (needs_gpu && (gpu < 0 || gpu >= ngpus)) {
        fprintf(stderr, "nvmlstub: control line %s names no GPU of this machine\n", kind);
        return;
    }
    gpu_t *g = needs_gpu ? &gpus[gpu] : NULL;
    if (strcmp(kind, "xid") == 0 && n == 4) {
        int gi = I(3);
        enqueue(gpu, nvmlEventTypeXidCriticalError, ULL(2), gi < 0 ? NO_INSTANCE : (unsigned)gi,
                gi < 0 ? NO_INSTANCE : 0);
        if (ULL(2) == 79)
            lose(gpu);
    } else if (strcmp(kind, "lost") == 0 && n == 2) {
        lose(gpu);
    } else if (strcmp(kind, "recover") == 0 && n == 2) {
        recover(gpu);
    } else if (strcmp(kind, "ecc_dbe") == 0 && n == 2) {
        g->ecc_dbe++;
        g->ecc_dbe_aggregate++;
        g->remapped_pending = 1;
        enqueue(gpu, nvmlEventTypeDoubleBitEccError, 0, NO_INSTANCE, NO_INSTANCE);
        enqueue(gpu, nvmlEventTypeXidCriticalError, 48, NO_INSTANCE, NO_INSTANCE);
    } else if (strcmp(kind, "ecc_sbe") == 0 && n == 2) {
        g->ecc_sbe++;
        g->ecc_sbe_aggregate++;
        enqueue(gpu, nvmlEventTypeSingleBitEccError, 0, NO_INSTANCE, NO_INSTANCE);
    } else if (strcmp(kind, "nvlink_down") == 0 && n == 3 && I(2) >= 0 && I(2) < g->nlinks) {
        g->link_up[I(2)] = 0;
        g->link_errors[I(2)]++;
    } else if (strcmp(kind, "nvlink_up") == 0 && n == 3 && I(2) >= 0 && I(2) < g->nlinks) {
        g->link_up[I(2)] = 1;
    } else if (strcmp(kind, "fabric") == 0 && n == 7 && g->has_fabric) {
        /* state status clique health_mask health_summary; "-" keeps the current value */
        unsigned *targets[5] = {&g->fabric_state, &g->fabric_status, &g->clique, &g->health_mask,
                                &g->health_summary};
        for (int i = 0; i < 5; i++)
            if (strcmp(f[2 + i], "-") != 0)
                *targets[i] = U(2 + i);
    } else if (strcmp(kind, "process_start") == 0 && n == 6 && g->nprocs < MAX_PROCS) {
        proc_t *p = &g->procs[g->nprocs++];
        p->pid = U(2);
        p->used_bytes = strcmp(f[3], "-") == 0 ? (unsigned long long)NVML_VALUE_NOT_AVAILABLE : ULL(3);
        p->gi = I(4);
        p->sm_percent = U(5);
    } else if (strcmp(kind, "process_exit") == 0 && n == 3) {
        int k = 0;
        for (int i = 0; i < g->nprocs; i++)
            if (g->procs[i].pid != U(2))
                g->procs[k++] = g->procs[i];
        g->nprocs = k;
    } else if (strcmp(kind, "mig") == 0 && n == 4 && g->nprofiles > 0) {
        /* a whole new MIG layout: gi_id:profile_id:start:mig_uuid,... or "-" */
        instance_t next[MAX_MIG];
        int count = 0;
        char *save = f[3], *item;
        while (strcmp(f[3], "-") != 0 && (item = strsep(&save, ",")) != NULL) {
            instance_t *inst = &next[count];
            unsigned profile_id = 0;
            inst->profile = -1;
            if (count >= MAX_MIG ||
                sscanf(item, "%u:%u:%u:%95s", &inst->gi_id, &profile_id, &inst->start, inst->uuid) != 4) {
                fprintf(stderr, "nvmlstub: control line mig: bad instance %.40s\n", item);
                return;
            }
            for (int i = 0; i < g->nprofiles; i++)
                if (g->profiles[i].id == profile_id)
                    inst->profile = i;
            if (inst->profile < 0) {
                fprintf(stderr, "nvmlstub: control line mig: GPU %d has no MIG profile id %u\n", gpu, profile_id);
                return;
            }
            count++;
        }
        memcpy(g->instances, next, sizeof(instance_t) * (size_t)count);
        g->ninstances = count;
        g->mig_enabled = g->mig_pending = I(2) != 0;
        enqueue(gpu, nvmlEventMigConfigChange, 0, NO_INSTANCE, NO_INSTANCE);
    } else if (strcmp(kind, "lost_silent") == 0 && n == 2) {
        if (!g->lost)
            g->lost = g->lost_silently = 1; /* no marker: waits go on as before */
    } else if (strcmp(kind, "reset") == 0 && n == 2) {
        reset_gpu(gpu);
    } else if (strcmp(kind, "ecc_rise") == 0 && n == 3 && ULL(2) > 0) {
        g->ecc_dbe += ULL(2);
        g->ecc_dbe_aggregate += ULL(2);
    } else if (strcmp(kind, "error") == 0 && n == 5 && nrules < MAX_RULES) {
        rule_t *r = &rules[nrules++];
        r->code = I(1);
        copy_str(r->call, sizeof r->call, strcmp(f[2], "*") == 0 ? "" : f[2]);
        r->gpu = I(3);
        r->remaining = I(4);
    } else if (strcmp(kind, "clear_errors") == 0) {
        nrules = 0;
    } else {
        fprintf(stderr, "nvmlstub: ignoring control line %s with %d fields\n", kind, n);
    }
}

static void poll_control(void) {
    if (control_fd < 0)
        return;
    for (;;) {
        ssize_t got = read(control_fd, control_buf + control_len, sizeof control_buf - 1 - control_len);
        if (got <= 0)
            break;
        control_len += (size_t)got;
        char *start = control_buf;
        char *nl;
        while ((nl = memchr(start, '\n', control_len - (size_t)(start - control_buf))) != NULL) {
            *nl = '\0';
            apply_control(start);
            start = nl + 1;
        }
        control_len -= (size_t)(start - control_buf);
        memmove(control_buf, start, control_len);
        if (control_len == sizeof control_buf - 1)
            control_len = 0; /* a line longer than the buffer: drop it */
    }
}

/* A scripted error for this call (canonical name) on this GPU (-1: no GPU argument), or SUCCESS. */
static nvmlReturn_t injected(const char *func, int gpu) {
    char name[96];
    canonical(func, name, sizeof name);
    for (int i = 0; i < nrules; i++) {
        rule_t *r = &rules[i];
        if ((r->call[0] && strcmp(r->call, name) != 0) || (r->gpu >= 0 && r->gpu != gpu))
            continue;
        int code = r->code;
        if (r->remaining > 0 && --r->remaining == 0) {
            memmove(&rules[i], &rules[i + 1], sizeof(rule_t) * (size_t)(nrules - i - 1));
            nrules--;
        }
        return (nvmlReturn_t)code;
    }
    return NVML_SUCCESS;
}

/* ----------------------------------------------------------------------- entry and handles */

#define LOCKED(body)                                                                                  \
    do {                                                                                              \
        pthread_mutex_lock(&lock);                                                                    \
        nvmlReturn_t rc_ = (body);                                                                    \
        pthread_mutex_unlock(&lock);                                                                  \
        return rc_;                                                                                   \
    } while (0)

/* Common entry of calls without a device: initialised, control lines applied, scripted errors. */
static nvmlReturn_t enter(const char *func) {
    if (init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    poll_control();
    return injected(func, -1);
}

static int is_gpu_handle(nvmlDevice_t d) {
    return d >= &gpu_handles[0] && d < &gpu_handles[MAX_GPUS];
}

static int is_mig_handle(nvmlDevice_t d) {
    return d >= &mig_handles[0][0] && d < &mig_handles[0][0] + MAX_GPUS * MAX_MIG;
}

/* Resolve a device handle (GPU or MIG device): INVALID_ARGUMENT for a foreign pointer, GPU_IS_LOST when
 * the (parent) GPU is lost, NOT_FOUND for a MIG handle whose instance no longer exists. */
static nvmlReturn_t device(const char *func, nvmlDevice_t d, gpu_t **g, int *mig) {
    if (init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    poll_control();
    if (d == NULL || !(is_gpu_handle(d) || is_mig_handle(d)) || d->gpu >= ngpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = injected(func, d->gpu);
    if (rc != NVML_SUCCESS)
        return rc;
    *g = &gpus[d->gpu];
    if (mig != NULL)
        *mig = is_mig_handle(d) ? d->mig : -1;
    else if (is_mig_handle(d))
        return NVML_ERROR_NOT_SUPPORTED; /* a whole-GPU query on a MIG device */
    if ((*g)->lost)
        return NVML_ERROR_GPU_IS_LOST;
    if (is_mig_handle(d) && (!(*g)->mig_enabled || d->mig >= (*g)->ninstances))
        return NVML_ERROR_INVALID_ARGUMENT; /* a dead handle: its instance is gone */
    if ((*g)->lost)
        return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

#define INDEX(g) ((int)((g) - gpus))

static nvmlReturn_t link_of(const gpu_t *g, unsigned int link) {
    if (g->nlinks == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned)g->nlinks)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

static nvmlReturn_t mig_capable(const gpu_t *g) {
    return g->nprofiles > 0 ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

/* ------------------------------------------------------------------------------- lifecycle */

static nvmlReturn_t do_init(void) {
    if (!loaded) {
        const char *path = getenv("NVMLSTUB_MACHINE");
        if (path == NULL || path[0] == '\0') {
            fprintf(stderr, "nvmlstub: NVMLSTUB_MACHINE is not set (the machine description to serve)\n");
            return NVML_ERROR_DRIVER_NOT_LOADED;
        }
        if (load_machine(path) != 0)
            return NVML_ERROR_DRIVER_NOT_LOADED;
        const char *control = getenv("NVMLSTUB_CONTROL");
        if (control != NULL && control[0] != '\0') {
            control_fd = open(control, O_RDONLY | O_CREAT | O_CLOEXEC, 0644);
            if (control_fd < 0) {
                fprintf(stderr, "nvmlstub: cannot open NVMLSTUB_CONTROL %s: %s\n", control, strerror(errno));
                return NVML_ERROR_DRIVER_NOT_LOADED;
            }
        }
        loaded = 1;
    }
    poll_control();
    nvmlReturn_t rc = injected("nvmlInit", -1);
    if (rc != NVML_SUCCESS)
        return rc;
    init_count++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    LOCKED(do_init());
}

nvmlReturn_t nvmlInit_v2(void) {
    LOCKED(do_init());
}

static nvmlReturn_t do_shutdown(void) {
    nvmlReturn_t rc = enter("nvmlShutdown");
    if (rc != NVML_SUCCESS)
        return rc;
    init_count--;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
    LOCKED(do_shutdown());
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

/* ---------------------------------------------------------------------------------- system */

static nvmlReturn_t sys_string(const char *func, char *out, unsigned int length, const char *value) {
    nvmlReturn_t rc = enter(func);
    return rc != NVML_SUCCESS ? rc : put_str(out, length, value);
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    LOCKED(sys_string(__func__, version, length, driver_version));
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    LOCKED(sys_string(__func__, version, length, nvml_version));
}

static nvmlReturn_t sys_cuda(int *out) {
    nvmlReturn_t rc = enter("nvmlSystemGetCudaDriverVersion");
    if (rc == NVML_SUCCESS)
        *out = cuda_version;
    return rc;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    LOCKED(sys_cuda(cudaDriverVersion));
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    LOCKED(sys_cuda(cudaDriverVersion));
}

static nvmlReturn_t get_count(unsigned int *count) {
    nvmlReturn_t rc = enter("nvmlDeviceGetCount");
    if (rc == NVML_SUCCESS)
        *count = (unsigned)ngpus;
    return rc;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    LOCKED(get_count(deviceCount));
}

static nvmlReturn_t by_index(unsigned int index, nvmlDevice_t *out) {
    nvmlReturn_t rc = enter("nvmlDeviceGetHandleByIndex");
    if (rc != NVML_SUCCESS)
        return rc;
    if (index >= (unsigned)ngpus || out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((rc = injected("nvmlDeviceGetHandleByIndex", (int)index)) != NVML_SUCCESS)
        return rc;
    *out = &gpu_handles[index]; /* a lost GPU still has a handle (its queries answer GPU_IS_LOST) */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    LOCKED(by_index(index, device));
}

static nvmlReturn_t by_uuid(const char *uuid, nvmlDevice_t *out) {
    nvmlReturn_t rc = enter("nvmlDeviceGetHandleByUUID");
    if (rc != NVML_SUCCESS)
        return rc;
    if (uuid == NULL || out == NULL || (strncmp(uuid, "GPU-", 4) != 0 && strncmp(uuid, "MIG-", 4) != 0))
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < ngpus; i++) {
        gpu_t *g = &gpus[i];
        nvmlDevice_t found = NULL;
        if (strcmp(g->uuid, uuid) == 0)
            found = &gpu_handles[i];
        for (int m = 0; g->mig_enabled && m < g->ninstances && found == NULL; m++)
            if (strcmp(g->instances[m].uuid, uuid) == 0)
                found = &mig_handles[i][m];
        if (found == NULL)
            continue;
        if (g->lost)
            return NVML_ERROR_GPU_IS_LOST;
        *out = found;
        return NVML_SUCCESS;
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    LOCKED(by_uuid(uuid, device));
}

/* -------------------------------------------------------------------------------- identity */

static nvmlReturn_t get_name(nvmlDevice_t d, char *name, unsigned int length) {
    gpu_t *g;
    int mig;
    nvmlReturn_t rc = device("nvmlDeviceGetName", d, &g, &mig);
    if (rc != NVML_SUCCESS)
        return rc;
    if (mig < 0)
        return put_str(name, length, g->name);
    char text[192];
    snprintf(text, sizeof text, "%s MIG %s", g->name, g->profiles[g->instances[mig].profile].name);
    return put_str(name, length, text);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    LOCKED(get_name(device, name, length));
}

static nvmlReturn_t get_uuid(nvmlDevice_t d, char *uuid, unsigned int length) {
    gpu_t *g;
    int mig;
    nvmlReturn_t rc = device("nvmlDeviceGetUUID", d, &g, &mig);
    if (rc != NVML_SUCCESS)
        return rc;
    return put_str(uuid, length, mig < 0 ? g->uuid : g->instances[mig].uuid);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    LOCKED(get_uuid(device, uuid, length));
}

static nvmlReturn_t get_serial(nvmlDevice_t d, char *serial, unsigned int length) {
    gpu_t *g;
    nvmlReturn_t rc = device("nvmlDeviceGetSerial", d, &g, NULL);
    return rc != NVML_SUCCESS ? rc : put_str(serial, length, g->serial);
}

nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    LOCKED(get_serial(device, serial, length));
}

static void fill_pci(nvmlPciInfo_t *pci, const char *bus_id, unsigned device_id) {
    memset(pci, 0, sizeof *pci);
    copy_str(pci->busId, sizeof pci->busId, bus_id);
    unsigned domain = 0, bus = 0, dev = 0, fn = 0;
    if (sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) == 4) {
        pci->domain = domain;
        pci->bus = bus;
        pci->device = dev;
        snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", domain & 0xFFFF, bus, dev,
                 fn);
    }
    pci->pciDeviceId = device_id;
}

static nvmlReturn_t get_pci(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    gpu_t *g;
    nvmlReturn_t rc = device("nvmlDeviceGetPciInfo", d, &g, NULL);
    if (rc == NVML_SUCCESS)
        fill_pci(pci, g->bus_id, g->pci_device_id);
    return rc;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    LOCKED(get_pci(device, pci));
}

#define SIMPLE_GETTER(fn, type, expr)                                                                 \
    static nvmlReturn_t fn##_impl(nvmlDevice_t d, type *out) {                                        \
        gpu_t *g;                                                                                     \
        nvmlReturn_t rc = device(#fn, d, &g, NULL);                                                   \
        if (rc != NVML_SUCCESS)                                                                       \
            return rc;                                                                                \
        *out = (type)(expr);                                                                          \
        return NVML_SUCCESS;                                                                          \
    }

SIMPLE_GETTER(nvmlDeviceGetMinorNumber, unsigned int, g->minor)
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
    LOCKED(nvmlDeviceGetMinorNumber_impl(device, minorNumber));
}

SIMPLE_GETTER(nvmlDeviceGetArchitecture, nvmlDeviceArchitecture_t, g->arch)
nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t *arch) {
    LOCKED(nvmlDeviceGetArchitecture_impl(device, arch));
}

SIMPLE_GETTER(nvmlDeviceGetBrand, nvmlBrandType_t, g->brand)
nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *type) {
    LOCKED(nvmlDeviceGetBrand_impl(device, type));
}

SIMPLE_GETTER(nvmlDeviceGetNumaNodeId, unsigned int, g->numa)
nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node) {
    LOCKED(nvmlDeviceGetNumaNodeId_impl(device, node));
}

SIMPLE_GETTER(nvmlDeviceGetPersistenceMode, nvmlEnableState_t, NVML_FEATURE_ENABLED)
nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode) {
    LOCKED(nvmlDeviceGetPersistenceMode_impl(device, mode));
}

SIMPLE_GETTER(nvmlDeviceGetComputeMode, nvmlComputeMode_t, NVML_COMPUTEMODE_DEFAULT)
nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode) {
    LOCKED(nvmlDeviceGetComputeMode_impl(device, mode));
}

SIMPLE_GETTER(nvmlDeviceGetPowerManagementLimit, unsigned int, g->power_limit_w * 1000u)
nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit) {
    LOCKED(nvmlDeviceGetPowerManagementLimit_impl(device, limit));
}

static nvmlReturn_t get_cc(nvmlDevice_t d, int *major, int *minor) {
    gpu_t *g;
    nvmlReturn_t rc = device("nvmlDeviceGetCudaComputeCapability", d, &g, NULL);
    if (rc == NVML_SUCCESS) {
        *major = g->cc_major;
        *minor = g->cc_minor;
    }
    return rc;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    LOCKED(get_cc(device, major, minor));
}

static nvmlReturn_t get_affinity(nvmlDevice_t d, unsigned int size, unsigned long *set) {
    gpu_t *g;
    nvmlReturn_t rc = device("nvmlDeviceGetCpuAffinity", d, &g, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (set == NULL || size == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(set, 0, sizeof(unsigned long) * size);
    const unsigned bits = 8 * sizeof(unsigned long);
    const char *p = g->cpu_affinity;
    while (*p) {
        char *end;
        unsigned long a = strtoul(p, &end, 10), b = a;
        if (*end == '-')
            b = strtoul(end + 1, &end, 10);
        for (unsigned long c = a; c <= b; c++)
            if (c / bits < size)
                set[c / bits] |= 1UL << (c % bits);
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p)
            break;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize, unsigned long *cpuSet) {
    LOCKED(get_affinity(device, cpuSetSize, cpuSet));
}

static nvmlReturn_t get_platform(nvmlDevice_t d, nvmlPlatformInfo_t *info) {
    gpu_t *g;
    nvmlReturn_t rc = device("nvmlDeviceGetPlatformInfo", d, &g, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (info == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->has_platform)
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned version = info->version;
#ifdef NVMLSTUB_OLD_DRIVER
    if (version != nvmlPlatformInfo_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
#else
    if (version != nvmlPlatformInfo_v1 && version != nvmlPlatformInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
#endif
    if (version == nvmlPlatformInfo_v1) {
        nvmlPlatformInfo_v1_t *v1 = (nvmlPlatformInfo_v1_t *)info;
        memset(v1, 0, sizeof *v1);
        v1->version = version;
        memcpy(v1->ibGuid, g->ib_guid, sizeof v1->ibGuid);
        memcpy(v1->rackGuid, g->rack_guid, sizeof v1->rackGuid);
        v1->chassisPhysicalSlotNumber = g->slot;
        v1->computeSlotIndex = g->tray;
        v1->nodeIndex = g->host_id;
        v1->peerType = g->peer_type;
        v1->moduleId = g->platform_module;
        return NVML_SUCCESS;
    }
    memset(info, 0, sizeof *info);
    info->version = version;
    memcpy(info->ibGuid, g->ib_guid, sizeof info->ibGuid);
    memcpy(info->chassisSerialNumber, g->chassis, strlen(g->chassis));
    info->slotNumber = g->slot;
    info->trayIndex = g->tray;
    info->hostId = g->host_id;
    info->peerType = g->peer_type;
    info->moduleId = g->platform_module;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPlatformInfo(nvmlDevice_t device, nvmlPlatformInfo_t *platformInfo) {
    LOCKED(get_platform(device, platformInfo));
}

static nvmlReturn_t get_index(nvmlDevice_t d, unsigned int *index) {
    if (init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    poll_control();
    if (d == NULL || !(is_gpu_handle(d) || is_mig_handle(d)) || index == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = injected("nvmlDeviceGetIndex", d->gpu);
    if (rc == NVML_SUCCESS)
        *index = (unsigned)d->gpu; /* answers for a lost GPU too: the index is the driver's, not the GPU's */
    return rc;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    LOCKED(get_index(device, index));
}

/* ------------------------------------------------------------------------------- NVLink, PCIe */

static nvmlReturn_t nvlink(const char *func, nvmlDevice_t d, unsigned int link, gpu_t **g) {
    nvmlReturn_t rc = device(func, d, g, NULL);
    return rc != NVML_SUCCESS ? rc : link_of(*g, link);
}

static nvmlReturn_t link_state(nvmlDevice_t d, unsigned int link, nvmlEnableState_t *active) {
    gpu_t *g;
    nvmlReturn_t rc = nvlink("nvmlDeviceGetNvLinkState", d, link, &g);
    if (rc == NVML_SUCCESS)
        *active = g->link_up[link] ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return rc;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive) {
    LOCKED(link_state(device, link, isActive));
}

static nvmlReturn_t link_version(nvmlDevice_t d, unsigned int link, unsigned int *version) {
    gpu_t *g;
    nvmlReturn_t rc = nvlink("nvmlDeviceGetNvLinkVersion", d, link, &g);
    if (rc == NVML_SUCCESS)
        *version = g->nvlink_version;
    return rc;
}

nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link, unsigned int *version) {
    LOCKED(link_version(device, link, version));
}

static nvmlReturn_t link_remote_pci(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t *pci) {
    gpu_t *g;
    nvmlReturn_t rc = nvlink("nvmlDeviceGetNvLinkRemotePciInfo", d, link, &g);
    if (rc == NVML_SUCCESS)
        fill_pci(pci, g->link_bus[link], 0);
    return rc;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
    LOCKED(link_remote_pci(device, link, pci));
}

static nvmlReturn_t link_remote_type(nvmlDevice_t d, unsigned int link, nvmlIntNvLinkDeviceType_t *type) {
    gpu_t *g;
    nvmlReturn_t rc = nvlink("nvmlDeviceGetNvLinkRemoteDeviceType", d, link, &g);
    if (rc == NVML_SUCCESS)
        *type = (nvmlIntNvLinkDeviceType_t)g->link_type[link];
    return rc;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                 nvmlIntNvLinkDeviceType_t *pNvLinkDeviceType) {
    LOCKED(link_remote_type(device, link, pNvLinkDeviceType));
}

static nvmlReturn_t link_errors(nvmlDevice_t d, unsigned int link, nvmlNvLinkErrorCounter_t counter,
                                unsigned long long *value) {
    gpu_t *g;
    nvmlReturn_t rc = nvlink("nvmlDeviceGetNvLinkErrorCounter", d, link, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if ((unsigned)counter > 4)
        return NVML_ERROR_INVALID_ARGUMENT;
    *value = (counter == 1 || counter == 2) ? g->link_errors[link] : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                             nvmlNvLinkErrorCounter_t counter, unsigned long long *counterValue) {
    LOCKED(link_errors(device, link, counter, counterValue));
}

static nvmlReturn_t common_ancestor(nvmlDevice_t a, nvmlDevice_t b, nvmlGpuTopologyLevel_t *level) {
    gpu_t *ga, *gb;
    nvmlReturn_t rc = device("nvmlDeviceGetTopologyCommonAncestor", a, &ga, NULL);
    if (rc == NVML_SUCCESS)
        rc = device("nvmlDeviceGetTopologyCommonAncestor", b, &gb, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    *level = (nvmlGpuTopologyLevel_t)(ga == gb ? 0 : ga->pcie[INDEX(gb)]);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                 nvmlGpuTopologyLevel_t *pathInfo) {
    LOCKED(common_ancestor(device1, device2, pathInfo));
}

/* ------------------------------------------------------------------------------------- MIG */

static nvmlReturn_t mig_mode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    gpu_t *g;
    nvmlReturn_t rc = device("nvmlDeviceGetMigMode", d, &g, NULL);
    if (rc == NVML_SUCCESS)
        rc = mig_capable(g);
    if (rc == NVML_SUCCESS) {
        *current = (unsigned)g->mig_enabled;
        *pending = (unsigned)g->mig_pending;
    }
    return rc;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    LOCKED(mig_mode(device, currentMode, pendingMode));
}

static nvmlReturn_t max_mig(nvmlDevice_t d, unsigned int *count) {
    gpu_t *g;
    nvmlReturn_t rc = device("nvmlDeviceGetMaxMigDeviceCount", d, &g, NULL);
    if (rc == NVML_SUCCESS)
        rc = mig_capable(g);
    if (rc == NVML_SUCCESS)
        *count = g->mig_enabled ? MAX_MIG : 0; /* nvml.h: zero while MIG is not enabled */
    return rc;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    LOCKED(max_mig(device, count));
}

static const profile_t *profile_by_enum(const gpu_t *g, unsigned int profile, nvmlReturn_t *rc) {
    for (int i = 0; i < g->nprofiles; i++)
        if (g->profiles[i].nvml_enum == profile)
            return &g->profiles[i];
    *rc = profile < NVML_GPU_INSTANCE_PROFILE_COUNT ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
    return NULL;
}

static nvmlReturn_t gi_profile(const char *func, nvmlDevice_t d, unsigned int profile, const profile_t **p) {
    gpu_t *g;
    nvmlReturn_t rc = device(func, d, &g, NULL);
    if (rc == NVML_SUCCESS)
        rc = mig_capable(g);
    if (rc == NVML_SUCCESS)
        *p = profile_by_enum(g, profile, &rc);
    return rc;
}

static nvmlReturn_t gi_profile_v1(nvmlDevice_t d, unsigned int profile, nvmlGpuInstanceProfileInfo_t *info) {
    const profile_t *p = NULL;
    nvmlReturn_t rc = gi_profile("nvmlDeviceGetGpuInstanceProfileInfo", d, profile, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    memset(info, 0, sizeof *info);
    info->id = p->id;
    info->isP2pSupported = 0;
    info->sliceCount = p->slices;
    info->instanceCount = p->max_instances;
    info->multiprocessorCount = p->sm_count;
    info->copyEngineCount = p->ce;
    info->decoderCount = p->dec;
    info->encoderCount = p->enc;
    info->jpegCount = p->jpeg;
    info->ofaCount = p->ofa;
    info->memorySizeMB = p->memory_mib;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                 nvmlGpuInstanceProfileInfo_t *info) {
    LOCKED(gi_profile_v1(device, profile, info));
}

static nvmlReturn_t gi_profile_v2(nvmlDevice_t d, unsigned int profile, nvmlGpuInstanceProfileInfo_v2_t *info) {
    const profile_t *p = NULL;
    if (info == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlGpuInstanceProfileInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlReturn_t rc = gi_profile("nvmlDeviceGetGpuInstanceProfileInfoV", d, profile, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned version = info->version;
    memset(info, 0, sizeof *info);
    info->version = version;
    info->id = p->id;
    info->sliceCount = p->slices;
    info->instanceCount = p->max_instances;
    info->multiprocessorCount = p->sm_count;
    info->copyEngineCount = p->ce;
    info->decoderCount = p->dec;
    info->encoderCount = p->enc;
    info->jpegCount = p->jpeg;
    info->ofaCount = p->ofa;
    info->memorySizeMB = p->memory_mib;
    snprintf(info->name, sizeof info->name, "MIG %s", p->name);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                  nvmlGpuInstanceProfileInfo_v2_t *info) {
    LOCKED(gi_profile_v2(device, profile, info));
}

static nvmlReturn_t gpu_instances(nvmlDevice_t d, unsigned int profile_id, nvmlGpuInstance_t *out,
                                  unsigned int *count) {
    gpu_t *g;
    nvmlReturn_t rc = device("nvmlDeviceGetGpuInstances", d, &g, NULL);
    if (rc == NVML_SUCCESS)
        rc = mig_capable(g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!g->mig_enabled)
        return NVML_ERROR_NOT_SUPPORTED;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0;
    for (int m = 0; m < g->ninstances; m++) {
        if (g->profiles[g->instances[m].profile].id != profile_id)
            continue;
        if (out != NULL)
            out[n] = &gi_handles[INDEX(g)][m];
        n++;
    }
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId, nvmlGpuInstance_t *gpuInstances,
                                       unsigned int *count) {
    LOCKED(gpu_instances(device, profileId, gpuInstances, count));
}

/* Resolve a GPU instance handle: its GPU (not lost, MIG on) and its instance. */
static nvmlReturn_t instance(const char *func, nvmlGpuInstance_t gi, gpu_t **g, instance_t **inst) {
    if (init_count == 0)
        return NVML_ERROR_UNINITIALIZED;
    poll_control();
    if (gi == NULL || gi < &gi_handles[0][0] || gi >= &gi_handles[0][0] + MAX_GPUS * MAX_MIG || gi->gpu >= ngpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = injected(func, gi->gpu);
    if (rc != NVML_SUCCESS)
        return rc;
    *g = &gpus[gi->gpu];
    if ((*g)->lost)
        return NVML_ERROR_GPU_IS_LOST;
    if (!(*g)->mig_enabled || gi->slot >= (*g)->ninstances)
        return NVML_ERROR_INVALID_ARGUMENT;
    *inst = &(*g)->instances[gi->slot];
    return NVML_SUCCESS;
}

static nvmlReturn_t gi_info(nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *info) {
    gpu_t *g;
    instance_t *inst;
    nvmlReturn_t rc = instance("nvmlGpuInstanceGetInfo", gi, &g, &inst);
    if (rc != NVML_SUCCESS)
        return rc;
    memset(info, 0, sizeof *info);
    info->device = &gpu_handles[INDEX(g)];
    info->id = inst->gi_id;
    info->profileId = g->profiles[inst->profile].id;
    info->placement.start = inst->start;
    info->placement.size = g->profiles[inst->profile].placement_size;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info) {
    LOCKED(gi_info(gpuInstance, info));
}

/* Compute-instance profiles by NVML enum: 1, 2, 3, 4, 7, 8, 6 slices (NVML_COMPUTE_INSTANCE_PROFILE_*). */
static const unsigned ci_slices[] = {1, 2, 3, 4, 7, 8, 6};

static unsigned ci_profile_of(unsigned slices) {
    for (unsigned i = 0; i < sizeof ci_slices / sizeof ci_slices[0]; i++)
        if (ci_slices[i] == slices)
            return i;
    return 0;
}

/* The compute-instance profiles of a GPU instance: each holds one full-size compute instance, so only that
 * profile exists (the simulator's model); others answer NOT_SUPPORTED. */
static nvmlReturn_t ci_profile(const char *func, nvmlGpuInstance_t gi, unsigned int profile, unsigned int eng,
                               const profile_t **p) {
    gpu_t *g;
    instance_t *inst;
    nvmlReturn_t rc = instance(func, gi, &g, &inst);
    if (rc != NVML_SUCCESS)
        return rc;
    (void)eng;
    *p = &g->profiles[inst->profile];
    if (profile != ci_profile_of((*p)->slices))
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

static nvmlReturn_t ci_profile_v1(nvmlGpuInstance_t gi, unsigned int profile, unsigned int eng,
                                  nvmlComputeInstanceProfileInfo_t *info) {
    const profile_t *p = NULL;
    nvmlReturn_t rc = ci_profile("nvmlGpuInstanceGetComputeInstanceProfileInfo", gi, profile, eng, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    memset(info, 0, sizeof *info);
    info->id = profile;
    info->sliceCount = p->slices;
    info->instanceCount = 1;
    info->multiprocessorCount = p->sm_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                          unsigned int engProfile,
                                                          nvmlComputeInstanceProfileInfo_t *info) {
    LOCKED(ci_profile_v1(gpuInstance, profile, engProfile, info));
}

static nvmlReturn_t ci_profile_v2(nvmlGpuInstance_t gi, unsigned int profile, unsigned int eng,
                                  nvmlComputeInstanceProfileInfo_v2_t *info) {
    const profile_t *p = NULL;
    if (info == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlComputeInstanceProfileInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlReturn_t rc = ci_profile("nvmlGpuInstanceGetComputeInstanceProfileInfoV", gi, profile, eng, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned version = info->version;
    memset(info, 0, sizeof *info);
    info->version = version;
    info->id = profile;
    info->sliceCount = p->slices;
    info->instanceCount = 1;
    info->multiprocessorCount = p->sm_count;
    snprintf(info->name, sizeof info->name, "MIG %s", p->name);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                           unsigned int engProfile,
                                                           nvmlComputeInstanceProfileInfo_v2_t *info) {
    LOCKED(ci_profile_v2(gpuInstance, profile, engProfile, info));
}

static nvmlReturn_t compute_instances(nvmlGpuInstance_t gi, unsigned int profile_id, nvmlComputeInstance_t *out,
                                      unsigned int *count) {
    gpu_t *g;
    instance_t *inst;
    nvmlReturn_t rc = instance("nvmlGpuInstanceGetComputeInstances", gi, &g, &inst);
    if (rc != NVML_SUCCESS)
        return rc;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* every GPU instance holds one compute instance (id 0) spanning all its slices */
    *count = 0;
    if (profile_id == ci_profile_of(g->profiles[inst->profile].slices)) {
        if (out != NULL)
            out[0] = &ci_handles[INDEX(g)][gi->slot];
        *count = 1;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                nvmlComputeInstance_t *computeInstances, unsigned int *count) {
    LOCKED(compute_instances(gpuInstance, profileId, computeInstances, count));
}

static nvmlReturn_t ci_info(nvmlComputeInstance_t ci, nvmlComputeInstanceInfo_t *info) {
    gpu_t *g;
    instance_t *inst;
    if (ci == NULL || ci < &ci_handles[0][0] || ci >= &ci_handles[0][0] + MAX_GPUS * MAX_MIG)
        return init_count == 0 ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = instance("nvmlComputeInstanceGetInfo", &gi_handles[ci->gpu][ci->slot], &g, &inst);
    if (rc != NVML_SUCCESS)
        return rc;
    const profile_t *p = &g->profiles[inst->profile];
    memset(info, 0, sizeof *info);
    info->device = &gpu_handles[INDEX(g)];
    info->gpuInstance = &gi_handles[ci->gpu][ci->slot];
    info->id = 0;
    info->profileId = ci_profile_of(p->slices);
    info->placement.start = 0;
    info->placement.size = p->slices;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t *info) {
    LOCKED(ci_info(computeInstance, info));
}

static nvmlReturn_t mig_by_index(nvmlDevice_t d, unsigned int index, nvmlDevice_t *out) {
    gpu_t *g;
    nvmlReturn_t rc = device("nvmlDeviceGetMigDeviceHandleByIndex", d, &g, NULL);
    if (rc == NVML_SUCCESS)
        rc = mig_capable(g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!g->mig_enabled)
        return NVML_ERROR_NOT_SUPPORTED;
    if (index >= MAX_MIG)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= (unsigned)g->ninstances)
        return NVML_ERROR_NOT_FOUND;
    *out = &mig_handles[INDEX(g)][index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice) {
    LOCKED(mig_by_index(device, index, migDevice));
}

static nvmlReturn_t is_mig(nvmlDevice_t d, unsigned int *out) {
    gpu_t *g;
    int mig;
    nvmlReturn_t rc = device("nvmlDeviceIsMigDeviceHandle", d, &g, &mig);
    if (rc == NVML_SUCCESS)
        *out = mig >= 0;
    return rc;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    LOCKED(is_mig(device, isMigDevice));
}

static nvmlReturn_t mig_instance_id(const char *func, nvmlDevice_t d, unsigned int *id, int gi) {
    gpu_t *g;
    int mig;
    nvmlReturn_t rc = device(func, d, &g, &mig);
    if (rc != NVML_SUCCESS)
        return rc;
    if (mig < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *id = gi ? g->instances[mig].gi_id : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    LOCKED(mig_instance_id(__func__, device, id, 1));
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    LOCKED(mig_instance_id(__func__, device, id, 0));
}

static nvmlReturn_t attributes(nvmlDevice_t d, nvmlDeviceAttributes_t *attrs) {
    gpu_t *g;
    int mig;
    nvmlReturn_t rc = device("nvmlDeviceGetAttributes", d, &g, &mig);
    if (rc != NVML_SUCCESS)
        return rc;
    memset(attrs, 0, sizeof *attrs);
    if (mig < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    const profile_t *p = &g->profiles[g->instances[mig].profile];
    attrs->multiprocessorCount = p->sm_count;
    attrs->sharedCopyEngineCount = p->ce;
    attrs->sharedDecoderCount = p->dec;
    attrs->sharedEncoderCount = p->enc;
    attrs->sharedJpegCount = p->jpeg;
    attrs->sharedOfaCount = p->ofa;
    attrs->gpuInstanceSliceCount = p->slices;
    attrs->computeInstanceSliceCount = p->slices;
    attrs->memorySizeMB = p->memory_mib;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes_) {
    LOCKED(attributes(device, attributes_));
}

/* ----------------------------------------------------------------------------------- fabric */

static void fabric_common(const gpu_t *g, unsigned char *uuid, nvmlReturn_t *status, unsigned int *clique,
                          nvmlGpuFabricState_t *state) {
    memcpy(uuid, g->cluster_uuid, 16);
    *status = (nvmlReturn_t)g->fabric_status;
    *clique = g->clique;
    *state = (nvmlGpuFabricState_t)g->fabric_state;
}

static nvmlReturn_t fabric_v1(nvmlDevice_t d, nvmlGpuFabricInfo_t *info) {
    gpu_t *g;
    nvmlReturn_t rc = device("nvmlDeviceGetGpuFabricInfo", d, &g, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!g->has_fabric)
        return NVML_ERROR_NOT_SUPPORTED;
    memset(info, 0, sizeof *info);
    fabric_common(g, info->clusterUuid, &info->status, &info->cliqueId, &info->state);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *gpuFabricInfo) {
    LOCKED(fabric_v1(device, gpuFabricInfo));
}

#ifndef NVMLSTUB_NO_FABRIC_V
static nvmlReturn_t fabric_v(nvmlDevice_t d, nvmlGpuFabricInfoV_t *info) {
    gpu_t *g;
    nvmlReturn_t rc = device("nvmlDeviceGetGpuFabricInfoV", d, &g, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned version = info->version;
    if (version != nvmlGpuFabricInfo_v2 && version != nvmlGpuFabricInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (!g->has_fabric)
        return NVML_ERROR_NOT_SUPPORTED;
    if (version == nvmlGpuFabricInfo_v2) {
        nvmlGpuFabricInfo_v2_t *v2 = (nvmlGpuFabricInfo_v2_t *)info;
        memset(v2, 0, sizeof *v2);
        v2->version = version;
        fabric_common(g, v2->clusterUuid, &v2->status, &v2->cliqueId, &v2->state);
        v2->healthMask = g->health_mask;
        return NVML_SUCCESS;
    }
    memset(info, 0, sizeof *info);
    info->version = version;
    fabric_common(g, info->clusterUuid, &info->status, &info->cliqueId, &info->state);
    info->healthMask = g->health_mask;
    info->healthSummary = (unsigned char)g->health_summary;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *gpuFabricInfo) {
    LOCKED(fabric_v(device, gpuFabricInfo));
}
#endif

/* ---------------------------------------------------------------------------------- samples */

static nvmlReturn_t memory_info(nvmlDevice_t d, nvmlMemory_t *memory) {
    gpu_t *g;
    int mig;
    nvmlReturn_t rc = device("nvmlDeviceGetMemoryInfo", d, &g, &mig);
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned long long used = 0, total, reserved = 0;
    for (int i = 0; i < g->nprocs; i++) {
        const proc_t *p = &g->procs[i];
        if (p->used_bytes == (unsigned long long)NVML_VALUE_NOT_AVAILABLE)
            continue;
        if (mig < 0 || p->gi == (int)g->instances[mig].gi_id)
            used += p->used_bytes;
    }
    if (mig < 0) {
        total = g->mem_total_mib * MIB;
        reserved = g->mem_reserved_mib * MIB;
    } else {
        total = g->profiles[g->instances[mig].profile].memory_mib * MIB;
    }
    memory->total = total;
    memory->used = used;
    memory->free = total > reserved + used ? total - reserved - used : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    LOCKED(memory_info(device, memory));
}

static nvmlReturn_t memory_info_v2(nvmlDevice_t d, nvmlMemory_v2_t *memory) {
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlMemory_t v1;
    nvmlReturn_t rc = memory_info(d, &v1);
    if (rc != NVML_SUCCESS)
        return rc;
    gpu_t *g = &gpus[d->gpu];
    memory->total = v1.total;
    memory->used = v1.used;
    memory->free = v1.free;
    memory->reserved = is_gpu_handle(d) ? g->mem_reserved_mib * MIB : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    LOCKED(memory_info_v2(device, memory));
}

static nvmlReturn_t utilization(nvmlDevice_t d, nvmlUtilization_t *util) {
    gpu_t *g;
    nvmlReturn_t rc = device("nvmlDeviceGetUtilizationRates", d, &g, NULL);
    if (rc == NVML_SUCCESS) {
        int load = load_of(g, INDEX(g));
        util->gpu = (unsigned)load;
        util->memory = (unsigned)(load * 2 / 3);
    }
    return rc;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization_) {
    LOCKED(utilization(device, utilization_));
}

static unsigned gpu_temperature(const gpu_t *g) {
    int index = INDEX(g);
    return (unsigned)(31 + index % 4 + load_of(g, index) * 45 / 100);
}

static nvmlReturn_t temperature(nvmlDevice_t d, nvmlTemperatureSensors_t sensor, unsigned int *temp) {
    gpu_t *g;
    nvmlReturn_t rc = device("nvmlDeviceGetTemperature", d, &g, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (sensor != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temp = gpu_temperature(g);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp) {
    LOCKED(temperature(device, sensorType, temp));
}

#ifndef NVMLSTUB_OLD_DRIVER
static nvmlReturn_t temperature_v(nvmlDevice_t d, nvmlTemperature_t *t) {
    gpu_t *g;
    nvmlReturn_t rc = device("nvmlDeviceGetTemperatureV", d, &g, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (t->version != nvmlTemperature_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (t->sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    t->temperature = (int)gpu_temperature(g);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature_) {
    LOCKED(temperature_v(device, temperature_));
}
#endif

static nvmlReturn_t power_usage(nvmlDevice_t d, unsigned int *mw) {
    gpu_t *g;
    nvmlReturn_t rc = device("nvmlDeviceGetPowerUsage", d, &g, NULL);
    if (rc == NVML_SUCCESS)
        *mw = (unsigned)(power_w(g, INDEX(g)) * 1000);
    return rc;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    LOCKED(power_usage(device, power));
}

static unsigned long long energy_mj(gpu_t *g) {
    accumulate(g, INDEX(g));
    return (unsigned long long)(g->energy_j * 1000);
}

static nvmlReturn_t total_energy(nvmlDevice_t d, unsigned long long *mj) {
    gpu_t *g;
    nvmlReturn_t rc = device("nvmlDeviceGetTotalEnergyConsumption", d, &g, NULL);
    if (rc == NVML_SUCCESS)
        *mj = energy_mj(g);
    return rc;
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy) {
    LOCKED(total_energy(device, energy));
}

static nvmlReturn_t clock_info(nvmlDevice_t d, nvmlClockType_t type, unsigned int *mhz) {
    gpu_t *g;
    nvmlReturn_t rc = device("nvmlDeviceGetClockInfo", d, &g, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (type == NVML_CLOCK_MEM)
        *mhz = g->mem_clock;
    else
        *mhz = load_of(g, INDEX(g)) ? g->max_sm_clock : 345;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    LOCKED(clock_info(device, type, clock));
}

static nvmlReturn_t clock_reasons(const char *func, nvmlDevice_t d, unsigned long long *reasons) {
    gpu_t *g;
    nvmlReturn_t rc = device(func, d, &g, NULL);
    if (rc == NVML_SUCCESS)
        *reasons = load_of(g, INDEX(g)) ? 0 : nvmlClocksEventReasonGpuIdle;
    return rc;
}

#ifndef NVMLSTUB_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *clocksEventReasons) {
    LOCKED(clock_reasons(__func__, device, clocksEventReasons));
}
#endif

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                       unsigned long long *clocksThrottleReasons) {
    LOCKED(clock_reasons(__func__, device, clocksThrottleReasons));
}

static void set_uint(nvmlFieldValue_t *v, unsigned value) {
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
    v->value.uiVal = value;
}

static void set_ull(nvmlFieldValue_t *v, unsigned long long value) {
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    v->value.ullVal = value;
}

static nvmlReturn_t one_field(gpu_t *g, nvmlFieldValue_t *v) {
    int index = INDEX(g);
    int load = load_of(g, index);
    switch (v->fieldId) {
    case NVML_FI_DEV_ECC_SBE_VOL_TOTAL: set_ull(v, g->ecc_sbe); break;
    case NVML_FI_DEV_ECC_DBE_VOL_TOTAL: set_ull(v, g->ecc_dbe); break;
    case NVML_FI_DEV_ECC_SBE_AGG_TOTAL: set_ull(v, g->ecc_sbe_aggregate); break;
    case NVML_FI_DEV_ECC_DBE_AGG_TOTAL: set_ull(v, g->ecc_dbe_aggregate); break;
    case NVML_FI_DEV_MEMORY_TEMP:
        if (!(g->features & F_MEMORY_TEMP))
            return NVML_ERROR_NOT_SUPPORTED;
        set_uint(v, (unsigned)(35 + index % 4 + load * 40 / 100));
        break;
    case NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: set_ull(v, energy_mj(g)); break;
    case NVML_FI_DEV_PCIE_REPLAY_COUNTER: set_ull(v, 0); break;
    case NVML_FI_DEV_REMAPPED_COR:
    case NVML_FI_DEV_REMAPPED_UNC:
    case NVML_FI_DEV_REMAPPED_PENDING:
    case NVML_FI_DEV_REMAPPED_FAILURE:
        if (!(g->features & F_REMAPPED_ROWS))
            return NVML_ERROR_NOT_SUPPORTED;
        set_uint(v, v->fieldId == NVML_FI_DEV_REMAPPED_UNC       ? (unsigned)g->ecc_dbe_aggregate
                    : v->fieldId == NVML_FI_DEV_REMAPPED_PENDING ? (unsigned)g->remapped_pending
                                                                 : 0u);
        break;
    case NVML_FI_DEV_POWER_INSTANT: set_uint(v, (unsigned)(power_w(g, index) * 1000)); break;
    case NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES:
    case NVML_FI_DEV_NVLINK_COUNT_RCV_BYTES:
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
    case NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: {
        /* byte counters 202/204 on NVLink 5 parts, link-scoped throughput 138/139 (KiB) on older ones;
           an older driver has no 202/204 at all and answers 138/139 on every part */
        int bytes_field = v->fieldId == NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES ||
                          v->fieldId == NVML_FI_DEV_NVLINK_COUNT_RCV_BYTES;
#ifdef NVMLSTUB_OLD_DRIVER
        if (bytes_field)
            return NVML_ERROR_NOT_SUPPORTED;
#else
        if (bytes_field != (g->nvlink_version == NVLINK5_VERSION))
            return NVML_ERROR_NOT_SUPPORTED;
#endif
        nvmlReturn_t rc = link_of(g, v->scopeId);
        if (rc != NVML_SUCCESS)
            return rc;
        accumulate(g, index);
        unsigned long long bytes = link_bytes(g, (int)v->scopeId);
        set_ull(v, bytes_field ? bytes : bytes / 1024);
        break;
    }
    default: return NVML_ERROR_NOT_SUPPORTED;
    }
    return NVML_SUCCESS;
}

static int is_link_field(unsigned id) {
    return id == NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES || id == NVML_FI_DEV_NVLINK_COUNT_RCV_BYTES ||
           id == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX || id == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX;
}

static nvmlReturn_t field_values(nvmlDevice_t d, int count, nvmlFieldValue_t *values) {
    gpu_t *g;
    nvmlReturn_t rc = device("nvmlDeviceGetFieldValues", d, &g, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (count < 0 || (count > 0 && values == NULL))
        return NVML_ERROR_INVALID_ARGUMENT;
    /* the simulator's clock: one virtual second per bulk read of device-scope fields (one sampling round) */
    for (int i = 0; i < count; i++)
        if (!is_link_field(values[i].fieldId)) {
            g->time_s += 1.0;
            break;
        }
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)(g->time_s * 1e6);
        v->latencyUsec = 0;
        v->nvmlReturn = one_field(g, v);
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values) {
    LOCKED(field_values(device, valuesCount, values));
}

/* Processes of the GPU, or of one MIG device; `kind` is the nvmlProcessInfo version (1, 2 or 3). */
static nvmlReturn_t processes(const char *func, nvmlDevice_t d, unsigned int *count, void *infos, int kind) {
    gpu_t *g;
    int mig;
    nvmlReturn_t rc = device(func, d, &g, &mig);
    if (rc != NVML_SUCCESS)
        return rc;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    const proc_t *selected[MAX_PROCS];
    unsigned n = 0;
    for (int i = 0; i < g->nprocs; i++)
        if (mig < 0 || g->procs[i].gi == (int)g->instances[mig].gi_id)
            selected[n++] = &g->procs[i];
    if (*count < n || (n > 0 && infos == NULL)) {
        *count = n;
        return n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned i = 0; i < n; i++) {
        const proc_t *p = selected[i];
        unsigned gi = p->gi < 0 ? NO_INSTANCE : (unsigned)p->gi;
        unsigned ci = p->gi < 0 ? NO_INSTANCE : 0;
        if (kind == 1) {
            nvmlProcessInfo_v1_t *out = &((nvmlProcessInfo_v1_t *)infos)[i];
            out->pid = p->pid;
            out->usedGpuMemory = p->used_bytes;
        } else {
            nvmlProcessInfo_t *out = &((nvmlProcessInfo_t *)infos)[i];
            out->pid = p->pid;
            out->usedGpuMemory = p->used_bytes;
            out->gpuInstanceId = gi;
            out->computeInstanceId = ci;
        }
    }
    *count = n;
    return NVML_SUCCESS;
}

#ifndef NVMLSTUB_NO_PROCESSES_V3
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos) {
    LOCKED(processes(__func__, device, infoCount, infos, 3));
}
#endif

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v2_t *infos) {
    LOCKED(processes(__func__, device, infoCount, infos, 2));
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos) {
    LOCKED(processes(__func__, device, infoCount, infos, 1));
}

static nvmlReturn_t process_utilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *samples,
                                        unsigned int *count, unsigned long long last_seen) {
    gpu_t *g;
    nvmlReturn_t rc = device("nvmlDeviceGetProcessUtilization", d, &g, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long stamp = (unsigned long long)(g->time_s * 1e6) + 1; /* never 0 (= "all") */
    if (g->nprocs == 0 || stamp <= last_seen)
        return NVML_ERROR_NOT_FOUND; /* no samples since last_seen */
    if (samples == NULL || *count < (unsigned)g->nprocs) {
        *count = (unsigned)g->nprocs;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    int load = load_of(g, INDEX(g));
    unsigned total = 0;
    for (int i = 0; i < g->nprocs; i++)
        total += g->procs[i].sm_percent;
    if (total == 0)
        total = 1;
    for (int i = 0; i < g->nprocs; i++) {
        memset(&samples[i], 0, sizeof samples[i]);
        samples[i].pid = g->procs[i].pid;
        samples[i].timeStamp = stamp;
        samples[i].smUtil = (unsigned)load * g->procs[i].sm_percent / total;
        samples[i].memUtil = (unsigned)(load * 2 / 3) * g->procs[i].sm_percent / total;
    }
    *count = (unsigned)g->nprocs;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization_,
                                             unsigned int *processSamplesCount, unsigned long long lastSeenTimeStamp) {
    LOCKED(process_utilization(device, utilization_, processSamplesCount, lastSeenTimeStamp));
}

/* ----------------------------------------------------------------------------------- events */

static nvmlReturn_t set_create(nvmlEventSet_t *out) {
    nvmlReturn_t rc = enter("nvmlEventSetCreate");
    if (rc != NVML_SUCCESS)
        return rc;
    for (int s = 0; s < MAX_SETS; s++)
        if (!sets[s].used) {
            memset(&sets[s], 0, sizeof sets[s]);
            sets[s].used = 1;
            *out = &sets[s];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_INSUFFICIENT_RESOURCES;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    LOCKED(set_create(set));
}

static int valid_set(nvmlEventSet_t set) {
    return set != NULL && set >= &sets[0] && set < &sets[MAX_SETS] && set->used;
}

static nvmlReturn_t set_free(nvmlEventSet_t set) {
    nvmlReturn_t rc = enter("nvmlEventSetFree");
    if (rc != NVML_SUCCESS)
        return rc;
    if (!valid_set(set))
        return NVML_ERROR_INVALID_ARGUMENT;
    set->used = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    LOCKED(set_free(set));
}

static nvmlReturn_t supported_events(nvmlDevice_t d, unsigned long long *types) {
    gpu_t *g;
    nvmlReturn_t rc = device("nvmlDeviceGetSupportedEventTypes", d, &g, NULL);
    if (rc == NVML_SUCCESS)
        *types = g->supported_events;
    return rc;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes) {
    LOCKED(supported_events(device, eventTypes));
}

static nvmlReturn_t register_events(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    gpu_t *g;
    nvmlReturn_t rc = device("nvmlDeviceRegisterEvents", d, &g, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!valid_set(set))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (types & ~g->supported_events)
        return NVML_ERROR_NOT_SUPPORTED;
    set->mask[INDEX(g)] |= types;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set) {
    LOCKED(register_events(device, eventTypes, set));
}

/* One step of a wait: an event, GPU_IS_LOST (a GPU of the set is lost), or TIMEOUT (nothing yet). */
static nvmlReturn_t wait_step(nvmlEventSet_t set, nvmlEventData_t *data) {
    nvmlReturn_t rc = enter("nvmlEventSetWait");
    if (rc != NVML_SUCCESS)
        return rc;
    if (!valid_set(set) || data == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* as a driver after Xid 79: the wait that reaches a GPU's loss answers GPU_IS_LOST, events queued
       after it are still delivered, then every wait answers GPU_IS_LOST at once while a GPU registered
       on the set stays lost, until it answers again or the set is freed (markers of recovered GPUs
       are dropped) */
    while (set->count > 0 && set->queue[set->head].type == LOST_MARKER && !gpus[set->queue[set->head].gpu].lost) {
        set->head = (set->head + 1) % MAX_QUEUE;
        set->count--;
    }
    if (set->count > 0) {
        event_t *e = &set->queue[set->head];
        set->head = (set->head + 1) % MAX_QUEUE;
        set->count--;
        if (e->type == LOST_MARKER)
            return NVML_ERROR_GPU_IS_LOST;
        memset(data, 0, sizeof *data);
        data->device = &gpu_handles[e->gpu];
        data->eventType = e->type;
        data->eventData = e->data;
        data->gpuInstanceId = e->gi;
        data->computeInstanceId = e->ci;
        return NVML_SUCCESS;
    }
    for (int i = 0; i < ngpus; i++)
        if (set->mask[i] && gpus[i].lost && !gpus[i].lost_silently)
            return NVML_ERROR_GPU_IS_LOST;
    return NVML_ERROR_TIMEOUT;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        pthread_mutex_lock(&lock);
        nvmlReturn_t rc = wait_step(set, data);
        pthread_mutex_unlock(&lock);
        if (rc != NVML_ERROR_TIMEOUT)
            return rc;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long waited = (now.tv_sec - start.tv_sec) * 1000LL + (now.tv_nsec - start.tv_nsec) / 1000000;
        if (waited >= (long long)timeoutms)
            return NVML_ERROR_TIMEOUT;
        struct timespec step = {0, 2 * 1000 * 1000};
        nanosleep(&step, NULL);
    }
}
