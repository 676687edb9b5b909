package vps

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/vps/hostapi"
)

// An instance's cloud-init NoCloud seed: meta-data (its id and hostname), user-data (the
// tenant's, passed through as given) and network-config version 2 (its NICs' static addresses,
// matched by MAC). The control plane renders it into the desired state (hostapi.CloudInit); the
// host writes the three files to a volume labelled cidata. The instance side calls
//
//	seed := cloudInit(i.ID, i.Name, userData, nics) // in desiredInstances
//
// and ValidateUserData in instances.create's input check.

// MaxUserData is the largest user-data accepted, in bytes.
const MaxUserData = 64 << 10

// ValidateUserData checks an instance's user-data: UTF-8 text (a #cloud-config document, a
// script, a MIME multipart) of at most MaxUserData bytes. It is passed to the guest unchanged.
func ValidateUserData(field, s string) error {
	if len(s) > MaxUserData {
		return api.InvalidField(field, "is %d bytes; the limit is %d", len(s), MaxUserData)
	}
	if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
		return api.InvalidField(field, "is not text: user-data is UTF-8 (a #cloud-config document or a script), without NUL")
	}
	return nil
}

// cloudInit renders an instance's NoCloud seed. Its NICs are named eth0, eth1, … in order and
// matched by MAC; the first NIC with a gateway (of each family) has the default route, as a
// guest has one default route.
func cloudInit(instanceID, hostname, userData string, nics []hostapi.NIC) *hostapi.CloudInit {
	return &hostapi.CloudInit{
		MetaData:      "instance-id: " + yamlString(instanceID) + "\nlocal-hostname: " + yamlString(hostname) + "\n",
		UserData:      userData,
		NetworkConfig: networkConfig(nics),
	}
}

// networkConfig renders cloud-init's network-config version 2 (netplan's format). Every value is
// a double-quoted YAML string, so that a MAC is not read as a number in base 60.
func networkConfig(nics []hostapi.NIC) string {
	var b strings.Builder
	b.WriteString("version: 2\n")
	if len(nics) == 0 {
		b.WriteString("ethernets: {}\n")
		return b.String()
	}
	b.WriteString("ethernets:\n")
	var route4, route6 bool
	for i, n := range nics {
		name := fmt.Sprintf("eth%d", i)
		fmt.Fprintf(&b, "  %s:\n    match:\n      macaddress: %s\n    set-name: %s\n", name, yamlString(n.MAC), yamlString(name))
		b.WriteString("    dhcp4: false\n    dhcp6: false\n")
		list(&b, "    addresses:\n", "      - ", n.Addresses)
		// gateway4/gateway6 rather than routes: cloud-init 22.4 (Debian 12's) renders a route
		// to ::/0 as one to ::/64, and netplan only warns that these keys are old.
		if n.Gateway != "" && !route4 {
			route4 = true
			b.WriteString("    gateway4: " + yamlString(n.Gateway) + "\n")
		}
		if n.Gateway6 != "" && !route6 {
			route6 = true
			b.WriteString("    gateway6: " + yamlString(n.Gateway6) + "\n")
		}
		if len(n.DNS) > 0 {
			b.WriteString("    nameservers:\n")
			list(&b, "      addresses:\n", "        - ", n.DNS)
		}
	}
	return b.String()
}

func list(b *strings.Builder, head, item string, values []string) {
	if len(values) == 0 {
		return
	}
	b.WriteString(head)
	for _, v := range values {
		b.WriteString(item + yamlString(v) + "\n")
	}
}

// yamlString is s as a double-quoted YAML scalar: JSON's string syntax is a subset of it.
func yamlString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
