// Package hostapi is the contract between the vps module and its VM hosts (bcd node with a VM
// runtime, vps/hostagent): the desired-state part that says which instances a host runs, and the
// reports a host sends back. Neither side imports the other; both import this.
package hostapi

import "strings"

// KindInstances is the desired-state part of a VM host: every instance it should run.
const (
	KindInstances    = "vps.instances"
	InstancesVersion = 1
)

// Report kinds a host sends.
const (
	// KindHost announces the host's VM runtime, when its session starts.
	KindHost = "vps.host"
	// KindStatus is what the host found of its instances, after each convergence and
	// periodically.
	KindStatus = "vps.instance_status"
)

// Instances is the payload of KindInstances.
type Instances struct {
	Instances []Instance `json:"instances"`
}

// Instance is one instance a host runs.
type Instance struct {
	ID        string    `json:"id"`
	VCPUs     int       `json:"vcpus"`
	MemoryMiB int       `json:"memoryMiB"`
	DiskGiB   int       `json:"diskGiB,omitempty"`
	Kernel    *Artifact `json:"kernel,omitempty"`
	Initrd    *Artifact `json:"initrd,omitempty"`
	Cmdline   string    `json:"cmdline,omitempty"`
	Disk      *Artifact `json:"disk,omitempty"`
	Power     string    `json:"power"`          // running, paused or stopped
	Reboots   int       `json:"reboots"`        // when it grows past what the host has done, the host reboots it
	GPUs      []string  `json:"gpus,omitempty"` // the UUIDs of the GPUs its reservation holds, passed through
}

// Artifact is a file to fetch, checked by its SHA-256.
type Artifact struct {
	URL    string `json:"url"`
	SHA256 string `json:"sha256"`
}

// Host is the payload of KindHost.
type Host struct {
	Runtime string `json:"runtime"` // libvirt-kvm, cloud-hypervisor
}

// Status is the payload of KindStatus: every instance the host has.
type Status struct {
	Instances []InstanceStatus `json:"instances"`
}

// InstanceStatus is one instance as the host found it.
type InstanceStatus struct {
	ID      string `json:"id"`
	State   string `json:"state"` // running, paused, stopped, error
	Detail  string `json:"detail,omitempty"`
	Reboots int    `json:"reboots"` // the reboots done
}

// ConsoleName is the name of an instance's serial console among its host's consoles
// (access.console's console).
func ConsoleName(instanceID string) string { return "instance:" + instanceID }

// InstanceOfConsole reads an instance id back from a console name.
func InstanceOfConsole(name string) (string, bool) { return strings.CutPrefix(name, "instance:") }
