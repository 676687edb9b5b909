package site

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
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
	io.WriteString(w, s.script(mac))
}

// script is the iPXE script of a MAC, by the plan:
//   - no plan yet: wait and ask again (the site is starting; the machine must not boot from its
//     disk by mistake);
//   - a machine of the plan with BootRamdisk: the ramdisk, with its id and token;
//   - an unknown machine while the plan says inspect: the ramdisk, without id or token;
//   - a machine with BootDisk, or an unknown one while the plan says ignore: exit, so that the
//     firmware boots its next boot device (the disk). Not sanboot: that names a disk by BIOS
//     drive number, does not exist for UEFI's local disks, and would bypass the boot order the
//     operator set; exit works the same in BIOS and UEFI.
func (s *Server) script(mac string) string {
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
	base := s.addrs.BaseURL
	args := []string{"initrd=initrd", siteapi.CmdlineSite + "=" + base}
	who := "an unknown machine, to be inspected"
	if b.machine != nil {
		who = "machine " + b.machine.ID
		args = append(args, siteapi.CmdlineMachine+"="+b.machine.ID)
		if b.machine.Token != "" {
			args = append(args, siteapi.CmdlineToken+"="+b.machine.Token)
		}
	}
	if s.cfg.Cmdline != "" {
		args = append(args, s.cfg.Cmdline)
	}
	return fmt.Sprintf(`#!ipxe
# bcd site: %s (%s) boots the ramdisk
kernel %s/boot/vmlinuz %s || goto failed
initrd --name initrd %s/boot/initrd || goto failed
boot || goto failed
:failed
echo bcd site: the ramdisk did not boot: trying again in %d s
sleep %d
chain --replace --autofree %s
`, who, mac, base, strings.Join(args, " "), base, scriptRetrySeconds, scriptRetrySeconds, self)
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

// handleImage serves GET /images/<sha256>: an image of the plan that the cache has verified.
func (s *Server) handleImage(w http.ResponseWriter, r *http.Request) {
	sha := r.PathValue("sha256")
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
