package ramdisk

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/compute/metal/siteapi"
)

// fakeSite is the site's side of the ramdisk API (siteapi.Path*), scripted by a test, and a
// record of everything it was sent.
type fakeSite struct {
	*httptest.Server

	mu sync.Mutex
	// The script.
	unknownHellos  int    // the first Hellos are answered as from an unknown machine
	failHellos     int    // the first Hellos are answered 503
	failTasks      int    // the first task requests are answered 503
	failProgress   int    // the first progress posts are answered 503
	refuseProgress int    // the first progress posts are answered 403
	machine        string // the machine the site takes the ramdisk for
	token          string // the boot's token
	task           *siteapi.Task
	credential     string            // the task's join credential ("": none)
	credentialCode int               // the answer for it, when not 200 or 204
	files          map[string][]byte // GET path → bytes: images (the token's) and kernels
	// The record.
	hellos      []siteapi.Hello
	helloAuths  []string
	taskGets    []request
	progress    []siteapi.Progress
	credentials []siteapi.CredentialRequest
	gets        map[string]int // GET path → count
	changed     chan struct{}  // closed, and replaced, after each request the site answered
}

// request is a task request as the site saw it.
type request struct {
	machine, auth string
	status        int
}

func newFakeSite(t *testing.T) *fakeSite {
	s := &fakeSite{machine: "m-1", token: "t-1", files: map[string][]byte{}, gets: map[string]int{}, changed: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+siteapi.PathHello, s.hello)
	mux.HandleFunc("GET "+siteapi.PathTask, s.taskGet)
	mux.HandleFunc("POST "+siteapi.PathProgress, s.postProgress)
	mux.HandleFunc("POST "+siteapi.PathCredential, s.postCredential)
	mux.HandleFunc("GET /", s.file)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.ServeHTTP(w, r)
		s.mu.Lock()
		defer s.mu.Unlock()
		close(s.changed) // the record may have changed: those waiting look again
		s.changed = make(chan struct{})
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *fakeSite) hello(w http.ResponseWriter, r *http.Request) {
	var h siteapi.Hello
	if err := json.NewDecoder(r.Body).Decode(&h); err != nil || h.Facts.Validate() != nil {
		http.Error(w, "bad hello", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hellos = append(s.hellos, h)
	s.helloAuths = append(s.helloAuths, r.Header.Get("Authorization"))
	switch {
	case r.Header.Get("Authorization") != "Bearer "+s.token:
		w.WriteHeader(http.StatusUnauthorized)
	case s.failHellos > 0:
		s.failHellos--
		http.Error(w, "starting", http.StatusServiceUnavailable)
	case len(s.hellos) <= s.unknownHellos:
		writeJSON(w, siteapi.HelloAnswer{})
	default:
		writeJSON(w, siteapi.HelloAnswer{Machine: s.machine})
	}
}

func (s *fakeSite) postCredential(w http.ResponseWriter, r *http.Request) {
	var c siteapi.CredentialRequest
	if err := json.NewDecoder(r.Body).Decode(&c); err != nil {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.credentials = append(s.credentials, c)
	switch {
	case r.Header.Get("Authorization") != "Bearer "+s.token:
		w.WriteHeader(http.StatusUnauthorized)
	case s.credentialCode != 0:
		w.WriteHeader(s.credentialCode)
	case s.credential == "":
		w.WriteHeader(http.StatusNoContent)
	default:
		writeJSON(w, siteapi.CredentialAnswer{JoinCredential: s.credential})
	}
}

func (s *fakeSite) taskGet(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	req := request{machine: r.URL.Query().Get("machine"), auth: r.Header.Get("Authorization")}
	switch {
	case s.failTasks > 0:
		s.failTasks--
		req.status = http.StatusServiceUnavailable
	case req.auth != "Bearer "+s.token:
		req.status = http.StatusUnauthorized
	case req.machine != s.machine:
		req.status = http.StatusForbidden
	case s.task == nil:
		req.status = http.StatusNoContent
	default:
		req.status = http.StatusOK
	}
	s.taskGets = append(s.taskGets, req)
	if req.status == http.StatusOK {
		writeJSON(w, s.task)
		return
	}
	w.WriteHeader(req.status)
}

func (s *fakeSite) postProgress(w http.ResponseWriter, r *http.Request) {
	var p siteapi.Progress
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil || p.Validate() != nil {
		http.Error(w, "bad progress", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case r.Header.Get("Authorization") != "Bearer "+s.token:
		w.WriteHeader(http.StatusUnauthorized)
	case s.refuseProgress > 0:
		s.refuseProgress--
		w.WriteHeader(http.StatusForbidden)
	case s.failProgress > 0:
		s.failProgress--
		w.WriteHeader(http.StatusServiceUnavailable)
	default:
		s.progress = append(s.progress, p)
		w.WriteHeader(http.StatusNoContent)
	}
}

func (s *fakeSite) file(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	b, ok := s.files[r.URL.Path]
	s.gets[r.URL.Path]++
	authorized := !strings.HasPrefix(r.URL.Path, siteapi.PathImages) || r.Header.Get("Authorization") == "Bearer "+s.token
	s.mu.Unlock()
	if !authorized {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.Write(b)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// set changes the script under the site's lock.
func (s *fakeSite) set(f func(*fakeSite)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

// waitFor waits until cond holds of the site's record, looking again after each request the
// site answers, and fails the test after 10 s.
func (s *fakeSite) waitFor(t *testing.T, what string, cond func(*fakeSite) bool) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		ok, changed := cond(s), s.changed
		s.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			s.mu.Lock()
			defer s.mu.Unlock()
			t.Fatalf("waited 10 s for %s; the site has %d hellos, task requests %+v, progress %+v", what, len(s.hellos), s.taskGets, s.progress)
		}
	}
}

// phases is the phases posted for a task, in order, a run of downloads written once.
func (s *fakeSite) phases(task string) []string {
	var out []string
	for _, p := range s.progress {
		if p.Task == task && (len(out) == 0 || out[len(out)-1] != p.Phase) {
			out = append(out, p.Phase)
		}
	}
	return out
}

// last is the last progress posted for a task.
func (s *fakeSite) last(task string) siteapi.Progress {
	var last siteapi.Progress
	for _, p := range s.progress {
		if p.Task == task {
			last = p
		}
	}
	return last
}

// count is how many times a task posted a phase.
func (s *fakeSite) count(task, phase string) int {
	n := 0
	for _, p := range s.progress {
		if p.Task == task && p.Phase == phase {
			n++
		}
	}
	return n
}

func (s *fakeSite) finished(task string) bool {
	ph := s.phases(task)
	return len(ph) > 0 && (ph[len(ph)-1] == siteapi.PhaseDone || ph[len(ph)-1] == siteapi.PhaseFailed)
}

func joined(ss []string) string { return strings.Join(ss, " ") }
