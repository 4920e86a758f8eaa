package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	remote "k8s.io/cri-client/pkg"
	fakeremote "k8s.io/cri-client/pkg/fake"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/cmd/kubelet/app/options"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/apis/config"
	cadvisortest "k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"
	kubetypes "k8s.io/kubernetes/pkg/kubelet/types"
	"k8s.io/kubernetes/pkg/kubemark"
)

// fakeMachine is kubemark's fake cAdvisor with the CPU count and memory of --cpus and --memory.
type fakeMachine struct {
	cadvisortest.Fake
	cpus   int
	memory uint64
}

func (m *fakeMachine) MachineInfo(logger klog.Logger) (*cadvisorapi.MachineInfo, error) {
	info, err := m.Fake.MachineInfo(logger)
	if err != nil {
		return nil, err
	}
	info.NumCores = m.cpus
	info.MemoryCapacity = m.memory
	return info, nil
}

// kubeletSettings turns the options into the kubelet's flags and configuration: kubemark's hollow
// kubelet settings, except that the root directory is ours, the server binds --address and the
// read-only port is off.
func kubeletSettings(o *nodeOptions) (*options.KubeletFlags, *kubeletconfig.KubeletConfiguration, error) {
	staticPods := filepath.Join(o.rootDir, "static-pods")
	podLogs := filepath.Join(o.rootDir, "pod-logs")
	for _, d := range []string{staticPods, podLogs} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, nil, err
		}
	}

	f := options.NewKubeletFlags()
	f.RootDirectory = o.rootDir
	f.HostnameOverride = o.name
	f.NodeLabels = o.nodeLabels
	f.MinimumGCAge = metav1.Duration{Duration: time.Minute}
	f.MaxContainerCount = 100
	f.MaxPerPodContainerCount = 2

	c, err := options.NewKubeletConfiguration()
	if err != nil {
		return nil, nil, err
	}
	c.EnableServer = true
	c.Address = o.address
	c.Port = int32(o.kubeletPort)
	c.ReadOnlyPort = 0
	c.StaticPodPath = staticPods
	c.StaticPodURL = ""
	c.PodLogsDir = podLogs
	c.MaxPods = int32(o.maxPods)
	c.PodsPerCore = 0
	c.RegisterNode = true
	c.RegisterWithTaints = o.taints
	c.ProviderID = "hollownode://" + o.name
	c.NodeStatusUpdateFrequency.Duration = o.statusUpdateFrequency
	if c.NodeStatusReportFrequency.Duration < o.statusUpdateFrequency {
		c.NodeStatusReportFrequency.Duration = o.statusUpdateFrequency
	}
	c.SyncFrequency.Duration = 10 * time.Second
	c.FileCheckFrequency.Duration = 20 * time.Second
	c.HTTPCheckFrequency.Duration = 20 * time.Second
	c.EvictionPressureTransitionPeriod.Duration = 5 * time.Minute
	c.VolumeStatsAggPeriod.Duration = time.Minute
	c.ImageGCHighThresholdPercent = 90
	c.ImageGCLowThresholdPercent = 80
	c.ClusterDNS = []string{}
	c.ResolverConfig = kubetypes.ResolvConfDefault
	// No cgroups: the stub container manager creates none.
	c.CgroupsPerQOS = false
	c.CgroupRoot = ""
	c.KubeletCgroups = "/kubelet"
	c.SystemCgroups = ""
	c.CPUCFSQuota = true
	c.ProtectKernelDefaults = false
	c.EnableControllerAttachDetach = false
	c.EnableDebuggingHandlers = true
	c.HairpinMode = kubeletconfig.HairpinVeth
	c.LocalStorageCapacityIsolation = true
	c.SerializeImagePulls = true
	c.RegistryPullQPS = 5
	c.RegistryBurst = 10
	c.MaxOpenFiles = 4096 // the kubelet sets the process's limit to this
	// The fake runtime has no log files to rotate; its log manager would only complain every 10 s.
	c.ContainerLogMonitorInterval.Duration = time.Hour
	c.KubeAPIQPS = int32(o.apiQPS)
	c.KubeAPIBurst = int32(o.apiBurst)
	return f, c, nil
}

// hollowKubelet is a running kubelet with its fake runtime and device-aware container manager.
type hollowKubelet struct {
	runtime     *fakeremote.RemoteRuntime
	criSocket   string
	manager     *deviceContainerManager
	record      *recordFile
	podResource string // the pod-resources socket
}

// startHollowKubelet builds the kubelet's dependencies and starts it; the kubelet runs on in
// goroutines of its own.
func startHollowKubelet(ctx context.Context, o *nodeOptions, record *recordFile) (*hollowKubelet, error) {
	logger := klog.FromContext(ctx)
	loaded, err := clientcmd.LoadFromFile(o.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", o.kubeconfig, err)
	}
	restConfig, err := clientcmd.NewDefaultClientConfig(*loaded, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", o.kubeconfig, err)
	}
	restConfig.ContentType = "application/vnd.kubernetes.protobuf"
	restConfig.QPS = float32(o.apiQPS)
	restConfig.Burst = o.apiBurst
	restConfig.UserAgent = "hollownode/" + o.name
	client, err := clientset.NewForConfig(restConfig)
	if err != nil {
		return nil, fmt.Errorf("API client: %w", err)
	}

	flags, config, err := kubeletSettings(o)
	if err != nil {
		return nil, fmt.Errorf("--root-dir %s: %w", o.rootDir, err)
	}

	// Heartbeats (lease, node status) get their own unthrottled client that gives up within one
	// update period, as the kubelet's own does.
	heartbeatConfig := *restConfig
	heartbeatConfig.QPS = -1
	heartbeatConfig.Timeout = config.NodeStatusUpdateFrequency.Duration
	if lease := time.Duration(config.NodeLeaseDurationSeconds) * time.Second; heartbeatConfig.Timeout > lease {
		heartbeatConfig.Timeout = lease
	}
	heartbeatClient, err := clientset.NewForConfig(&heartbeatConfig)
	if err != nil {
		return nil, fmt.Errorf("API heartbeat client: %w", err)
	}

	hk := &hollowKubelet{
		criSocket:   filepath.Join(o.rootDir, "cri.sock"),
		record:      record,
		podResource: filepath.Join(o.rootDir, "pod-resources", "kubelet.sock"),
	}
	hk.runtime = fakeremote.NewFakeRemoteRuntime()
	if err := hk.runtime.Start("unix://" + hk.criSocket); err != nil {
		return nil, fmt.Errorf("fake container runtime on %s: %w", hk.criSocket, err)
	}
	runtimeClient, err := remote.NewRemoteRuntimeServiceBuilder().
		WithEndpoint("unix://" + hk.criSocket).
		WithConnectionTimeout(15 * time.Second).
		Build(ctx)
	if err != nil {
		hk.runtime.Stop()
		return nil, fmt.Errorf("fake container runtime client: %w", err)
	}
	runtimeService := &recordingRuntime{RuntimeService: runtimeClient, node: o.name, record: record}

	hk.manager, err = newDeviceContainerManager(logger, client, o.rootDir)
	if err != nil {
		hk.runtime.Stop()
		return nil, fmt.Errorf("device manager: %w", err)
	}

	machine := &fakeMachine{Fake: cadvisortest.Fake{NodeName: o.name}, cpus: o.cpus, memory: o.memory}
	kubelet := kubemark.NewHollowKubelet(flags, config, client, heartbeatClient, machine,
		hk.runtime.ImageService, runtimeService, hk.manager)
	logger.Info("Starting hollow GPU node", "node", o.name, "rootDir", o.rootDir,
		"devicePluginsDir", o.devicePluginsDir, "kubeletPort", o.kubeletPort, "podResources", hk.podResource,
		"record", o.record)
	go kubelet.Run(ctx) // blocks forever; exits the process if the kubelet cannot start
	return hk, nil
}

// stop undoes what the process made outside itself: the device manager's server and kubelet.sock,
// the fake runtime's socket, the pod-resources socket; and closes the record file.
func (hk *hollowKubelet) stop(logger klog.Logger, kubeletSocket string) {
	if err := hk.manager.stop(logger); err != nil {
		logger.Error(err, "Stopping the device manager failed")
	}
	_ = os.Remove(kubeletSocket)
	hk.runtime.Stop()
	_ = os.Remove(hk.criSocket)
	_ = os.Remove(hk.podResource)
	if hk.record != nil {
		if err := hk.record.close(); err != nil {
			logger.Error(err, "Closing the record file failed")
		}
	}
}
