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
	// KindHost announces the host's VM runtime and whether it answers: when the agent starts,
	// and whenever that changes.
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
	ID string `json:"id"`
	// Tenant is the tenant whose image the instance boots. The host keeps what each tenant
	// fetched apart: a tenant boots bytes from its cache only once it has fetched them from its
	// own URL and they matched (a checksum alone names bytes, it does not prove the tenant may
	// have them). An instance without one (from a control plane that does not send it) fetches
	// its images for itself.
	Tenant    string    `json:"tenant,omitempty"`
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
	// Env is given to the guest on a kernel's command line, as bc.env=<base64url of its JSON>
	// (a sandbox template's env); an image that boots from its disk alone does not get it.
	Env map[string]string `json:"env,omitempty"`
	// Snapshots are the ids of the saved states (memory and disk) the host should keep of it:
	// one missing is saved now, one no longer listed is removed.
	Snapshots []string `json:"snapshots,omitempty"`
	// Restore, when its Serial grows past the restores the host has done, puts the instance
	// back to the state of one of its snapshots.
	Restore *Restore `json:"restore,omitempty"`
	// Agent asks for the instance's second serial port, served to access.console as
	// AgentName(id): a sandbox's SSH.
	Agent bool `json:"agent,omitempty"`
	// SSHRevoked, with Agent, is an OpenSSH KRL of the certificates the guest must refuse (its
	// reservation's revoked ones): the host hands the guest the latest before each SSH
	// connection it relays (docs/sandboxes.md).
	SSHRevoked []byte `json:"sshRevoked,omitempty"`
	// ReadyLine, on a warm instance, is what its guest prints on its serial console once it is
	// ready: the host watches the console from its boot and reports Ready when it sees it.
	ReadyLine string `json:"readyLine,omitempty"`
	NICs      []NIC  `json:"nics,omitempty"` // in order: the first is the guest's eth0
	// CloudInit is the instance's NoCloud seed, when it has one.
	CloudInit *CloudInit `json:"cloudInit,omitempty"`
	// Reservation is the instance's reservation: the host serves its consoles to tickets of it
	// alone (access.console). An instance without one serves its consoles to nobody.
	Reservation string `json:"reservation,omitempty"`
}

// Restore asks for an instance to be put back to a snapshot.
type Restore struct {
	Snapshot string `json:"snapshot"`
	Serial   int    `json:"serial"`
}

// ValidSHA256 reports whether s is a SHA-256 as an Artifact gives it: 64 lower-case hex digits.
func ValidSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// Artifact is a file to fetch, checked by its SHA-256.
type Artifact struct {
	URL    string `json:"url"`
	SHA256 string `json:"sha256"`
}

// NIC is one network interface of an instance: the segment its host plugs it into, and the
// addresses its guest is told (through CloudInit.NetworkConfig).
type NIC struct {
	Network string `json:"network"` // the network's id
	MAC     string `json:"mac"`     // locally administered, fixed for the instance's life
	Bridge  string `json:"bridge"`  // the host bridge it plugs into
	// VLAN is the VLAN the bridge carries (0: untagged). A Linux bridge carries it through a
	// VLAN sub-interface of the host's uplink as its port (vps/hostnet), and the NIC is
	// plugged in untagged.
	VLAN      int      `json:"vlan,omitempty"`
	Addresses []string `json:"addresses"` // with the network's prefix length: 10.20.0.7/24, 2001:db8::7/64
	Gateway   string   `json:"gateway,omitempty"`
	Gateway6  string   `json:"gateway6,omitempty"`
	DNS       []string `json:"dns,omitempty"`
}

// CloudInit is an instance's NoCloud seed (cloud-init's datasource): the three files its host
// writes to a small volume labelled "cidata" that the guest finds at boot.
type CloudInit struct {
	MetaData      string `json:"metaData"`      // the file meta-data
	UserData      string `json:"userData"`      // user-data, as the tenant gave it
	NetworkConfig string `json:"networkConfig"` // network-config, version 2
}

// Host is the payload of KindHost.
type Host struct {
	Runtime string `json:"runtime"` // libvirt-kvm, cloud-hypervisor
	// Unreachable, when set, is why the host cannot reach its runtime (libvirtd not running,
	// its socket refusing): the host is then no place for VMs. Empty: the runtime answered
	// (a host that predates the field never says otherwise).
	Unreachable string `json:"unreachable,omitempty"`
}

// MaxUnreachable bounds Host.Unreachable: a longer reason is cut.
const MaxUnreachable = 1024

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
	// Snapshots are the saved states the host has of it; SnapshotErrors those it could not
	// save (or restore), and why.
	Snapshots      []string          `json:"snapshots,omitempty"`
	SnapshotErrors map[string]string `json:"snapshotErrors,omitempty"`
	Restores       int               `json:"restores,omitempty"` // the restores done
	Ready          bool              `json:"ready,omitempty"`    // its console printed its ReadyLine
}

// ConsoleName is the name of an instance's serial console among its host's consoles
// (access.console's console).
func ConsoleName(instanceID string) string { return "instance:" + instanceID }

// InstanceOfConsole reads an instance id back from a console name.
func InstanceOfConsole(name string) (string, bool) { return strings.CutPrefix(name, "instance:") }

// AgentName is the name of an instance's second serial port among its host's consoles: a
// sandbox's guest serves SSH on it.
func AgentName(instanceID string) string { return "agent:" + instanceID }

// InstanceOfAgent reads an instance id back from an agent port's name.
func InstanceOfAgent(name string) (string, bool) { return strings.CutPrefix(name, "agent:") }
