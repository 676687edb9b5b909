package site

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/better-compute/compute/metal/siteapi"
)

var tokenRE = regexp.MustCompile(`bcd\.token=(\S+)`)

// bootToken fetches a MAC's iPXE script as its machine does and returns the boot token on its
// kernel line ("" when it has none).
func (ts *testSite) bootToken(t *testing.T, mac string) string {
	t.Helper()
	status, body, _ := ts.do(t, "GET", "/boot/ipxe?mac="+mac, "", "")
	if status != http.StatusOK {
		t.Fatalf("GET the script of %s: %d %s", mac, status, body)
	}
	if m := tokenRE.FindStringSubmatch(body); m != nil {
		return m[1]
	}
	return ""
}

// TestTheRamdiskAPIWantsTheBootsToken: whoever knows a machine's MACs learns nothing from the
// site without the token of the machine's boot: hello, task and images are refused; with the
// token the task is there, without the deploy's join credential.
func TestTheRamdiskAPIWantsTheBootsToken(t *testing.T) {
	t.Parallel()
	is := newImageServer(t)
	content := bytes.Repeat([]byte("a tenant's disk "), 1000)
	im := is.image("/private.raw", content, content)
	ts := startSite(t, fixture(t, t.TempDir(), newRecorder()))
	p := testPlan(siteapi.UnknownInspect)
	p.Images = []siteapi.Image{im}
	p.Machines[0].Task = &siteapi.Task{ID: "deploy-1", Kind: siteapi.TaskDeploy, Image: &im, Then: siteapi.ThenKexec,
		Kernel: "http://images.test/vmlinuz", Cmdline: "root=/dev/vda", JoinCredential: "bcdeploy_secret"}
	must(t, ts.SetPlan(p))
	waitImage(t, ts.up, im.SHA256, siteapi.ImageCached)

	hello := toJSON(t, siteapi.Hello{Facts: facts(macRamdisk, macSecond)})
	if status, body, _ := ts.do(t, "POST", siteapi.PathHello, "", hello); status != http.StatusUnauthorized {
		t.Errorf("a hello without a token: %d %s, want 401", status, body)
	}
	if status, _, _ := ts.do(t, "GET", siteapi.PathImages+im.SHA256, "", ""); status != http.StatusUnauthorized {
		t.Errorf("an image without a token: %d, want 401", status)
	}
	token := ts.bootToken(t, macRamdisk)
	if token == "" {
		t.Fatal("the machine's script gives its ramdisk no token")
	}
	status, body, _ := ts.do(t, "GET", siteapi.PathTask+"?machine=m-ramdisk", token, "")
	if status != http.StatusOK || strings.Contains(body, "bcdeploy_secret") {
		t.Errorf("the task: %d %s, want 200 without the join credential", status, body)
	}
	if status, body, _ := ts.do(t, "GET", siteapi.PathImages+im.SHA256, token, ""); status != http.StatusOK || body != string(content) {
		t.Errorf("the task's image with the boot's token: %d, %d bytes", status, len(body))
	}
	// Another machine's boot gets neither the task nor the image.
	idle := ts.bootToken(t, macIdle)
	if status, body, _ := ts.do(t, "GET", siteapi.PathTask+"?machine=m-ramdisk", idle, ""); status != http.StatusForbidden {
		t.Errorf("another machine's boot asks for the task: %d %s, want 403", status, body)
	}
	if status, _, _ := ts.do(t, "GET", siteapi.PathImages+im.SHA256, idle, ""); status != http.StatusNotFound {
		t.Errorf("another machine's boot asks for the image: %d, want 404", status)
	}
}

// TestABootsTokenFromAnotherAddressLearnsNothing: a boot's token used from another address than
// the boot's (a token seen on the wire, replayed) is refused 403, and the answer names neither
// the boot's addresses nor its MAC: where the real ramdisk is is not the replayer's to learn.
// The site's log keeps them.
func TestABootsTokenFromAnotherAddressLearnsNothing(t *testing.T) {
	t.Parallel()
	ts := startSite(t, fixture(t, t.TempDir(), newRecorder()))
	must(t, ts.SetPlan(testPlan(siteapi.UnknownInspect)))
	token := ts.bootToken(t, macRamdisk) // bound to 127.0.0.1, where the script was asked from
	from := &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}
	c := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{LocalAddr: from}).DialContext}}
	defer c.CloseIdleConnections()
	req, err := http.NewRequest("GET", ts.base+siteapi.PathTask+"?machine=m-ramdisk", nil)
	must(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		t.Skipf("cannot connect from 127.0.0.2: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusForbidden || strings.Contains(string(body), "127.0.0.1") || strings.Contains(string(body), macRamdisk) {
		t.Errorf("the boot's token from 127.0.0.2: %d %s, want 403 naming neither the boot's address nor its MAC", resp.StatusCode, body)
	}
}
