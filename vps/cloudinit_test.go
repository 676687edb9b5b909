package vps

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/vps/hostapi"
)

var update = flag.Bool("update", false, "rewrite the golden files of the cloud-init tests")

// seeds are the golden tests' instances: a NIC on an untagged IPv4 network; two NICs, the
// first dual-stack behind a link-local IPv6 gateway, the second on a VLAN (only the first has
// the default routes); no NIC, with a user-data script passed through.
var seeds = []struct {
	name     string
	hostname string
	userData string
	nics     []hostapi.NIC
}{
	{"one-nic", "web-1", "#cloud-config\npackages: [nginx]\n", []hostapi.NIC{
		{MAC: "02:5e:00:00:00:01", Bridge: "br0", Addresses: []string{"10.20.0.5/24"}, Gateway: "10.20.0.1", DNS: []string{"10.20.0.1"}},
	}},
	{"two-nics", "db-1", "#cloud-config\n{}\n", []hostapi.NIC{
		{MAC: "02:5e:00:00:00:02", Bridge: "br0", Addresses: []string{"10.20.0.6/24", "2001:db8:20::6/64"}, Gateway: "10.20.0.1", Gateway6: "fe80::1",
			DNS: []string{"1.1.1.1", "2606:4700:4700::1111"}},
		{MAC: "02:5e:00:00:00:03", Bridge: "br100", VLAN: 100, Addresses: []string{"192.168.100.9/24"}, Gateway: "192.168.100.1"},
	}},
	{"no-nics", "batch-7", "#!/bin/sh\necho \"it's me\" > /tmp/hello\n", nil},
}

// TestCloudInitGolden renders each seed's three NoCloud files and compares them with
// testdata/cloudinit/<seed>/ (go test -run TestCloudInitGolden -update rewrites them).
func TestCloudInitGolden(t *testing.T) {
	t.Parallel()
	for i, s := range seeds {
		t.Run(s.name, func(t *testing.T) {
			got := cloudInit(fmt.Sprintf("0190a0b0-0000-7000-8000-%012d", i), s.hostname, s.userData, s.nics)
			for file, content := range map[string]string{"meta-data": got.MetaData, "user-data": got.UserData, "network-config": got.NetworkConfig} {
				path := filepath.Join("testdata", "cloudinit", s.name, file)
				if *update {
					if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
						t.Fatal(err)
					}
					continue
				}
				want, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("%v (go test -run TestCloudInitGolden -update writes it)", err)
				}
				if content != string(want) {
					t.Errorf("%s differs from %s:\n--- got\n%s--- want\n%s", file, path, content, want)
				}
			}
			if got.UserData != s.userData {
				t.Errorf("user-data was changed: %q, want %q as given", got.UserData, s.userData)
			}
		})
	}
}

// TestCloudInitNetworkConfigIsReadByCloudInit gives each seed's network-config to cloud-init
// itself (cloud-init devel net-convert, rendering systemd-networkd files as a Debian guest
// would) and checks what it made of it: each NIC matched by its MAC and named in order, its
// addresses, the default routes on the first NIC only, the resolvers.
func TestCloudInitNetworkConfigIsReadByCloudInit(t *testing.T) {
	t.Parallel()
	bin, err := exec.LookPath("cloud-init")
	if err != nil {
		t.Skip("cloud-init is not installed (Debian cloud-init; .ci/run installs it): the network-config is checked by the golden files only")
	}
	for _, s := range seeds {
		t.Run(s.name, func(t *testing.T) {
			dir := t.TempDir()
			in := filepath.Join(dir, "network-config")
			if err := os.WriteFile(in, []byte(cloudInit("i-1", s.hostname, "", s.nics).NetworkConfig), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(bin, "devel", "net-convert", "-p", in, "-k", "yaml", "-D", "debian", "-d", filepath.Join(dir, "out"), "-O", "networkd").CombinedOutput()
			if err != nil {
				t.Fatalf("cloud-init refused the network-config: %v\n%s", err, out)
			}
			for i, n := range s.nics {
				name := "eth" + string(rune('0'+i))
				b, err := os.ReadFile(filepath.Join(dir, "out", "etc", "systemd", "network", "10-cloud-init-"+name+".network"))
				if err != nil {
					t.Fatalf("cloud-init made no networkd file for %s: %v", name, err)
				}
				unit := string(b)
				want := []string{"MACAddress=" + n.MAC, "Name=" + name, "DHCP=no"}
				for _, a := range n.Addresses {
					want = append(want, "Address="+a)
				}
				want = append(want, n.DNS...)
				if i == 0 {
					for _, gw := range []string{n.Gateway, n.Gateway6} {
						if gw != "" {
							want = append(want, "Gateway="+gw)
						}
					}
				} else if strings.Contains(unit, "Gateway=") {
					t.Errorf("%s has a gateway: only the first NIC has the default routes\n%s", name, unit)
				}
				for _, w := range want {
					if !strings.Contains(unit, w) {
						t.Errorf("%s's networkd file lacks %q:\n%s", name, w, unit)
					}
				}
			}
		})
	}
}

// TestValidateUserData: text up to the limit passes unchanged; binary, NUL and too much are
// refused, naming the field.
func TestValidateUserData(t *testing.T) {
	t.Parallel()
	if err := ValidateUserData("userData", "#cloud-config\n"+strings.Repeat("#", MaxUserData-14)); err != nil {
		t.Errorf("user-data of exactly the limit: %v", err)
	}
	for _, bad := range []string{strings.Repeat("x", MaxUserData+1), "\x1f\x8b\x08\x00\xff", "#!/bin/sh\x00"} {
		if err := ValidateUserData("userData", bad); api.CodeOf(err) != api.CodeInvalidArgument || !strings.HasPrefix(err.Error(), "invalid_argument: userData") {
			t.Errorf("ValidateUserData(%.20q) = %v, want invalid_argument naming userData", bad, err)
		}
	}
}
