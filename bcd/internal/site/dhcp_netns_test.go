package site

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/pin/tftp/v3"

	"github.com/better-compute/compute/metal/siteapi"
)

// discover broadcasts a DHCPDISCOVER from the machine's namespace as mac, with mods, and
// returns the first offer (nil when none came).
func (n *netns) discover(t *testing.T, mac string, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	var c *nclient4.Client
	must(t, n.inMachine(func() (err error) {
		c, err = nclient4.New("mach0", nclient4.WithHWAddr(hw(mac)), nclient4.WithTimeout(time.Second), nclient4.WithRetry(2)) // an answer late under load is still an answer
		return err
	}))
	defer c.Close()
	offer, err := c.DiscoverOffer(context.Background(), mods...)
	if errors.Is(err, nclient4.ErrNoResponse) {
		return nil
	}
	must(t, err)
	return offer
}

func pxeMods(arch iana.Arch, more ...dhcpv4.Modifier) []dhcpv4.Modifier {
	return append([]dhcpv4.Modifier{
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00000:UNDI:002001")),
		dhcpv4.WithOption(dhcpv4.OptClientArch(arch)),
	}, more...)
}

func busybox(t *testing.T) string {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("skipped: busybox is not installed (Debian package busybox)")
	}
	return bb
}

// TestProxyDHCPInNamespaces: proxy DHCP over a real link, to the library's client: nothing
// before the first plan; then, per the plan, iPXE by architecture with the site as next-server
// and no address, the script's URL to iPXE, nothing to an unknown machine under ignore or a
// client that is no PXE one, and the same boot file in the ack on port 4011. Then a machine's
// whole chain with busybox: the offer's file over TFTP, the script over HTTP, the kernel it
// names.
func TestProxyDHCPInNamespaces(t *testing.T) {
	t.Parallel()
	n := newNetns(t)
	mustIP(t, "-n", n.machine, "addr", "add", nsMachine.String()+"/24", "dev", "mach0") // another DHCP server's lease
	site := n.startSite(t, DHCPConfig{Mode: DHCPProxy})
	base := site.addrs.BaseURL

	if offer := n.discover(t, macRamdisk, pxeMods(iana.INTEL_X86PC)...); offer != nil {
		t.Fatalf("an offer before the first plan: %s", offer.Summary())
	}
	site.setPlan(t, testPlan(siteapi.UnknownIgnore))

	for _, c := range []struct {
		name string
		mac  string
		mods []dhcpv4.Modifier
		file string // "": no offer
	}{
		{"BIOS", macRamdisk, pxeMods(iana.INTEL_X86PC), BIOSBinary},
		{"UEFI", macRamdisk, pxeMods(iana.EFI_X86_64), EFIBinarySNP},
		{"UEFI BC", macDisk, pxeMods(iana.EFI_BC), EFIBinarySNP},
		{"iPXE", macRamdisk, pxeMods(iana.INTEL_X86PC, dhcpv4.WithOption(dhcpv4.OptUserClass("iPXE"))), base + "/boot/ipxe?mac=" + macRamdisk},
		{"unknown, ignored", macUnknown, pxeMods(iana.INTEL_X86PC), ""},
		{"not PXE", macRamdisk, nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.file == "" {
				// No offer takes nclient4's timeouts to show: these wait side by side, after
				// the rest (the parent's function) is done.
				t.Parallel()
			}
			offer := n.discover(t, c.mac, c.mods...)
			if c.file == "" {
				if offer != nil {
					t.Fatalf("offer: %s", offer.Summary())
				}
				return
			}
			if offer == nil {
				t.Fatal("no offer")
			}
			if offer.BootFileName != c.file || !offer.ServerIPAddr.Equal(nsSite.AsSlice()) || !offer.YourIPAddr.IsUnspecified() ||
				offer.ClassIdentifier() != "PXEClient" || !offer.ServerIdentifier().Equal(nsSite.AsSlice()) {
				t.Errorf("offer: file %q next-server %v address %v class %q server %v; want %q, %v, none, PXEClient, %v",
					offer.BootFileName, offer.ServerIPAddr, offer.YourIPAddr, offer.ClassIdentifier(), offer.ServerIdentifier(), c.file, nsSite, nsSite)
			}
		})
	}

	// The client asks the proxy again on 4011, from the address it has.
	t.Run("4011", func(t *testing.T) {
		var c *nclient4.Client
		must(t, n.inMachine(func() (err error) {
			c, err = nclient4.New("mach0", nclient4.WithHWAddr(hw(macRamdisk)),
				nclient4.WithUnicast(&net.UDPAddr{IP: nsMachine.AsSlice(), Port: dhcpv4.ClientPort}),
				nclient4.WithServerAddr(&net.UDPAddr{IP: nsSite.AsSlice(), Port: pxePort}),
				nclient4.WithTimeout(2*time.Second), nclient4.WithRetry(2))
			return err
		}))
		defer c.Close()
		req, err := dhcpv4.New(append(pxeMods(iana.EFI_X86_64), dhcpv4.WithHwAddr(hw(macRamdisk)),
			dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithClientIP(nsMachine.AsSlice()))...)
		must(t, err)
		ack, err := c.SendAndRead(context.Background(), c.RemoteAddr(), req, nclient4.IsMessageType(dhcpv4.MessageTypeAck))
		if err != nil {
			t.Fatalf("no ack on 4011: %v", err)
		}
		if ack.BootFileName != EFIBinarySNP || !ack.ServerIPAddr.Equal(nsSite.AsSlice()) {
			t.Errorf("ack: file %q next-server %v", ack.BootFileName, ack.ServerIPAddr)
		}
	})

	// TFTP from the machine's namespace: the library's client, and busybox's.
	t.Run("tftp", func(t *testing.T) {
		var got bytes.Buffer
		must(t, n.inMachine(func() error {
			c, err := tftp.NewClient(netip.AddrPortFrom(nsSite, 69).String())
			if err != nil {
				return err
			}
			c.SetTimeout(time.Second)
			wt, err := c.Receive(BIOSBinary, "octet")
			if err != nil {
				return err
			}
			_, err = wt.WriteTo(&got)
			return err
		}))
		if !bytes.Equal(got.Bytes(), biosBytes) {
			t.Errorf("tftp: %d bytes, want %d", got.Len(), len(biosBytes))
		}
	})

	t.Run("busybox chain", func(t *testing.T) {
		bb := busybox(t)
		offer := n.discover(t, macRamdisk, pxeMods(iana.INTEL_X86PC)...)
		if offer == nil {
			t.Fatal("no offer")
		}
		local := filepath.Join(t.TempDir(), "nbp")
		if out, err := n.run(t, bb, "tftp", "-g", "-r", offer.BootFileName, "-l", local, offer.ServerIPAddr.String()); err != nil {
			t.Fatalf("busybox tftp: %v: %s", err, out)
		}
		if b, _ := os.ReadFile(local); !bytes.Equal(b, biosBytes) {
			t.Errorf("the boot file fetched is %d bytes, want iPXE's %d", len(b), len(biosBytes))
		}
		// The site heard the machine's address at its request on 4011 (above): the script it
		// gives that address boots the ramdisk with a token.
		ipxe := n.discover(t, macRamdisk, pxeMods(iana.INTEL_X86PC, dhcpv4.WithOption(dhcpv4.OptUserClass("iPXE")))...)
		if ipxe == nil {
			t.Fatal("no offer to iPXE")
		}
		script, err := n.run(t, bb, "wget", "-q", "-O", "-", ipxe.BootFileName)
		if err != nil {
			t.Fatalf("busybox wget %s: %v: %s", ipxe.BootFileName, err, script)
		}
		var kernel string
		for _, l := range strings.Split(script, "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[0] == "kernel" {
				kernel = f[1]
				if !strings.Contains(l, "bcd.machine=m-ramdisk bcd.token=") {
					t.Errorf("kernel line %q lacks the machine and its token", l)
				}
			}
		}
		if kernel == "" {
			t.Fatalf("the script boots no kernel:\n%s", script)
		}
		out, err := n.run(t, bb, "wget", "-q", "-O", "-", kernel)
		if err != nil || out != string(kernelBytes) {
			t.Errorf("busybox wget %s: %v, %d bytes, want the kernel's %d", kernel, err, len(out), len(kernelBytes))
		}
	})
}

// TestFullDHCPInNamespaces: full DHCP over a real link: busybox udhcpc gets an address with the
// network's mask, router and lease time; as a PXE client (vendor class, architecture) the same
// address and the boot file; the library's client a second address; an unknown PXE client the
// plan ignores an address without a boot file.
func TestFullDHCPInNamespaces(t *testing.T) {
	t.Parallel()
	n := newNetns(t)
	site := n.startSite(t, DHCPConfig{Mode: DHCPFull, Subnet: netip.MustParsePrefix("192.0.2.0/24"),
		RangeStart: netip.MustParseAddr("192.0.2.100"), RangeEnd: netip.MustParseAddr("192.0.2.110"),
		Router: nsSite, LeaseTime: 10 * time.Minute})
	site.setPlan(t, testPlan(siteapi.UnknownIgnore))

	t.Run("udhcpc", func(t *testing.T) {
		bb := busybox(t)
		script := filepath.Join(t.TempDir(), "udhcpc.sh")
		must(t, os.WriteFile(script, []byte(`#!/bin/sh
[ "$1" = bound ] && echo "BOUND ip=$ip subnet=$subnet router=$router lease=$lease siaddr=$siaddr boot_file=$boot_file"
exit 0
`), 0o755))
		udhcpc := func(args ...string) map[string]string {
			t.Helper()
			out, err := n.run(t, bb, append([]string{"udhcpc", "-i", "mach0", "-f", "-q", "-n", "-t", "4", "-T", "1", "-s", script}, args...)...)
			if err != nil {
				t.Fatalf("udhcpc: %v: %s", err, out)
			}
			_, bound, ok := strings.Cut(out, "BOUND ")
			if !ok {
				t.Fatalf("udhcpc bound no lease: %s", out)
			}
			kv := map[string]string{}
			for _, f := range strings.Fields(strings.SplitN(bound, "\n", 2)[0]) {
				k, v, _ := strings.Cut(f, "=")
				kv[k] = v
			}
			return kv
		}
		got := udhcpc()
		want := map[string]string{"ip": "192.0.2.100", "subnet": "255.255.255.0", "router": "192.0.2.1", "lease": "600", "boot_file": ""}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("udhcpc: %s=%q, want %q (all: %v)", k, got[k], v, got)
			}
		}
		got = udhcpc("-V", "PXEClient:Arch:00007:UNDI:003016", "-x", "0x5d:0007")
		want = map[string]string{"ip": "192.0.2.100", "siaddr": "192.0.2.1", "boot_file": EFIBinarySNP}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("udhcpc as UEFI PXE: %s=%q, want %q (all: %v)", k, got[k], v, got)
			}
		}
	})

	t.Run("nclient4", func(t *testing.T) {
		var c *nclient4.Client
		must(t, n.inMachine(func() (err error) {
			c, err = nclient4.New("mach0", nclient4.WithHWAddr(hw(macIdle)), nclient4.WithTimeout(2*time.Second), nclient4.WithRetry(2))
			return err
		}))
		defer c.Close()
		lease, err := c.Request(context.Background())
		if err != nil {
			t.Fatalf("request: %v", err)
		}
		if a := addrFromIP(lease.ACK.YourIPAddr); !a.IsValid() || a.Less(netip.MustParseAddr("192.0.2.100")) || netip.MustParseAddr("192.0.2.110").Less(a) {
			t.Errorf("leased %v, want an address of the range", lease.ACK.YourIPAddr)
		}
		if lease.ACK.BootFileName != "" {
			t.Errorf("a client that is no PXE one got boot file %q", lease.ACK.BootFileName)
		}

		offer := n.discover(t, macUnknown, pxeMods(iana.INTEL_X86PC)...)
		if offer == nil || offer.YourIPAddr.IsUnspecified() || offer.BootFileName != "" {
			t.Errorf("unknown PXE client under ignore: %v, want an address and no boot file", offer)
		}
	})
}
