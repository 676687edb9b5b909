// Package siteapi is the contract between the metal module, bcd site and bcd ramdisk: the plan
// the control plane gives a site agent (the desired-state part metal.site), what the site agent
// reports back over its session, and the HTTP API a machine's ramdisk speaks with its site
// agent on the provisioning network. It imports only the standard library, so that bcd's site
// and ramdisk halves carry none of the control plane.
//
// The flow of a machine: it PXE-boots; bcd site answers its DHCP (proxy DHCP, or full DHCP in a
// small lab) with iPXE, then an iPXE script chosen by the plan (BootRamdisk: the site's kernel and
// initramfs holding bcd ramdisk; BootDisk: the next boot device). bcd ramdisk says Hello with the
// machine's facts (the site reports them up as KindMachineSeen: a join request, or the facts of
// a known machine), asks for its Task, carries it out (wipe, stream an image from the site's
// cache with its checksum verified, boot it) and posts Progress (reported up as
// KindTaskProgress), which the control plane's workflows wait on.
//
// Every request of a ramdisk bears its boot's token (CmdlineToken): the site mints one each
// time it serves a machine's ramdisk script, for the MAC the script is for and the address the
// site saw that MAC leased, and takes it only from that address, until the MAC boots again
// (docs/site.md, "Trust"). A deploy's join credential is not in the task the ramdisk reads: the
// ramdisk asks for it, once, at PathCredential.
package siteapi

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// PlanKind is the desired-state kind of a site agent's plan, at PlanVersion.
const (
	PlanKind    = "metal.site"
	PlanVersion = 2 // 2: no token per machine (sites mint boot tokens); Task.JoinCredential
)

// What an unknown machine (a MAC no plan lists) is told when it PXE-boots at the site.
const (
	UnknownInspect = "inspect" // boot the ramdisk, which reports the machine: a join request
	UnknownIgnore  = "ignore"  // no answer: it boots from its next device
)

// How a machine of the plan boots.
const (
	BootRamdisk = "ramdisk" // the site's kernel and initramfs, with bcd ramdisk
	BootDisk    = "disk"    // its own disk: iPXE exits to the next boot device
)

// Plan is what the control plane wants of a site agent: the machines it boots and their tasks,
// and the images it keeps in its cache. It is sent whole (the desired-state part metal.site) at
// every change, so a site agent replaces its plan rather than merging.
type Plan struct {
	Site     string        `json:"site"`    // the site's id
	Unknown  string        `json:"unknown"` // UnknownInspect or UnknownIgnore
	Machines []PlanMachine `json:"machines"`
	Images   []Image       `json:"images"`
}

// PlanMachine is one machine the site agent knows.
type PlanMachine struct {
	ID   string   `json:"id"`
	MACs []string `json:"macs"`           // lowercase aa:bb:cc:dd:ee:ff
	Boot string   `json:"boot"`           // BootRamdisk or BootDisk
	Task *Task    `json:"task,omitempty"` // nil: the ramdisk waits
}

// The kinds of task.
const (
	TaskInspect = "inspect" // report the facts again, then wait
	TaskWipe    = "wipe"    // erase the disks' signatures and partition tables, then Then
	TaskDeploy  = "deploy"  // wipe, stream Image to Disk verifying its SHA-256, then Then
)

// What the ramdisk does after a task.
const (
	ThenWait     = "wait"     // ask for the next task
	ThenKexec    = "kexec"    // boot the deployed system's kernel in place (Kernel, Initrd, Cmdline)
	ThenReboot   = "reboot"   // reboot (the plan then says BootDisk)
	ThenPowerOff = "poweroff" // power the machine off
)

// Task is what a machine's ramdisk is asked to do.
type Task struct {
	ID    string `json:"id"` // unique: progress is reported against it
	Kind  string `json:"kind"`
	Image *Image `json:"image,omitempty"` // TaskDeploy
	// Disk is the block device to write ("/dev/vda"); empty is the largest non-removable disk.
	Disk string `json:"disk,omitempty"`
	Then string `json:"then"`
	// With ThenKexec: the deployed system's kernel and initramfs, as http URLs (the image's,
	// registered with it, as a partition image's kernel is), and the command line to boot them
	// with, which carries what the deployed system needs to join (its join token and the control
	// plane's URL) and where its root is (the disk just written).
	Kernel  string `json:"kernel,omitempty"`
	Initrd  string `json:"initrd,omitempty"`
	Cmdline string `json:"cmdline,omitempty"`
	// JoinCredential, with ThenKexec, is the deployed system's one-use join credential, which
	// the ramdisk puts on Cmdline as CmdlineJoin. A site never gives it in the task a ramdisk
	// reads: it hands it over at PathCredential, to one boot of the machine only.
	JoinCredential string `json:"joinCredential,omitempty"`
}

// Image is an image in a site's cache: fetched from URL once, verified against SHA256 and
// SizeBytes, and served to ramdisks at /images/<sha256>.
type Image struct {
	ID        string `json:"id"`
	URL       string `json:"url"`
	Format    string `json:"format"` // raw (qcow2 and tar are not streamed yet)
	SizeBytes int64  `json:"sizeBytes"`
	SHA256    string `json:"sha256"`
	// Authorization is the HTTP Authorization header to fetch URL with (an image pull token,
	// write-only on the control plane), in the plan's Images only: a site agent sends it to
	// URL and to nothing else, and never gives it to a ramdisk.
	Authorization string `json:"authorization,omitempty"`
}

// Reports a site agent sends up its session (the payloads below, JSON).
const (
	KindMachineSeen  = "metal.machine_seen"  // MachineSeen
	KindTaskProgress = "metal.task_progress" // Progress
	KindImageCached  = "metal.image_cached"  // ImageState
)

// MachineSeen is a ramdisk's Hello, reported up: a machine the plan lists (Machine set) or an
// unknown one, with its facts.
type MachineSeen struct {
	Machine string `json:"machine,omitempty"`
	Facts   Facts  `json:"facts"`
}

// Phases of a task's progress.
const (
	PhaseStarted  = "started"
	PhaseWipe     = "wipe"
	PhaseDownload = "download" // bytes of the image read and written so far
	PhaseVerify   = "verify"
	PhaseBoot     = "boot" // the ramdisk is about to kexec, reboot or power off
	PhaseDone     = "done"
	PhaseFailed   = "failed"
)

// Progress is how far a machine's task has gone, posted by its ramdisk and reported up.
type Progress struct {
	Machine string `json:"machine"`
	Task    string `json:"task"`
	Phase   string `json:"phase"`
	Bytes   int64  `json:"bytes,omitempty"`
	Total   int64  `json:"total,omitempty"`
	Error   string `json:"error,omitempty"` // PhaseFailed
}

// ImageState is a site's cache of one image.
type ImageState struct {
	SHA256 string `json:"sha256"`
	State  string `json:"state"` // ImageCached or ImageFailed
	Error  string `json:"error,omitempty"`
}

// The states of an image in a site's cache (ImageState.State).
const (
	ImageCached = "cached" // downloaded and verified: served at /images/<sha256>
	ImageFailed = "failed" // not cached (Error says why); the site retries while the plan names it
)

// Facts are what a machine's ramdisk finds of it: untrusted input, checked by Validate.
type Facts struct {
	Serial     string   `json:"serial"`
	MACs       []string `json:"macs"`
	BMCAddress string   `json:"bmcAddress,omitempty"`
	Vendor     string   `json:"vendor,omitempty"`
	Model      string   `json:"model,omitempty"`
	CPUs       int      `json:"cpus,omitempty"`
	MemoryGiB  int      `json:"memoryGiB,omitempty"`
	Disks      []string `json:"disks,omitempty"` // e.g. "nvme0n1 3.8T"
	GPUs       []string `json:"gpus,omitempty"`  // e.g. "10de:2330 0000:17:00.0"
}

var macRE = regexp.MustCompile(`^([0-9a-f]{2}:){5}[0-9a-f]{2}$`)

// ValidMAC reports whether s is a MAC address as the plan and the facts write them.
func ValidMAC(s string) bool { return macRE.MatchString(s) }

// FieldError names the field of a report or request that is wrong.
type FieldError struct{ Field, Problem string }

func (e *FieldError) Error() string { return e.Field + ": " + e.Problem }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Problem: fmt.Sprintf(format, args...)}
}

// Validate checks facts as a machine reported them.
func (f Facts) Validate() error {
	if f.Serial == "" || len(f.Serial) > 128 || !text(f.Serial) {
		return fieldErr("facts.serial", "is required, printable, at most 128 bytes")
	}
	if len(f.MACs) == 0 || len(f.MACs) > 64 {
		return fieldErr("facts.macs", "must list the machine's 1 to 64 MAC addresses")
	}
	for _, m := range f.MACs {
		if !ValidMAC(m) {
			return fieldErr("facts.macs", "%q is not a MAC address (aa:bb:cc:dd:ee:ff, lowercase)", m)
		}
	}
	if len(f.Disks) > 64 || len(f.GPUs) > 64 {
		return fieldErr("facts", "at most 64 disks and 64 GPUs")
	}
	for _, s := range append(append([]string{f.BMCAddress, f.Vendor, f.Model}, f.Disks...), f.GPUs...) {
		if len(s) > 256 || !text(s) {
			return fieldErr("facts", "a value is longer than 256 bytes or not printable text")
		}
	}
	if f.CPUs < 0 || f.MemoryGiB < 0 {
		return fieldErr("facts", "cpus and memoryGiB must not be negative")
	}
	return nil
}

// Validate checks progress as a ramdisk posted it.
func (p Progress) Validate() error {
	switch {
	case p.Machine == "" || len(p.Machine) > 64 || !text(p.Machine):
		return fieldErr("machine", "is required")
	case p.Task == "" || len(p.Task) > 128 || !text(p.Task):
		return fieldErr("task", "is required")
	case !oneOf(p.Phase, PhaseStarted, PhaseWipe, PhaseDownload, PhaseVerify, PhaseBoot, PhaseDone, PhaseFailed):
		return fieldErr("phase", "%q is not a phase", p.Phase)
	case p.Bytes < 0 || p.Total < 0 || (p.Total > 0 && p.Bytes > p.Total):
		return fieldErr("bytes", "must be between 0 and total")
	case len(p.Error) > 2048 || !text(p.Error):
		return fieldErr("error", "at most 2048 bytes of text")
	}
	return nil
}

// Validate checks a plan as a site agent received it.
func (p Plan) Validate() error {
	if !oneOf(p.Unknown, UnknownInspect, UnknownIgnore) {
		return fieldErr("unknown", "%q is neither %s nor %s", p.Unknown, UnknownInspect, UnknownIgnore)
	}
	seen := map[string]string{}
	for i, m := range p.Machines {
		field := fmt.Sprintf("machines[%d]", i)
		if m.ID == "" {
			return fieldErr(field+".id", "is required")
		}
		if !oneOf(m.Boot, BootRamdisk, BootDisk) {
			return fieldErr(field+".boot", "%q is neither %s nor %s", m.Boot, BootRamdisk, BootDisk)
		}
		for _, mac := range m.MACs {
			if !ValidMAC(mac) {
				return fieldErr(field+".macs", "%q is not a MAC address", mac)
			}
			if other, dup := seen[mac]; dup {
				return fieldErr(field+".macs", "%s is machine %s's too", mac, other)
			}
			seen[mac] = m.ID
		}
		if t := m.Task; t != nil {
			if err := t.Validate(); err != nil {
				return fmt.Errorf("%s.task.%w", field, err)
			}
		}
	}
	for i, im := range p.Images {
		if err := im.Validate(); err != nil {
			return fmt.Errorf("images[%d].%w", i, err)
		}
	}
	return nil
}

// Validate checks a task.
func (t Task) Validate() error {
	switch {
	case t.ID == "":
		return fieldErr("id", "is required")
	case !oneOf(t.Kind, TaskInspect, TaskWipe, TaskDeploy):
		return fieldErr("kind", "%q is not a task kind", t.Kind)
	case t.Kind == TaskDeploy && t.Image == nil:
		return fieldErr("image", "a deploy needs an image")
	case !oneOf(t.Then, ThenWait, ThenKexec, ThenReboot, ThenPowerOff):
		return fieldErr("then", "%q is not what a ramdisk can do next", t.Then)
	case t.Then == ThenKexec && t.Kernel == "":
		return fieldErr("kernel", "kexec needs the kernel to boot")
	case t.Disk != "" && (!strings.HasPrefix(t.Disk, "/dev/") || path.Clean(t.Disk) != t.Disk):
		return fieldErr("disk", "%q is not a clean path under /dev", t.Disk)
	case t.JoinCredential != "" && t.Then != ThenKexec:
		return fieldErr("joinCredential", "only a kexec into the deployed system has one")
	case t.JoinCredential != "" && (len(t.JoinCredential) > 256 || strings.ContainsFunc(t.JoinCredential, func(r rune) bool { return r <= ' ' || r > '~' || r == '"' })):
		return fieldErr("joinCredential", "at most 256 bytes of printable ASCII without spaces or quotes: it goes on a kernel command line")
	}
	if t.Image != nil {
		return t.Image.Validate()
	}
	return nil
}

var sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// ValidSHA256 reports whether s is a SHA-256 as 64 lowercase hex digits.
func ValidSHA256(s string) bool { return sha256RE.MatchString(s) }

// Validate checks an image.
func (im Image) Validate() error {
	switch {
	case !ValidSHA256(im.SHA256):
		return fieldErr("sha256", "must be 64 lowercase hex digits")
	case im.SizeBytes <= 0:
		return fieldErr("sizeBytes", "must be positive")
	case !strings.HasPrefix(im.URL, "http://") && !strings.HasPrefix(im.URL, "https://"):
		return fieldErr("url", "%q is not an http or https URL", im.URL)
	}
	return nil
}

// ErrUnauthorized is a ramdisk request without the token of a current boot.
var ErrUnauthorized = errors.New("siteapi: not the token of a current boot (each boot of a MAC ends the one before)")

func text(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return unicode.IsControl(r) && r != '\n' && r != '\t' })
}

func oneOf(s string, options ...string) bool {
	for _, o := range options {
		if s == o {
			return true
		}
	}
	return false
}

// The ramdisk's HTTP API, served by bcd site on the provisioning network.
const (
	// PathHello: POST Hello, answered with HelloAnswer. The site reports KindMachineSeen.
	PathHello = "/ramdisk/v1/hello"
	// PathTask: GET ?machine=<id>, answered with the machine's Task (200) or 204 while it has
	// none. Authorization: Bearer <token>.
	PathTask = "/ramdisk/v1/task"
	// PathProgress: POST Progress (204). Authorization: Bearer <token>.
	PathProgress = "/ramdisk/v1/progress"
	// PathCredential: POST CredentialRequest, answered with the task's CredentialAnswer (200),
	// 204 when it has no join credential, 410 once another boot of the machine has had it.
	// Authorization: Bearer <token>.
	PathCredential = "/ramdisk/v1/credential"
	// PathImages: GET /images/<sha256>, the image's bytes, once the cache has verified them
	// (404 until then), to a boot whose machine's task deploys it. Authorization: Bearer <token>.
	PathImages = "/images/"
	// PathBoot: GET /boot/ipxe?mac=<mac>, the iPXE script of a machine; /boot/vmlinuz and
	// /boot/initrd, the ramdisk's kernel and initramfs.
	PathBoot = "/boot/"
)

// Hello is what a ramdisk says when it starts (Authorization: Bearer <its boot's token>): the
// facts it found, which list the MAC it booted with, and the machine id its kernel command line
// gave it (bcd.machine=; empty for an unknown machine).
type Hello struct {
	Machine string `json:"machine,omitempty"`
	Facts   Facts  `json:"facts"`
}

// HelloAnswer tells a ramdisk which machine the site takes it for, by the MAC it booted with
// ("" while it is unknown: it has been reported, and says Hello again later; an approved
// machine is known from then on, without a reboot).
type HelloAnswer struct {
	Machine string `json:"machine,omitempty"`
}

// CredentialRequest asks for the join credential of a machine's task (PathCredential).
type CredentialRequest struct {
	Machine string `json:"machine"`
	Task    string `json:"task"`
}

// CredentialAnswer is a task's join credential, for the ramdisk to put on the deployed
// system's command line (CmdlineJoin) before it kexecs it.
type CredentialAnswer struct {
	JoinCredential string `json:"joinCredential"`
}

// The kernel command line parameters the site's iPXE script gives the ramdisk.
const (
	CmdlineSite    = "bcd.site"    // the site agent's base URL, http://10.0.0.1:8067
	CmdlineMachine = "bcd.machine" // the machine's id, absent for an unknown machine
	CmdlineToken   = "bcd.token"   // this boot's token, which every request of the ramdisk bears
	// CmdlineBootIF is the MAC the machine PXE-booted with, as pxelinux gives it (01-aa-bb-cc-
	// dd-ee-ff): the NIC whose lease the site binds the boot's token to, which bcd init asks
	// for a lease first.
	CmdlineBootIF = "BOOTIF"
)

// BootIF is a MAC as CmdlineBootIF writes it.
func BootIF(mac string) string { return "01-" + strings.ReplaceAll(mac, ":", "-") }

// MACOfBootIF is the MAC of a CmdlineBootIF value (lowercase aa:bb:cc:dd:ee:ff); false when it
// is not one.
func MACOfBootIF(v string) (string, bool) {
	mac, ok := strings.CutPrefix(strings.ToLower(v), "01-")
	mac = strings.ReplaceAll(mac, "-", ":")
	return mac, ok && ValidMAC(mac)
}

// The kernel command line parameters a deploy gives the deployed system (Task.Cmdline, booted
// by kexec), which bcd join --cmdline reads.
const (
	CmdlineJoinURL  = "bcd.url"      // the control plane's URL to join at
	CmdlineJoin     = "bcd.join"     // the one-use join credential
	CmdlineHostname = "bcd.hostname" // the node's name: the machine's
	CmdlineSSHKeys  = "bcd.ssh_keys" // base64url of a JSON list of authorized keys (a lease's holder's)
	CmdlineCAHash   = "bcd.ca_hash"  // the machine CA's pin, sha256:<hex>
)
