package main

import (
	"context"
	"encoding/json"
	"os"
	"sync"
	"time"

	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
)

// containerRecord is one line of the --record file: what the kubelet asked the runtime to create.
// The fake runtime keeps none of envs, devices, mounts or CDI devices, so they are taken here, on
// the kubelet's side of the CRI connection.
type containerRecord struct {
	Time        string            `json:"time"` // RFC 3339, UTC, when the runtime answered
	Node        string            `json:"node"`
	Namespace   string            `json:"namespace"`
	Pod         string            `json:"pod"`
	PodUID      string            `json:"pod_uid"`
	Container   string            `json:"container"`
	Attempt     uint32            `json:"attempt"`
	Image       string            `json:"image"`
	ContainerID string            `json:"container_id"` // "" when the runtime refused
	Error       string            `json:"error"`        // "" when the runtime created it
	Envs        map[string]string `json:"envs"`         // a name given twice keeps its last value
	Devices     []deviceRecord    `json:"devices"`
	Mounts      []mountRecord     `json:"mounts"`
	CDIDevices  []string          `json:"cdi_devices"`
	Annotations map[string]string `json:"annotations"`
}

type deviceRecord struct {
	HostPath      string `json:"host_path"`
	ContainerPath string `json:"container_path"`
	Permissions   string `json:"permissions"`
}

type mountRecord struct {
	HostPath      string `json:"host_path"`
	ContainerPath string `json:"container_path"`
	ReadOnly      bool   `json:"read_only"`
}

// recordFile appends one JSON line per CreateContainer, each with a single write.
type recordFile struct {
	mu   sync.Mutex
	file *os.File
}

func openRecordFile(path string) (*recordFile, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &recordFile{file: f}, nil
}

func (r *recordFile) write(rec *containerRecord) error {
	line, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, err = r.file.Write(append(line, '\n'))
	return err
}

func (r *recordFile) close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.file.Close()
}

// recordingRuntime is the kubelet's CRI runtime client with CreateContainer requests recorded.
type recordingRuntime struct {
	internalapi.RuntimeService
	node   string
	record *recordFile // nil: record nothing
}

func (r *recordingRuntime) CreateContainer(ctx context.Context, podSandboxID string,
	cfg *runtimeapi.ContainerConfig, sandbox *runtimeapi.PodSandboxConfig) (string, error) {
	id, err := r.RuntimeService.CreateContainer(ctx, podSandboxID, cfg, sandbox)
	if r.record != nil {
		rec := newContainerRecord(r.node, cfg, sandbox)
		rec.ContainerID = id
		if err != nil {
			rec.Error = err.Error()
		}
		if werr := r.record.write(rec); werr != nil {
			klog.FromContext(ctx).Error(werr, "Recording a CreateContainer request failed",
				"pod", rec.Namespace+"/"+rec.Pod, "container", rec.Container)
		}
	}
	return id, err
}

func newContainerRecord(node string, cfg *runtimeapi.ContainerConfig, sandbox *runtimeapi.PodSandboxConfig) *containerRecord {
	rec := &containerRecord{
		Time:        time.Now().UTC().Format(time.RFC3339Nano),
		Node:        node,
		Namespace:   sandbox.GetMetadata().GetNamespace(),
		Pod:         sandbox.GetMetadata().GetName(),
		PodUID:      sandbox.GetMetadata().GetUid(),
		Container:   cfg.GetMetadata().GetName(),
		Attempt:     cfg.GetMetadata().GetAttempt(),
		Image:       cfg.GetImage().GetImage(),
		Envs:        map[string]string{},
		Devices:     []deviceRecord{},
		Mounts:      []mountRecord{},
		CDIDevices:  []string{},
		Annotations: map[string]string{},
	}
	for _, e := range cfg.GetEnvs() {
		rec.Envs[e.GetKey()] = string(e.GetValue()) // bytes on the wire (CRI v1.37)
	}
	for _, d := range cfg.GetDevices() {
		rec.Devices = append(rec.Devices, deviceRecord{
			HostPath: d.GetHostPath(), ContainerPath: d.GetContainerPath(), Permissions: d.GetPermissions(),
		})
	}
	for _, m := range cfg.GetMounts() {
		rec.Mounts = append(rec.Mounts, mountRecord{
			HostPath: m.GetHostPath(), ContainerPath: m.GetContainerPath(), ReadOnly: m.GetReadonly(),
		})
	}
	for _, c := range cfg.GetCDIDevices() {
		rec.CDIDevices = append(rec.CDIDevices, c.GetName())
	}
	for k, v := range cfg.GetAnnotations() {
		rec.Annotations[k] = v
	}
	return rec
}
