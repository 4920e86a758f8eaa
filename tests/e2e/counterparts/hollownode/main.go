// Command hollownode runs one hollow GPU node: kubemark's hollow kubelet (the real kubelet code
// with k8s.io/cri-client's fake container runtime and image service, and a fake cAdvisor) whose
// container manager is kubemark's stub except for the device-plugin parts, which are the kubelet's
// real device manager (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager). A device plugin under test
// registers on <device-plugins-dir>/kubelet.sock, its resources reach Node.status, pods are
// admitted through GetPreferredAllocation/Allocate, the runtime options it returns go to the CRI
// CreateContainer request, and the pod-resources API on <root-dir>/pod-resources/kubelet.sock
// reports who holds which device.
//
// Every CreateContainer request is appended to --record as one JSON line (the fake runtime keeps no
// envs, devices, mounts or CDI devices):
//
//	{"time": "...", "node": "n1", "namespace": "default", "pod": "p", "pod_uid": "...",
//	 "container": "c", "attempt": 0, "image": "pause", "container_id": "...", "error": "",
//	 "envs": {"NVIDIA_VISIBLE_DEVICES": "GPU-..."}, "devices": [{"host_path": "/dev/nvidia0",
//	 "container_path": "/dev/nvidia0", "permissions": "rw"}], "mounts": [{"host_path": "...",
//	 "container_path": "...", "read_only": true}], "cdi_devices": ["nvidia.com/gpu=..."],
//	 "annotations": {...}}
//
// The device manager's socket path is a constant of the kubelet API (/var/lib/kubelet/
// device-plugins/kubelet.sock), so the process runs in a private mount namespace with
// --device-plugins-dir bind-mounted over that path (root needed); the plugin, outside, uses the
// folder it was given. Logs go to stderr (klog flags such as -v apply); SIGTERM or SIGINT stops the
// node within a few seconds (exit 0); a bad flag prints one line naming it and exits 2.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/cmd/kubelet/app/options"
	utilflag "k8s.io/kubernetes/pkg/util/flag"
)

const (
	program = "hollownode"
	// namespaceMarker is set for the process that already runs in its own mount namespace.
	namespaceMarker = "HOLLOWNODE_IN_MOUNT_NAMESPACE"
	// maxSocketPath is the longest path a unix socket may have on Linux (sun_path less the NUL).
	maxSocketPath = 107
	// stopDeadline bounds the shutdown: the kubelet's goroutines are not waited for.
	stopDeadline = 3 * time.Second
)

type nodeOptions struct {
	name                  string
	kubeconfig            string
	rootDir               string
	devicePluginsDir      string
	record                string
	address               string
	kubeletPort           int
	maxPods               int
	nodeLabels            map[string]string
	taints                []v1.Taint
	cpus                  int
	memory                uint64
	statusUpdateFrequency time.Duration
	apiQPS                int
	apiBurst              int
}

// labelsFlag parses "key=value,key=value".
type labelsFlag map[string]string

func (l labelsFlag) String() string {
	parts := make([]string, 0, len(l))
	for k, v := range l {
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}

func (l labelsFlag) Set(s string) error {
	for _, kv := range strings.Split(s, ",") {
		if strings.TrimSpace(kv) == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return fmt.Errorf("%q is not key=value", kv)
		}
		l[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return nil
}

// parseFlags reads and checks the command line; an error names the flag.
func parseFlags(args []string) (*nodeOptions, error) {
	o := &nodeOptions{nodeLabels: map[string]string{}}
	fs := flag.NewFlagSet(program, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	klog.InitFlags(fs)
	fs.StringVar(&o.name, "name", "", "Node name to register (required)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the API server (required)")
	fs.StringVar(&o.rootDir, "root-dir", "", "kubelet root directory; pod-resources at DIR/pod-resources/kubelet.sock (required)")
	fs.StringVar(&o.devicePluginsDir, "device-plugins-dir", "",
		"folder served as /var/lib/kubelet/device-plugins: kubelet.sock, plugin sockets, checkpoint (required)")
	fs.StringVar(&o.record, "record", "", "append every CRI CreateContainer request to this file as a JSON line")
	fs.StringVar(&o.address, "address", "127.0.0.1", "IP address the kubelet's server binds")
	fs.IntVar(&o.kubeletPort, "kubelet-port", 10250, "kubelet server port; 0 picks a free one (the read-only port is off)")
	fs.IntVar(&o.maxPods, "max-pods", 110, "pods the node takes")
	fs.Var(labelsFlag(o.nodeLabels), "node-labels", "labels to register the node with, key=value,...")
	fs.Var(utilflag.RegisterWithTaintsVar{Value: &o.taints}, "register-with-taints", "taints to register the node with, key=value:Effect,...")
	fs.IntVar(&o.cpus, "cpus", 1, "CPU cores the fake machine reports")
	memory := fs.String("memory", "3840Mi", "memory the fake machine reports (a quantity)")
	fs.DurationVar(&o.statusUpdateFrequency, "node-status-update-frequency", 10*time.Second,
		"how often the kubelet computes node status (device capacity reaches Node.status at this pace)")
	fs.IntVar(&o.apiQPS, "kube-api-qps", 50, "queries per second to the API server")
	fs.IntVar(&o.apiBurst, "kube-api-burst", 100, "burst of queries to the API server")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(os.Stdout)
			fs.PrintDefaults()
		}
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (flags only)", fs.Arg(0))
	}

	required := map[string]*string{
		"name": &o.name, "kubeconfig": &o.kubeconfig, "root-dir": &o.rootDir, "device-plugins-dir": &o.devicePluginsDir,
	}
	for _, f := range []string{"name", "kubeconfig", "root-dir", "device-plugins-dir"} {
		if strings.TrimSpace(*required[f]) == "" {
			return nil, fmt.Errorf("--%s is required", f)
		}
	}
	var err error
	for _, p := range []*string{&o.rootDir, &o.devicePluginsDir, &o.kubeconfig} {
		if *p, err = filepath.Abs(*p); err != nil {
			return nil, err
		}
	}
	if sock := filepath.Join(o.rootDir, "pod-resources", "kubelet.sock"); len(sock) > maxSocketPath {
		return nil, fmt.Errorf("--root-dir %s: the pod-resources socket path %s is longer than %d bytes", o.rootDir, sock, maxSocketPath)
	}
	if sock := filepath.Join(o.devicePluginsDir, "kubelet.sock"); len(sock) > maxSocketPath {
		return nil, fmt.Errorf("--device-plugins-dir %s: %s is longer than %d bytes", o.devicePluginsDir, sock, maxSocketPath)
	}
	if ip := net.ParseIP(o.address); ip == nil {
		return nil, fmt.Errorf("--address %q is not an IP address", o.address)
	}
	if o.kubeletPort < 0 || o.kubeletPort > 65535 {
		return nil, fmt.Errorf("--kubelet-port %d is not a port (0-65535)", o.kubeletPort)
	}
	if o.maxPods < 1 {
		return nil, fmt.Errorf("--max-pods %d must be at least 1", o.maxPods)
	}
	if o.cpus < 1 {
		return nil, fmt.Errorf("--cpus %d must be at least 1", o.cpus)
	}
	q, err := resource.ParseQuantity(*memory)
	if err != nil || q.Sign() <= 0 {
		return nil, fmt.Errorf("--memory %q is not a positive quantity", *memory)
	}
	o.memory = uint64(q.Value())
	if o.statusUpdateFrequency <= 0 {
		return nil, fmt.Errorf("--node-status-update-frequency %s must be positive", o.statusUpdateFrequency)
	}
	if o.apiQPS <= 0 || o.apiBurst < 1 {
		return nil, fmt.Errorf("--kube-api-qps and --kube-api-burst must be positive")
	}
	kf := options.NewKubeletFlags()
	kf.NodeLabels = o.nodeLabels
	if err := options.ValidateKubeletFlags(kf); err != nil {
		return nil, fmt.Errorf("--node-labels: %s", strings.ReplaceAll(err.Error(), "\n", " "))
	}
	if _, err := clientcmd.LoadFromFile(o.kubeconfig); err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %s", o.kubeconfig, strings.ReplaceAll(err.Error(), "\n", " "))
	}
	if err := os.MkdirAll(o.rootDir, 0o750); err != nil {
		return nil, fmt.Errorf("--root-dir %s: %w", o.rootDir, err)
	}
	if err := os.MkdirAll(o.devicePluginsDir, 0o750); err != nil {
		return nil, fmt.Errorf("--device-plugins-dir %s: %w", o.devicePluginsDir, err)
	}
	if o.record != "" {
		if o.record, err = filepath.Abs(o.record); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(o.record, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("--record %s: %w", o.record, err)
		}
		_ = f.Close()
	}
	return o, nil
}

// needsNamespace tells whether the device-plugins folder is not the kubelet's own.
func (o *nodeOptions) needsNamespace() bool {
	return o.devicePluginsDir != filepath.Clean(pluginapi.DevicePluginPath)
}

// enterMountNamespace runs this program again in a private mount namespace. With util-linux's
// unshare the process image is replaced (same PID, signals reach the node directly); otherwise a
// child is started and waited for, with signals passed on. It returns only on failure or, in the
// second case, with the child's exit code.
func enterMountNamespace() int {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: cannot find own executable: %v\n", program, err)
		return 1
	}
	if os.Geteuid() != 0 {
		fmt.Fprintf(os.Stderr, "%s: --device-plugins-dir needs root (a private mount namespace for a bind mount)\n", program)
		return 1
	}
	env := append(os.Environ(), namespaceMarker+"=1")
	if unshare, err := exec.LookPath("unshare"); err == nil {
		argv := append([]string{"unshare", "--mount", "--propagation", "private", "--", self}, os.Args[1:]...)
		err = syscall.Exec(unshare, argv, env)
		fmt.Fprintf(os.Stderr, "%s: exec %s: %v; starting a child in a new mount namespace instead\n", program, unshare, err)
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = env
	// Go makes every mount private after unsharing CLONE_NEWNS, so the bind mount stays inside.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: cannot start in a private mount namespace: %v\n", program, err)
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
		if errors.As(err, &exitErr) && exitErr.ExitCode() >= 0 {
			return exitErr.ExitCode()
		}
		return 1
	}
	return 0
}

// bindDevicePluginsDir puts --device-plugins-dir over the kubelet's constant folder, in this
// process's own mount namespace.
func bindDevicePluginsDir(dir string) error {
	target := filepath.Clean(pluginapi.DevicePluginPath)
	if err := os.MkdirAll(target, 0o750); err != nil {
		return fmt.Errorf("create mount point %s: %w", target, err)
	}
	if err := syscall.Mount(dir, target, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount %s on %s: %w", dir, target, err)
	}
	return nil
}

// freePort asks the kernel for a free TCP port on addr.
func freePort(addr string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func run() int {
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", program, err)
		return 2
	}
	if o.needsNamespace() {
		if os.Getenv(namespaceMarker) == "" {
			return enterMountNamespace()
		}
		if err := bindDevicePluginsDir(o.devicePluginsDir); err != nil {
			fmt.Fprintf(os.Stderr, "%s: --device-plugins-dir: %v\n", program, err)
			return 1
		}
	}
	if o.kubeletPort == 0 {
		if o.kubeletPort, err = freePort(o.address); err != nil {
			fmt.Fprintf(os.Stderr, "%s: --kubelet-port 0: no free port on %s: %v\n", program, o.address, err)
			return 1
		}
	}

	var record *recordFile
	if o.record != "" {
		if record, err = openRecordFile(o.record); err != nil {
			fmt.Fprintf(os.Stderr, "%s: --record %s: %v\n", program, o.record, err)
			return 1
		}
	}

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logger := klog.Background().WithValues("node", o.name)
	ctx = klog.NewContext(ctx, logger)

	hk, err := startHollowKubelet(ctx, o, record)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", program, err)
		return 1
	}
	s := <-sigs
	logger.Info("Stopping hollow GPU node", "signal", s.String())
	// The kubelet does not stop its goroutines on cancel; do not wait for it beyond the deadline.
	timer := time.AfterFunc(stopDeadline, func() {
		logger.Info("Stop took too long; exiting", "deadline", stopDeadline)
		klog.Flush()
		os.Exit(0)
	})
	cancel()
	hk.stop(logger, pluginapi.KubeletSocket)
	timer.Stop()
	klog.Flush()
	return 0
}

func main() {
	code := run()
	klog.Flush()
	os.Exit(code)
}
