/*
 * nvmlstub_peer.c: the NVML calls NVIDIA's k8s-device-plugin and gpu-feature-discovery (through go-nvml and
 * go-nvlib) make beyond those our agent makes, so that both run over the stand-in unmodified.
 *
 * Not compiled on its own: build.py compiles one translation unit holding nvmlstub.c, then this file (it
 * uses nvmlstub.c's machine state and helpers: device(), instance(), LOCKED), then a generated definition
 * for every other function nvml.h declares, each calling nvmlstub_unimplemented() below. Every definition
 * here has the prototype NVIDIA declares; the answers follow NVML's documentation for the same machine.
 */

/* ------------------------------------------------------------------------- functions it lacks */

#define MAX_UNIMPLEMENTED 64

static pthread_mutex_t unimplemented_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *unimplemented_seen[MAX_UNIMPLEMENTED];
static int unimplemented_count;

/* A function nvml.h declares and the stand-in does not implement was called: say so once per function on
 * stderr, append its name to the file NVMLSTUB_UNIMPLEMENTED names (a test reads it and fails naming the
 * function), and answer as a driver without that entry point would through a loader: FUNCTION_NOT_FOUND. */
static nvmlReturn_t nvmlstub_unimplemented(const char *name) {
    pthread_mutex_lock(&unimplemented_lock);
    int seen = 0;
    for (int i = 0; i < unimplemented_count && !seen; i++)
        seen = strcmp(unimplemented_seen[i], name) == 0;
    if (!seen) {
        if (unimplemented_count < MAX_UNIMPLEMENTED)
            unimplemented_seen[unimplemented_count++] = name;
        fprintf(stderr, "nvmlstub: %s is not implemented by the stand-in; answering FUNCTION_NOT_FOUND\n", name);
        const char *path = getenv("NVMLSTUB_UNIMPLEMENTED");
        if (path != NULL && path[0] != '\0') {
            int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
            if (fd >= 0) {
                char line[160];
                int n = snprintf(line, sizeof line, "%s\n", name);
                if (n > 0 && write(fd, line, (size_t)n) != n)
                    fprintf(stderr, "nvmlstub: cannot record %s in %s\n", name, path);
                close(fd);
            }
        }
    }
    pthread_mutex_unlock(&unimplemented_lock);
    return NVML_ERROR_FUNCTION_NOT_FOUND;
}

/* ------------------------------------------------------------------------------------- MIG */

static nvmlReturn_t parent_of_mig(nvmlDevice_t mig_device, nvmlDevice_t *out) {
    gpu_t *g;
    int mig;
    nvmlReturn_t rc = device("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", mig_device, &g, &mig);
    if (rc != NVML_SUCCESS)
        return rc;
    if (mig < 0 || out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *out = &gpu_handles[INDEX(g)];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device) {
    LOCKED(parent_of_mig(migDevice, device));
}

static nvmlReturn_t gpu_instance_by_id(nvmlDevice_t d, unsigned int id, nvmlGpuInstance_t *out) {
    gpu_t *g;
    nvmlReturn_t rc = device("nvmlDeviceGetGpuInstanceById", d, &g, NULL);
    if (rc == NVML_SUCCESS)
        rc = mig_capable(g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!g->mig_enabled)
        return NVML_ERROR_NOT_SUPPORTED;
    for (int m = 0; m < g->ninstances; m++) {
        if (g->instances[m].gi_id == id) {
            *out = &gi_handles[INDEX(g)][m];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gpuInstance) {
    LOCKED(gpu_instance_by_id(device, id, gpuInstance));
}

/* Every GPU instance holds one compute instance, id 0, spanning its slices (nvmlstub.c's model). */
static nvmlReturn_t compute_instance_by_id(nvmlGpuInstance_t gi, unsigned int id, nvmlComputeInstance_t *out) {
    gpu_t *g;
    instance_t *inst;
    nvmlReturn_t rc = instance("nvmlGpuInstanceGetComputeInstanceById", gi, &g, &inst);
    if (rc != NVML_SUCCESS)
        return rc;
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (id != 0)
        return NVML_ERROR_NOT_FOUND;
    *out = &ci_handles[gi->gpu][gi->slot];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance, unsigned int id,
                                                   nvmlComputeInstance_t *computeInstance) {
    LOCKED(compute_instance_by_id(gpuInstance, id, computeInstance));
}
