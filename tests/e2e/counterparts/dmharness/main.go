// Command dmharness runs the kubelet's own device manager
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager) on a socket directory, without the rest of a
// kubelet, so a device plugin under test meets the real registration server, the real
// ListAndWatch consumer and real GetPreferredAllocation/Allocate calls.
//
// A test drives it through a small HTTP/JSON API on loopback:
//
//	GET    /healthz                 {"ok": true, "socket": ".../kubelet.sock", "restarts": 0}
//	GET    /resources               per resource: capacity, allocatable, healthy device IDs; deleted resources
//	POST   /allocate                {"resource": "nvidia.com/gpu", "count": 2, "pod": "p", "container": "c"}
//	                                -> the devices the manager chose and the runtime options it built
//	DELETE /pods/{uid}              the pod stops being active; its devices are freed on the next allocation
//	POST   /restart                 stop the manager, remove kubelet.sock, start a new one (a kubelet restart)
//
// The manager's socket path is a constant of the kubelet API (/var/lib/kubelet/device-plugins/
// kubelet.sock). To serve any other directory the harness re-executes itself in a private mount
// namespace and bind-mounts that directory over the constant path there; the plugin under test,
// outside the namespace, sees the same socket files in the directory it was given.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

// namespaceMarker is set in the environment of the re-executed child that runs inside its own
// mount namespace, so it does not re-execute again.
const namespaceMarker = "DMHARNESS_IN_MOUNT_NAMESPACE"

type sourcesReady struct{}

func (sourcesReady) AddSource(string) {}
func (sourcesReady) AllReady() bool   { return true }

// harness owns one device manager at a time and the set of fake pods that are "running".
type harness struct {
	mu         sync.Mutex
	logger     klog.Logger
	manager    *devicemanager.ManagerImpl
	socketDir  string // as the plugin under test sees it
	restarts   int
	activePods map[types.UID]*v1.Pod
	podCount   int
}

// podsMu guards activePods apart from mu: the manager calls active() while a handler holds mu.
var podsMu sync.Mutex

// active is the manager's ActivePodsFunc: the fake pods allocated and not deleted.
func (h *harness) active() []*v1.Pod {
	podsMu.Lock()
	defer podsMu.Unlock()
	out := make([]*v1.Pod, 0, len(h.activePods))
	for _, p := range h.activePods {
		out = append(out, p)
	}
	return out
}

func (h *harness) start() error {
	m, err := devicemanager.NewManagerImpl(h.logger, nil, topologymanager.NewFakeManager(h.logger))
	if err != nil {
		return fmt.Errorf("create device manager: %w", err)
	}
	if err := m.Start(h.logger, h.active, sourcesReady{}, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		return fmt.Errorf("start device manager: %w", err)
	}
	h.manager = m
	return nil
}

// restart does what a kubelet restart does to the device manager: the old registration server
// goes away together with kubelet.sock, and a new manager (reading the checkpoint) listens again.
func (h *harness) restart() error {
	if err := h.manager.Stop(h.logger); err != nil {
		return fmt.Errorf("stop device manager: %w", err)
	}
	if err := os.Remove(pluginapi.KubeletSocket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", pluginapi.KubeletSocket, err)
	}
	h.restarts++
	return h.start()
}

type resourceState struct {
	Capacity       int64    `json:"capacity"`
	Allocatable    int64    `json:"allocatable"`
	HealthyDevices []string `json:"healthy_devices"`
}

func (h *harness) resources() map[string]any {
	capacity, allocatable, deleted := h.manager.GetCapacity(h.logger)
	healthy := h.manager.GetAllocatableDevices(h.logger)
	out := map[string]resourceState{}
	for name, q := range capacity {
		ids := make([]string, 0)
		for id := range healthy[string(name)] {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		a := allocatable[name]
		out[string(name)] = resourceState{Capacity: q.Value(), Allocatable: a.Value(), HealthyDevices: ids}
	}
	sort.Strings(deleted)
	if deleted == nil {
		deleted = []string{}
	}
	return map[string]any{"resources": out, "deleted": deleted}
}

type allocateRequest struct {
	Resource  string `json:"resource"`
	Count     int64  `json:"count"`
	Pod       string `json:"pod"`
	Container string `json:"container"`
}

func (h *harness) allocate(ctx context.Context, req allocateRequest) (map[string]any, int, error) {
	if req.Resource == "" || req.Count <= 0 {
		return nil, http.StatusBadRequest, errors.New("allocate: 'resource' (string) and 'count' (> 0) are required")
	}
	h.podCount++
	if req.Pod == "" {
		req.Pod = fmt.Sprintf("pod-%d", h.podCount)
	}
	if req.Container == "" {
		req.Container = "main"
	}
	qty := *resource.NewQuantity(req.Count, resource.DecimalSI)
	container := v1.Container{
		Name: req.Container,
		Resources: v1.ResourceRequirements{
			Limits:   v1.ResourceList{v1.ResourceName(req.Resource): qty},
			Requests: v1.ResourceList{v1.ResourceName(req.Resource): qty},
		},
	}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: req.Pod, Namespace: "default", UID: types.UID(fmt.Sprintf("dmharness-%d-%s", h.podCount, req.Pod)),
		},
		Spec: v1.PodSpec{Containers: []v1.Container{container}},
	}
	podsMu.Lock()
	h.activePods[pod.UID] = pod
	podsMu.Unlock()
	fail := func(err error) (map[string]any, int, error) {
		podsMu.Lock()
		delete(h.activePods, pod.UID)
		podsMu.Unlock()
		return nil, http.StatusConflict, err
	}
	if err := h.manager.Allocate(ctx, pod, &pod.Spec.Containers[0], lifecycle.AddOperation); err != nil {
		return fail(fmt.Errorf("allocate %d %s: %w", req.Count, req.Resource, err))
	}
	opts, err := h.manager.GetDeviceRunContainerOptions(ctx, pod, &pod.Spec.Containers[0])
	if err != nil {
		return fail(fmt.Errorf("container options for %d %s: %w", req.Count, req.Resource, err))
	}
	devices := make([]string, 0)
	for id := range h.manager.GetDevices(string(pod.UID), req.Container)[req.Resource] {
		devices = append(devices, id)
	}
	sort.Strings(devices)
	envs := map[string]string{}
	mounts := make([]map[string]any, 0)
	devs := make([]map[string]string, 0)
	annotations := map[string]string{}
	cdi := make([]string, 0)
	if opts != nil {
		for _, e := range opts.Envs {
			envs[e.Name] = e.Value
		}
		for _, m := range opts.Mounts {
			mounts = append(mounts, map[string]any{
				"container_path": m.ContainerPath, "host_path": m.HostPath, "read_only": m.ReadOnly,
			})
		}
		for _, d := range opts.Devices {
			devs = append(devs, map[string]string{
				"host_path": d.PathOnHost, "container_path": d.PathInContainer, "permissions": d.Permissions,
			})
		}
		for _, a := range opts.Annotations {
			annotations[a.Name] = a.Value
		}
		for _, c := range opts.CDIDevices {
			cdi = append(cdi, c.Name)
		}
	}
	return map[string]any{
		"pod_uid": string(pod.UID), "pod": req.Pod, "container": req.Container, "resource": req.Resource,
		"device_ids": devices, "envs": envs, "mounts": mounts, "devices": devs, "annotations": annotations,
		"cdi_devices": cdi,
	}, http.StatusOK, nil
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

func writeError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, map[string]string{"error": err.Error()})
}

func (h *harness) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		h.mu.Lock()
		defer h.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{
			"ok": true, "socket": filepath.Join(h.socketDir, filepath.Base(pluginapi.KubeletSocket)),
			"restarts": h.restarts,
		})
	})
	mux.HandleFunc("GET /resources", func(w http.ResponseWriter, _ *http.Request) {
		h.mu.Lock()
		defer h.mu.Unlock()
		writeJSON(w, http.StatusOK, h.resources())
	})
	mux.HandleFunc("POST /allocate", func(w http.ResponseWriter, r *http.Request) {
		var req allocateRequest
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Errorf("allocate: bad JSON body: %w", err))
			return
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
		defer cancel()
		body, status, err := h.allocate(klog.NewContext(ctx, h.logger), req)
		if err != nil {
			writeError(w, status, err)
			return
		}
		writeJSON(w, status, body)
	})
	mux.HandleFunc("DELETE /pods/{uid}", func(w http.ResponseWriter, r *http.Request) {
		uid := types.UID(r.PathValue("uid"))
		podsMu.Lock()
		_, ok := h.activePods[uid]
		delete(h.activePods, uid)
		podsMu.Unlock()
		if !ok {
			writeError(w, http.StatusNotFound, fmt.Errorf("no active pod with uid %q", uid))
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"deleted": string(uid)})
	})
	mux.HandleFunc("POST /restart", func(w http.ResponseWriter, _ *http.Request) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if err := h.restart(); err != nil {
			writeError(w, http.StatusInternalServerError, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"restarts": h.restarts})
	})
	return mux
}

// reexecInMountNamespace runs this program again in a private mount namespace and waits for it,
// passing signals on; it returns the child's exit code.
func reexecInMountNamespace() int {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "dmharness: cannot find own executable: %v\n", err)
		return 1
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), namespaceMarker+"=1")
	// Go makes every mount private (MS_REC|MS_PRIVATE on /) after unsharing CLONE_NEWNS, so the
	// bind mount below never reaches the host's namespace.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "dmharness: cannot start in a private mount namespace (needs root or CAP_SYS_ADMIN): %v\n", err)
		return 1
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	if err := cmd.Wait(); err != nil {
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			return exitErr.ExitCode()
		}
		return 1
	}
	return 0
}

func main() {
	klog.InitFlags(nil)
	socketDir := flag.String("socket-dir", pluginapi.DevicePluginPath,
		"directory for kubelet.sock and the plugins' sockets (the kubelet's own when left as is)")
	listen := flag.String("listen", "127.0.0.1:0", "loopback address of the HTTP API")
	readyFile := flag.String("ready-file", "", "once serving, write the HTTP API's address here (atomically)")
	flag.Parse()
	logger := klog.Background()

	dir, err := filepath.Abs(*socketDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dmharness: --socket-dir %q: %v\n", *socketDir, err)
		os.Exit(2)
	}
	kubeletDir := filepath.Clean(pluginapi.DevicePluginPath)
	if dir != kubeletDir {
		if os.Getenv(namespaceMarker) == "" {
			os.Exit(reexecInMountNamespace())
		}
		if err := os.MkdirAll(dir, 0o750); err != nil {
			fmt.Fprintf(os.Stderr, "dmharness: --socket-dir %s: %v\n", dir, err)
			os.Exit(1)
		}
		if err := os.MkdirAll(kubeletDir, 0o750); err != nil {
			fmt.Fprintf(os.Stderr, "dmharness: create mount point %s: %v\n", kubeletDir, err)
			os.Exit(1)
		}
		if err := syscall.Mount(dir, kubeletDir, "", syscall.MS_BIND, ""); err != nil {
			fmt.Fprintf(os.Stderr, "dmharness: bind-mount %s on %s: %v\n", dir, kubeletDir, err)
			os.Exit(1)
		}
	}
	host, _, err := net.SplitHostPort(*listen)
	if err != nil || !net.ParseIP(host).IsLoopback() {
		fmt.Fprintf(os.Stderr, "dmharness: --listen %q must be a loopback host:port\n", *listen)
		os.Exit(2)
	}

	h := &harness{logger: logger, socketDir: dir, activePods: map[types.UID]*v1.Pod{}}
	if err := h.start(); err != nil {
		fmt.Fprintf(os.Stderr, "dmharness: %v\n", err)
		os.Exit(1)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dmharness: --listen %s: %v\n", *listen, err)
		os.Exit(1)
	}
	srv := &http.Server{Handler: h.routes(), ReadHeaderTimeout: 10 * time.Second}
	addr := ln.Addr().String()
	if *readyFile != "" {
		tmp := *readyFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(addr+"\n"), 0o644); err == nil {
			err = os.Rename(tmp, *readyFile)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "dmharness: --ready-file %s: %v\n", *readyFile, err)
			os.Exit(1)
		}
	}
	fmt.Fprintf(os.Stderr, "dmharness: serving %s, kubelet.sock in %s\n", addr, dir)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(os.Stderr, "dmharness: serve: %v\n", err)
	}
	h.mu.Lock()
	_ = h.manager.Stop(logger)
	h.mu.Unlock()
	_ = os.Remove(pluginapi.KubeletSocket)
}
