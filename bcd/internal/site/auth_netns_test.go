package site

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/pin/tftp/v3"

	"github.com/better-compute/compute/metal/siteapi"

	"github.com/better-compute/compute/computetest"
)

// The tenant's network, another link of the site's namespace (TEST-NET-2).
var (
	nsSiteTenant = netip.MustParseAddr("198.51.100.1")
	nsTenant     = netip.MustParseAddr("198.51.100.2")
)

// addTenant makes a third namespace, a network that is not the provisioning one, linked to the
// site's namespace (tenant0 there, 198.51.100.1/24), with a route to the provisioning network
// through the site: what a tenant's network attached to the site's machine looks like.
func (n *netns) addTenant(t *testing.T) string {
	t.Helper()
	ns := strings.TrimSuffix(n.site, "s") + "t"
	t.Cleanup(func() {
		if _, err := os.Stat(filepath.Join("/run/netns", ns)); err == nil {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", ns, err, out)
			}
		}
	})
	mustIP(t, "netns", "add", ns)
	mustIP(t, "link", "add", "name", "tenant0", "netns", n.site, "type", "veth", "peer", "name", "ten0", "netns", ns)
	mustIP(t, "-n", n.site, "addr", "add", nsSiteTenant.String()+"/24", "dev", "tenant0")
	mustIP(t, "-n", ns, "addr", "add", nsTenant.String()+"/24", "dev", "ten0")
	for _, l := range [][2]string{{n.site, "tenant0"}, {ns, "ten0"}, {ns, "lo"}} {
		mustIP(t, "-n", l[0], "link", "set", l[1], "up")
	}
	mustIP(t, "-n", ns, "route", "add", "192.0.2.0/24", "via", nsSiteTenant.String())
	return ns
}

// httpFrom makes one HTTP request from namespace ns, from the address from (any when invalid),
// and returns the answer's status and body; err is the connection's.
func httpFrom(ns string, from netip.Addr, method, url, token string) (int, string, error) {
	return httpDo(ns, from, method, url, token, "")
}

// httpDo is httpFrom with a body (JSON), when not empty.
func httpDo(ns string, from netip.Addr, method, url, token, body string) (int, string, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return 0, "", err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	var conn net.Conn
	err = inNetns(ns, func() (err error) {
		d := net.Dialer{Timeout: 5 * time.Second}
		if from.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: from.AsSlice()}
		}
		conn, err = d.Dial("tcp", req.URL.Host) // the socket is the namespace's for good
		return err
	})
	if err != nil {
		return 0, "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	req.Close = true
	if err := req.Write(conn); err != nil {
		return 0, "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestTheSiteListensOnTheProvisioningNetworkOnly: by default the site's HTTP and TFTP answer on
// its provisioning interface only. From a tenant's network attached to the site's host, neither
// the site's address on that network nor its provisioning address (routed through the host)
// reaches them; the machine on the provisioning network does.
func TestTheSiteListensOnTheProvisioningNetworkOnly(t *testing.T) {
	t.Parallel()
	n := newNetns(t)
	tenant := n.addTenant(t)
	mustIP(t, "-n", n.machine, "addr", "add", nsMachine.String()+"/24", "dev", "mach0")
	site := n.startSite(t, DHCPConfig{Mode: DHCPProxy})
	site.setPlan(t, testPlan(siteapi.UnknownInspect))

	if status, body, err := httpFrom(n.machine, netip.Addr{}, "GET", site.addrs.BaseURL+"/boot/vmlinuz", ""); err != nil || status != 200 || body != string(kernelBytes) {
		t.Fatalf("the machine's GET of the kernel: %d, %d bytes, %v", status, len(body), err)
	}
	for _, host := range []netip.Addr{nsSite, nsSiteTenant} {
		url := fmt.Sprintf("http://%s/boot/ipxe?mac=%s", netip.AddrPortFrom(host, site.addrs.HTTP.Port()), macRamdisk)
		if status, body, err := httpFrom(tenant, netip.Addr{}, "GET", url, ""); err == nil {
			t.Errorf("the tenant's network reached %s: %d %s", url, status, body)
		}
		err := inNetns(tenant, func() error {
			c, err := tftp.NewClient(netip.AddrPortFrom(host, 69).String())
			if err != nil {
				return err
			}
			c.SetTimeout(500 * time.Millisecond)
			c.SetRetries(2)
			_, err = c.Receive(BIOSBinary, "octet")
			return err
		})
		if err == nil {
			t.Errorf("the tenant's network fetched %s over TFTP from %s", BIOSBinary, host)
		}
	}
}

// lease asks the site for an address as mac from the machine's namespace, and configures it on
// mach0, as the machine's firmware and its ramdisk do.
func (n *netns) lease(t *testing.T, mac string) netip.Addr {
	t.Helper()
	var c *nclient4.Client
	must(t, n.inMachine(func() (err error) {
		c, err = nclient4.New("mach0", nclient4.WithHWAddr(hw(mac)), nclient4.WithTimeout(2*time.Second), nclient4.WithRetry(2))
		return err
	}))
	defer c.Close()
	l, err := c.Request(context.Background())
	if err != nil {
		t.Fatalf("DHCP as %s: %v", mac, err)
	}
	a := addrFromIP(l.ACK.YourIPAddr)
	mustIP(t, "-n", n.machine, "addr", "add", a.String()+"/24", "dev", "mach0")
	return a
}

// scriptToken fetches mac's iPXE script from the machine's namespace, from address from, and
// returns it and the boot token on its kernel line ("" when it has none).
func (n *netns) scriptToken(t *testing.T, site *childSite, from netip.Addr, mac string) (script, token string) {
	t.Helper()
	status, body, err := httpFrom(n.machine, from, "GET", site.addrs.BaseURL+"/boot/ipxe?mac="+mac, "")
	if err != nil || status != 200 {
		t.Fatalf("the script of %s from %s: %d %s %v", mac, from, status, body, err)
	}
	if m := tokenRE.FindStringSubmatch(body); m != nil {
		token = m[1]
	}
	return body, token
}

// TestBootTokensAreBoundToTheLease (full DHCP): a machine's ramdisk script, and its boot token,
// are given only to the address the site leased to its MAC; the token works from that address
// only, and only until the MAC's next boot.
func TestBootTokensAreBoundToTheLease(t *testing.T) {
	t.Parallel()
	n := newNetns(t)
	site := n.startSite(t, DHCPConfig{Mode: DHCPFull, Subnet: netip.MustParsePrefix("192.0.2.0/24"),
		RangeStart: netip.MustParseAddr("192.0.2.100"), RangeEnd: netip.MustParseAddr("192.0.2.110"), LeaseTime: 10 * time.Minute})
	site.setPlan(t, testPlan(siteapi.UnknownInspect))
	leased := n.lease(t, macRamdisk)
	mustIP(t, "-n", n.machine, "addr", "add", nsMachine.String()+"/24", "dev", "mach0") // an address the site did not give it

	if script, token := n.scriptToken(t, site, nsMachine, macRamdisk); token != "" || strings.Contains(script, "kernel") {
		t.Errorf("the script of %s asked from %s, an address the site did not lease to it:\n%s", macRamdisk, nsMachine, script)
	}
	script, token := n.scriptToken(t, site, leased, macRamdisk)
	if token == "" {
		t.Fatalf("the script of %s from its leased address %s has no token:\n%s", macRamdisk, leased, script)
	}
	hello := func(from netip.Addr, token string) (int, string) {
		t.Helper()
		status, body, err := httpPost(n.machine, from, site.addrs.BaseURL+siteapi.PathHello, token, toJSON(t, siteapi.Hello{Facts: facts(macRamdisk)}))
		if err != nil {
			t.Fatal(err)
		}
		return status, body
	}
	if status, body := hello(leased, token); status != 200 || !strings.Contains(body, `"m-ramdisk"`) {
		t.Errorf("hello from the leased address with the boot's token: %d %s", status, body)
	}
	if status, body := hello(nsMachine, token); status != http.StatusForbidden {
		t.Errorf("hello with the boot's token from another address: %d %s, want 403", status, body)
	}
	// The MAC boots again: the first boot's token is over.
	if _, again := n.scriptToken(t, site, leased, macRamdisk); again == "" || again == token {
		t.Fatalf("the next boot's token is %q", again)
	}
	if status, body := hello(leased, token); status != http.StatusUnauthorized {
		t.Errorf("hello with the previous boot's token: %d %s, want 401", status, body)
	}
}

// TestProxyBootTokensFollowTheDHCPRequests (proxy DHCP): the site gives no address, so it
// learns a MAC's from the DHCPREQUEST the machine broadcasts to its DHCP server; until it has
// heard one, the MAC's ramdisk script has no token.
func TestProxyBootTokensFollowTheDHCPRequests(t *testing.T) {
	t.Parallel()
	n := newNetns(t)
	mustIP(t, "-n", n.machine, "addr", "add", nsMachine.String()+"/24", "dev", "mach0") // another DHCP server's lease
	site := n.startSite(t, DHCPConfig{Mode: DHCPProxy})
	site.setPlan(t, testPlan(siteapi.UnknownInspect))

	if script, token := n.scriptToken(t, site, nsMachine, macRamdisk); token != "" {
		t.Errorf("a script with a token before the site heard the MAC ask for its address:\n%s", script)
	}
	var c *nclient4.Client
	must(t, n.inMachine(func() (err error) {
		c, err = nclient4.New("mach0", nclient4.WithHWAddr(hw(macRamdisk)), nclient4.WithTimeout(200*time.Millisecond), nclient4.WithRetry(1))
		return err
	}))
	defer c.Close()
	req, err := dhcpv4.New(dhcpv4.WithHwAddr(hw(macRamdisk)), dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest),
		dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(nsMachine.AsSlice())), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IPv4(192, 0, 2, 254))))
	must(t, err)
	if _, err := c.SendAndRead(context.Background(), c.RemoteAddr(), req, nil); !errors.Is(err, nclient4.ErrNoResponse) {
		t.Fatalf("a DHCPREQUEST to another server: %v, want no answer from the proxy", err)
	}
	// The DHCP loop is the site's own: nothing to wait on but what it serves.
	computetest.Eventually(t, 10*time.Second, "a token for the machine that asked for "+nsMachine.String(), func() bool {
		_, token := n.scriptToken(t, site, nsMachine, macRamdisk)
		return token != ""
	})
}

// httpPost posts a JSON body from namespace ns and address from.
func httpPost(ns string, from netip.Addr, url, token, body string) (int, string, error) {
	return httpDo(ns, from, "POST", url, token, body)
}
