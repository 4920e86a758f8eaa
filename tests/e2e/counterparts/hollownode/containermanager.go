package main

import (
	"context"
	"sort"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/server/healthz"
	clientset "k8s.io/client-go/kubernetes"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/cm/resourceupdates"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
	"k8s.io/kubernetes/pkg/kubelet/status"
	schedulerframework "k8s.io/kubernetes/pkg/scheduler/framework"
)

// deviceContainerManager is kubemark's stub container manager with the device-plugin and DRA halves
// put back: every device-plugin method goes to the kubelet's real device manager, wired the way the
// Linux container manager wires it (a topology manager with policy "none" whose pod admit handler
// calls the device manager's Allocate), and every DRA method to the kubelet's real DRA manager (plugin
// registration through the plugin watcher, NodePrepareResources before the pod's sandbox,
// NodeUnprepareResources after it, CDI devices into the CRI request, device health into
// allocatedResourcesStatus). CPU, memory and cgroups stay the stub's.
type deviceContainerManager struct {
	cm.ContainerManager // the stub

	devices  *devicemanager.ManagerImpl
	topology topologymanager.Manager
	dra      *dra.Manager
	updates  chan resourceupdates.Update
}

var _ cm.ContainerManager = (*deviceContainerManager)(nil)

// newDeviceContainerManager creates the device manager; its registration server (kubelet.sock in
// the device-plugins folder) starts listening only when the kubelet calls Start.
func newDeviceContainerManager(logger klog.Logger, client clientset.Interface, rootDir string) (*deviceContainerManager, error) {
	// No NUMA topology: the fake machine has none, and policy "none" asks for no hints.
	topology, err := topologymanager.NewManager(logger, nil, topologymanager.PolicyNone,
		topologymanager.ContainerTopologyScope, nil)
	if err != nil {
		return nil, err
	}
	devices, err := devicemanager.NewManagerImpl(logger, nil, topology)
	if err != nil {
		return nil, err
	}
	topology.AddHintProvider(logger, devices)
	draManager, err := dra.NewManager(logger, client, rootDir)
	if err != nil {
		return nil, err
	}
	m := &deviceContainerManager{
		ContainerManager: cm.NewStubContainerManager(),
		devices:          devices,
		topology:         topology,
		dra:              draManager,
		updates:          make(chan resourceupdates.Update, 10),
	}
	// Both managers' health updates reach the kubelet's sync loop through one channel, as in the
	// Linux container manager.
	for _, source := range []<-chan resourceupdates.Update{devices.Updates(), draManager.Updates()} {
		go func(c <-chan resourceupdates.Update) {
			for u := range c {
				m.updates <- u
			}
		}(source)
	}
	return m, nil
}

// Start starts the stub (fake CPU and memory managers), then the device manager with the containers
// the runtime already has, so a container found running keeps its devices.
func (m *deviceContainerManager) Start(ctx context.Context, node *v1.Node, activePods cm.ActivePodsFunc,
	getNode cm.GetNodeFunc, sourcesReady config.SourcesReady, podStatus status.PodStatusProvider,
	runtime internalapi.RuntimeService, localStorageCapacityIsolation bool) error {
	if err := m.ContainerManager.Start(ctx, node, activePods, getNode, sourcesReady, podStatus, runtime,
		localStorageCapacityIsolation); err != nil {
		return err
	}
	if err := m.dra.Start(ctx, dra.ActivePodsFunc(activePods), dra.GetNodeFunc(getNode), sourcesReady); err != nil {
		return err
	}
	containers, running := runtimeContainers(ctx, runtime)
	return m.devices.Start(klog.FromContext(ctx), devicemanager.ActivePodsFunc(activePods), sourcesReady,
		containers, running)
}

// runtimeContainers maps the runtime's containers to their pods' UIDs and notes which are running.
func runtimeContainers(ctx context.Context, runtime internalapi.RuntimeService) (containermap.ContainerMap, sets.Set[string]) {
	logger := klog.FromContext(ctx)
	containers := containermap.NewContainerMap()
	running := sets.New[string]()
	sandboxes, err := runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		logger.Error(err, "Listing pod sandboxes for the device manager failed; starting it with none")
		return containers, running
	}
	podOf := make(map[string]string, len(sandboxes))
	for _, s := range sandboxes {
		podOf[s.Id] = s.GetMetadata().GetUid()
	}
	list, err := runtime.ListContainers(ctx, nil)
	if err != nil {
		logger.Error(err, "Listing containers for the device manager failed; starting it with none")
		return containers, running
	}
	for _, c := range list {
		uid, ok := podOf[c.PodSandboxId]
		if !ok {
			continue
		}
		containers.Add(uid, c.GetMetadata().GetName(), c.Id)
		if c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
			running.Insert(c.Id)
		}
	}
	return containers, running
}

func (m *deviceContainerManager) GetPluginRegistrationHandlers() map[string]cache.PluginHandler {
	return map[string]cache.PluginHandler{
		pluginwatcherapi.DevicePlugin: m.devices.GetWatcherHandler(),
		pluginwatcherapi.DRAPlugin:    m.dra.GetWatcherHandler(),
	}
}

func (m *deviceContainerManager) GetHealthCheckers() []healthz.HealthChecker {
	return []healthz.HealthChecker{m.devices.GetHealthChecker()}
}

func (m *deviceContainerManager) GetDevicePluginResourceCapacity(logger klog.Logger) (v1.ResourceList, v1.ResourceList, []string) {
	return m.devices.GetCapacity(logger)
}

// GetAllocateResourcesPodAdmitHandler is the topology manager: its Admit calls the device
// manager's Allocate for every container (GetPreferredAllocation, then the plugin's Allocate).
func (m *deviceContainerManager) GetAllocateResourcesPodAdmitHandler(_ klog.Logger) lifecycle.PodAdmitHandler {
	return m.topology
}

func (m *deviceContainerManager) UpdatePluginResources(node *schedulerframework.NodeInfo, attrs *lifecycle.PodAdmitAttributes) error {
	return m.devices.UpdatePluginResources(node, attrs)
}

// GetResources hands the kubelet what the device plugin's Allocate returned for this container;
// the kubelet puts it into the CRI CreateContainer request.
func (m *deviceContainerManager) GetResources(ctx context.Context, pod *v1.Pod, container *v1.Container) (*kubecontainer.RunContainerOptions, error) {
	opts := &kubecontainer.RunContainerOptions{}
	claimed, err := m.dra.GetResources(pod, container)
	if err != nil {
		return nil, err
	}
	opts.CDIDevices = append(opts.CDIDevices, claimed.CDIDevices...)
	dev, err := m.devices.GetDeviceRunContainerOptions(ctx, pod, container)
	if err != nil || dev == nil {
		return opts, err
	}
	opts.Envs = dev.Envs
	opts.Mounts = dev.Mounts
	opts.Devices = dev.Devices
	opts.Annotations = dev.Annotations
	opts.CDIDevices = append(opts.CDIDevices, dev.CDIDevices...)
	return opts, nil
}

func (m *deviceContainerManager) PrepareDynamicResources(ctx context.Context, pod *v1.Pod) error {
	return m.dra.PrepareResources(ctx, pod)
}

func (m *deviceContainerManager) UnprepareDynamicResources(ctx context.Context, pod *v1.Pod) error {
	return m.dra.UnprepareResources(ctx, pod)
}

func (m *deviceContainerManager) PodMightNeedToUnprepareResources(uid types.UID) bool {
	return m.dra.PodMightNeedToUnprepareResources(uid)
}

func (m *deviceContainerManager) GetDevices(podUID, containerName string) []*podresourcesapi.ContainerDevices {
	return podResourcesDevices(m.devices.GetDevices(podUID, containerName))
}

func (m *deviceContainerManager) GetAllocatableDevices(logger klog.Logger) []*podresourcesapi.ContainerDevices {
	return podResourcesDevices(m.devices.GetAllocatableDevices(logger))
}

func (m *deviceContainerManager) ShouldResetExtendedResourceCapacity() bool {
	return m.devices.ShouldResetExtendedResourceCapacity()
}

func (m *deviceContainerManager) UpdateAllocatedDevices(logger klog.Logger) {
	m.devices.UpdateAllocatedDevices(logger)
}

func (m *deviceContainerManager) UpdateAllocatedResourcesStatus(logger klog.Logger, pod *v1.Pod, st *v1.PodStatus) {
	m.devices.UpdateAllocatedResourcesStatus(logger, pod, st)
	m.dra.UpdateAllocatedResourcesStatus(logger, pod, st)
}

func (m *deviceContainerManager) Updates() <-chan resourceupdates.Update {
	return m.updates
}

// stop closes the registration server; kubelet.sock is removed by the caller.
func (m *deviceContainerManager) stop(logger klog.Logger) error {
	return m.devices.Stop(logger)
}

// podResourcesDevices turns the device manager's view into the pod-resources API's: one entry per
// device and NUMA node (one without topology when the plugin gave none), in a stable order.
func podResourcesDevices(instances devicemanager.ResourceDeviceInstances) []*podresourcesapi.ContainerDevices {
	var out []*podresourcesapi.ContainerDevices
	resources := make([]string, 0, len(instances))
	for name := range instances {
		resources = append(resources, name)
	}
	sort.Strings(resources)
	for _, name := range resources {
		ids := make([]string, 0, len(instances[name]))
		for id := range instances[name] {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for _, id := range ids {
			nodes := instances[name][id].GetTopology().GetNodes()
			if len(nodes) == 0 {
				out = append(out, &podresourcesapi.ContainerDevices{ResourceName: name, DeviceIds: []string{id}})
				continue
			}
			for _, n := range nodes {
				out = append(out, &podresourcesapi.ContainerDevices{
					ResourceName: name,
					DeviceIds:    []string{id},
					Topology:     &podresourcesapi.TopologyInfo{Nodes: []*podresourcesapi.NUMANode{{ID: n.GetID()}}},
				})
			}
		}
	}
	return out
}
