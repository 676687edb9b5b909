package site

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/better-compute/compute/metal/siteapi"
)

func (s *Server) httpServer() *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /boot/ipxe", s.handleScript)
	mux.HandleFunc("GET /boot/vmlinuz", s.serveBootFile(s.cfg.Kernel))
	mux.HandleFunc("GET /boot/initrd", s.serveBootFile(s.cfg.Initrd))
	mux.HandleFunc("POST "+siteapi.PathHello, s.handleHello)
	mux.HandleFunc("GET "+siteapi.PathTask, s.handleTask)
	mux.HandleFunc("POST "+siteapi.PathProgress, s.handleProgress)
	mux.HandleFunc("POST "+siteapi.PathCredential, s.handleCredential)
	mux.HandleFunc("GET "+siteapi.PathImages+"{sha256}", s.handleImage)
	return &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
}

// iPXE retries after this long when the site cannot answer yet, or the ramdisk did not boot.
const scriptRetrySeconds = 10

// handleScript answers GET /boot/ipxe?mac=: the iPXE script of the machine with that MAC.
func (s *Server) handleScript(w http.ResponseWriter, r *http.Request) {
	mac := strings.ToLower(r.URL.Query().Get("mac"))
	if !siteapi.ValidMAC(mac) {
		writeError(w, http.StatusBadRequest, "invalid_argument", fmt.Sprintf("mac: %q is not a MAC address (aa:bb:cc:dd:ee:ff)", r.URL.Query().Get("mac")))
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if r.Method == http.MethodHead {
		return // a script that boots the ramdisk mints a boot: only for a GET
	}
	io.WriteString(w, s.script(mac, remoteAddr(r), time.Now()))
}

// remoteAddr is the address a request came from.
func remoteAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// script is the iPXE script of a MAC asked for from an address, by the plan:
//   - no plan yet: wait and ask again (the site is starting; the machine must not boot from its
//     disk by mistake);
//   - a machine of the plan with BootRamdisk: the ramdisk, with its id and a new boot's token,
//     if from is the address the site knows the MAC's lease by (else: a new DHCP lease, and
//     ask again);
//   - an unknown machine while the plan says inspect: the same, without an id;
//   - a machine with BootDisk, or an unknown one while the plan says ignore: exit, so that the
//     firmware boots its next boot device (the disk). Not sanboot: that names a disk by BIOS
//     drive number, does not exist for UEFI's local disks, and would bypass the boot order the
//     operator set; exit works the same in BIOS and UEFI.
func (s *Server) script(mac string, from netip.Addr, now time.Time) string {
	self := s.scriptURL(mac)
	p := s.currentPlan()
	if p == nil {
		return fmt.Sprintf("#!ipxe\necho bcd site has no plan from the control plane yet: asking again in %d s\nsleep %d\nchain --replace --autofree %s\n",
			scriptRetrySeconds, scriptRetrySeconds, self)
	}
	b, ok := p.bootFor(mac)
	switch {
	case !ok:
		return fmt.Sprintf("#!ipxe\n# bcd site: %s is not a machine of this site's plan, which ignores unknown machines\nexit\n", mac)
	case !b.ramdisk:
		return fmt.Sprintf("#!ipxe\n# bcd site: machine %s boots from its disk\nexit\n", b.machine.ID)
	}
	who, id := "an unknown machine, to be inspected", ""
	if b.machine != nil {
		who, id = "machine "+b.machine.ID, b.machine.ID
	}
	// The boot's token goes only to the address the MAC's lease is, as the site knows it (with
	// DHCP off it knows none: the address the script is asked from).
	if leased, ok := s.leasedAddr(mac, now); s.cfg.DHCP.Mode != DHCPOff && (!ok || leased != from) {
		known := "none"
		if ok {
			known = leased.String()
		}
		s.log.Warn("http: a ramdisk script asked from another address than the MAC's lease: refused", "mac", mac, "from", from, "lease", known)
		// The lease stays in the log: whoever knows a MAC must not learn its machine's address.
		return fmt.Sprintf(`#!ipxe
# bcd site: %s (%s) asked from %v, which is not the address the site knows this MAC's lease by
echo bcd site: this script is given only to the address the MAC was leased: a new lease, and again in %d s
sleep %d
dhcp ||
chain --replace --autofree %s
`, who, mac, from, scriptRetrySeconds, scriptRetrySeconds, self)
	}
	base := s.addrs.BaseURL
	params := []siteapi.CmdlineParam{{Name: "initrd", Value: "initrd"}, {Name: siteapi.CmdlineSite, Value: base}}
	if b.machine != nil {
		params = append(params, siteapi.CmdlineParam{Name: siteapi.CmdlineMachine, Value: b.machine.ID})
	}
	params = append(params, siteapi.CmdlineParam{Name: siteapi.CmdlineToken, Value: s.boots.mint(mac, from, now)},
		siteapi.CmdlineParam{Name: siteapi.CmdlineBootIF, Value: siteapi.BootIF(mac)}) // bcd init leases on that NIC first
	cmdline, err := siteapi.SetCmdline(s.cfg.Cmdline, params...)
	if err != nil { // the plan's ids and Cmdline were checked: not reached
		s.log.Error("http: the ramdisk's command line", "err", err)
		return fmt.Sprintf("#!ipxe\necho bcd site: %s\nexit 1\n", err)
	}
	s.log.Info("http: a ramdisk boots", "mac", mac, "machine", id, "from", from)
	return fmt.Sprintf(`#!ipxe
# bcd site: %s (%s) boots the ramdisk
kernel %s/boot/vmlinuz %s || goto failed
initrd --name initrd %s/boot/initrd || goto failed
boot || goto failed
:failed
echo bcd site: the ramdisk did not boot: trying again in %d s
sleep %d
chain --replace --autofree %s
`, who, mac, base, cmdline, base, scriptRetrySeconds, scriptRetrySeconds, self)
}

// serveBootFile serves the ramdisk's kernel or initramfs (ranges and conditional requests work).
func (s *Server) serveBootFile(path string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f, err := os.Open(path)
		if err != nil {
			s.log.Error("http: ramdisk file missing", "path", path, "err", err)
			writeError(w, http.StatusNotFound, "not_found", filepath.Base(path)+" is not available at this site")
			return
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			writeError(w, http.StatusNotFound, "not_found", filepath.Base(path)+" is not available at this site")
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		http.ServeContent(w, r, "", fi.ModTime(), f)
	}
}

// handleImage serves GET /images/<sha256>: an image of the plan that the cache has verified, to
// a boot whose machine's task deploys it.
func (s *Server) handleImage(w http.ResponseWriter, r *http.Request) {
	sha := r.PathValue("sha256")
	b, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	p := s.currentPlan()
	m := p.machineOf(b)
	if m == nil || m.Task == nil || m.Task.Image == nil || m.Task.Image.SHA256 != sha {
		writeError(w, http.StatusNotFound, "not_found", "image "+sha+" is not the image of this machine's task")
		return
	}
	f, ok := s.cache.open(sha)
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", "image "+sha+" is not in this site's verified cache")
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeError(w, http.StatusNotFound, "not_found", "image "+sha+" is not in this site's verified cache")
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("ETag", `"`+sha+`"`)
	http.ServeContent(w, r, "", fi.ModTime(), f)
}

// apiError is the body of every error the site answers over HTTP, in the control plane's shape.
type apiError struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	var e apiError
	e.Error.Code, e.Error.Message = code, message
	writeJSON(w, status, e)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
