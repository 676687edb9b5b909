package site

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/compute/metal/siteapi"
)

// The largest bodies the ramdisk API reads: a Hello at the facts' limits is about 40 KiB.
const (
	helloLimit    = 256 << 10
	progressLimit = 16 << 10
)

// A ramdisk told 503 tries again after this many seconds (Retry-After).
const retryAfterSeconds = 5

// handleHello answers POST /ramdisk/v1/hello from a boot: the machine the site takes the
// ramdisk for (by the MAC it booted with), and reports the facts up as KindMachineSeen.
func (s *Server) handleHello(w http.ResponseWriter, r *http.Request) {
	b, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	var h siteapi.Hello
	if !decodeBody(w, r, helloLimit, &h) {
		return
	}
	if err := checkHello(h); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_argument", err.Error())
		return
	}
	if !slices.Contains(h.Facts.MACs, b.mac) {
		writeError(w, http.StatusBadRequest, "invalid_argument", fmt.Sprintf("facts.macs: %v does not list %s, the MAC this machine booted with", h.Facts.MACs, b.mac))
		return
	}
	p := s.currentPlan()
	if p == nil {
		unavailable(w, "the site has no plan from the control plane yet")
		return
	}
	m := p.machineOf(b)
	other, err := p.machineByMACs(h.Facts.MACs)
	if err == nil && other != nil && other != m {
		err = &siteapi.FieldError{Field: "facts.macs", Problem: fmt.Sprintf("name machine %s, which is not the machine of this boot's MAC %s", other.ID, b.mac)}
	}
	if err != nil {
		writeError(w, http.StatusConflict, "conflict", err.Error())
		return
	}
	seen := siteapi.MachineSeen{Facts: h.Facts}
	var answer siteapi.HelloAnswer
	if m != nil {
		seen.Machine, answer.Machine = m.ID, m.ID
	}
	if !s.reports.offer(siteapi.KindMachineSeen, seen) {
		unavailable(w, "the site's reports to the control plane are backed up")
		return
	}
	s.log.Info("ramdisk: hello", "machine", seen.Machine, "serial", h.Facts.Serial, "macs", h.Facts.MACs, "said_machine", h.Machine, "boot_mac", b.mac)
	writeJSON(w, http.StatusOK, answer)
}

func checkHello(h siteapi.Hello) error {
	if len(h.Machine) > 64 || !printable(h.Machine) {
		return &siteapi.FieldError{Field: "machine", Problem: "at most 64 bytes of printable text"}
	}
	return h.Facts.Validate()
}

func printable(s string) bool {
	return !strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f })
}

// machineByMACs is the plan's machine with any of macs; nil when none is; an error when the MACs
// name two machines of the plan.
func (p *planIndex) machineByMACs(macs []string) (*siteapi.PlanMachine, error) {
	var found *siteapi.PlanMachine
	for _, mac := range macs {
		m := p.byMAC[mac]
		if m == nil {
			continue
		}
		if found != nil && found != m {
			return nil, &siteapi.FieldError{Field: "facts.macs", Problem: fmt.Sprintf("name two machines of the plan, %s and %s", found.ID, m.ID)}
		}
		found = m
	}
	return found, nil
}

// handleTask answers GET /ramdisk/v1/task?machine=: the machine's task (200) or 204 while it has
// none, to a boot of the machine. The task goes without what is not the ramdisk's: the image's
// pull token, the deploy's join credential (PathCredential).
func (s *Server) handleTask(w http.ResponseWriter, r *http.Request) {
	b, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	id := r.URL.Query().Get("machine")
	if id == "" {
		writeError(w, http.StatusBadRequest, "invalid_argument", "machine: the query parameter is required")
		return
	}
	m, ok := s.machineOfBoot(w, b, id)
	if !ok {
		return
	}
	if m.Task == nil {
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNoContent)
		return
	}
	task := *m.Task
	task.JoinCredential = ""
	if task.Image != nil {
		// A pull token is the site's to fetch with, never a ramdisk's: it reads the cache.
		im := *task.Image
		im.Authorization = ""
		task.Image = &im
	}
	writeJSON(w, http.StatusOK, task)
}

// handleCredential answers POST /ramdisk/v1/credential: the join credential of the machine's
// task, to the first boot of the machine that asks for it (and to it again), never to another:
// a boot that took it over from a spoofed MAC leaves the real machine's deploy failing, seen,
// rather than both holding it.
func (s *Server) handleCredential(w http.ResponseWriter, r *http.Request) {
	b, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	var req siteapi.CredentialRequest
	if !decodeBody(w, r, progressLimit, &req) {
		return
	}
	m, ok := s.machineOfBoot(w, b, req.Machine)
	if !ok {
		return
	}
	switch {
	case m.Task == nil || m.Task.ID != req.Task:
		writeError(w, http.StatusConflict, "failed_precondition", fmt.Sprintf("task: machine %s has no task %q", m.ID, req.Task))
		return
	case m.Task.JoinCredential == "":
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNoContent)
		return
	case !s.boots.claim(req.Task, b.hash):
		s.log.Error("ramdisk: the join credential was asked for by a second boot of the machine: refused (a MAC taken over on the provisioning network?)",
			"machine", m.ID, "task", req.Task, "boot_mac", b.mac)
		writeError(w, http.StatusGone, "failed_precondition", fmt.Sprintf("task %s: its join credential went to another boot of machine %s; deploy again", req.Task, m.ID))
		return
	}
	s.log.Info("ramdisk: join credential handed over", "machine", m.ID, "task", req.Task, "boot_mac", b.mac)
	writeJSON(w, http.StatusOK, siteapi.CredentialAnswer{JoinCredential: m.Task.JoinCredential})
}

// progressWait bounds how long a progress post waits for the control plane to record it.
const progressWait = 10 * time.Second

// handleProgress answers POST /ramdisk/v1/progress: checked, authorized by the token of the
// machine it names, and reported up as KindTaskProgress: 204 once the control plane recorded it,
// 409 when it refused it for good, 503 (retry) when it is not recorded within progressWait.
// The site passes on progress of any task id: the control plane's workflows match it to the
// task they wait on.
func (s *Server) handleProgress(w http.ResponseWriter, r *http.Request) {
	b, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	var prog siteapi.Progress
	if !decodeBody(w, r, progressLimit, &prog) {
		return
	}
	if err := prog.Validate(); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_argument", err.Error())
		return
	}
	if _, ok := s.machineOfBoot(w, b, prog.Machine); !ok {
		return
	}
	switch err := s.reports.deliverWithin(s.progressWait, siteapi.KindTaskProgress, prog); {
	case errors.Is(err, ErrRejected):
		// The control plane will not take it (a task the machine no longer has): final.
		writeError(w, http.StatusConflict, "failed_precondition", err.Error())
		return
	case err != nil:
		unavailable(w, "the control plane has not recorded the progress yet")
		return
	}
	s.log.Debug("ramdisk: progress", "machine", prog.Machine, "task", prog.Task, "phase", prog.Phase, "bytes", prog.Bytes)
	w.WriteHeader(http.StatusNoContent)
}

// authenticate finds the boot a ramdisk's request is from: it bears the boot's token, from one
// of the boot's addresses. Otherwise it answers 401 (no such boot: another boot of the MAC
// ended it, or it never was) or 403 (another address), and returns false.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (ramdiskBoot, bool) {
	scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if !strings.EqualFold(scheme, "Bearer") || token == "" {
		unauthorized(w)
		return ramdiskBoot{}, false
	}
	b, err := s.boots.lookup(strings.TrimSpace(token), remoteAddr(r), time.Now())
	switch {
	case errors.Is(err, errBootAddress):
		s.log.Warn("ramdisk: a boot's token from another address than its lease: refused", "err", err)
		// Not err's text: where the boot's ramdisk is, and its MAC, are not a replayer's to learn.
		writeError(w, http.StatusForbidden, "permission_denied", errBootAddress.Error()+": "+remoteAddr(r).String())
		return ramdiskBoot{}, false
	case err != nil:
		unauthorized(w)
		return ramdiskBoot{}, false
	}
	return b, true
}

// machineOf is the plan's machine of a boot (by the MAC it booted with): nil for an unknown
// machine, or before the first plan.
func (p *planIndex) machineOf(b ramdiskBoot) *siteapi.PlanMachine {
	if p == nil {
		return nil
	}
	return p.byMAC[b.mac]
}

// machineOfBoot is machine id of the plan, when it is the machine of boot b. Otherwise it
// answers 503 (no plan yet) or 403 (another machine's, or an unknown one's), and returns false.
func (s *Server) machineOfBoot(w http.ResponseWriter, b ramdiskBoot, id string) (*siteapi.PlanMachine, bool) {
	p := s.currentPlan()
	if p == nil {
		unavailable(w, "the site has no plan from the control plane yet")
		return nil, false
	}
	m := p.machineOf(b)
	if m == nil || m.ID != id {
		writeError(w, http.StatusForbidden, "permission_denied", fmt.Sprintf("machine: this boot (MAC %s) is not machine %q's", b.mac, id))
		return nil, false
	}
	return m, true
}

func unauthorized(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="bcd site"`)
	writeError(w, http.StatusUnauthorized, "unauthenticated", siteapi.ErrUnauthorized.Error())
}

func unavailable(w http.ResponseWriter, why string) {
	w.Header().Set("Retry-After", strconv.Itoa(retryAfterSeconds))
	writeError(w, http.StatusServiceUnavailable, "unavailable", why+": retry")
}

// decodeBody reads a JSON body of at most limit bytes into v, strictly: one JSON value, no
// unknown field. Anything else is answered (400, or 413 when too large), and false returned.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, more := dec.Token(); more != io.EOF {
			err = errTrailing
		}
	}
	if err == nil {
		return true
	}
	status, msg := bodyProblem(err, limit)
	writeError(w, status, "invalid_argument", msg)
	return false
}

var errTrailing = errors.New("more than one JSON value")

// bodyProblem says what is wrong with a body, naming the field where there is one.
func bodyProblem(err error, limit int64) (int, string) {
	var tooLarge *http.MaxBytesError
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &tooLarge):
		return http.StatusRequestEntityTooLarge, fmt.Sprintf("body: larger than %d bytes", limit)
	case errors.Is(err, io.EOF):
		return http.StatusBadRequest, "body: empty: a JSON object is required"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return http.StatusBadRequest, "body: the JSON ends too early"
	case errors.As(err, &syntax):
		return http.StatusBadRequest, fmt.Sprintf("body: not JSON (at byte %d: %v)", syntax.Offset, syntax)
	case errors.As(err, &typ):
		if typ.Field == "" {
			return http.StatusBadRequest, fmt.Sprintf("body: must be a JSON object, not %s", typ.Value)
		}
		return http.StatusBadRequest, fmt.Sprintf("%s: must be %s, not %s", typ.Field, jsonType(typ.Type.Kind().String()), typ.Value)
	case errors.Is(err, errTrailing):
		return http.StatusBadRequest, "body: " + err.Error()
	}
	// encoding/json has no error type for an unknown field: its message is the only place the
	// field's name is.
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return http.StatusBadRequest, strings.Trim(name, `"`) + ": unknown field"
	}
	return http.StatusBadRequest, "body: " + err.Error()
}

func jsonType(kind string) string {
	switch kind {
	case "string":
		return "a string"
	case "slice", "array":
		return "an array"
	case "struct", "map":
		return "an object"
	case "bool":
		return "true or false"
	case "ptr":
		return "an object or null"
	}
	return "a number" // the integer kinds
}
