// Package recorded serves a provider's API from recorded exchanges, for the providers' contract
// tests: a file of testdata lists the requests a client is expected to send, in order, each with
// the answer the provider's documented API gives it (path, method, status, body). The server
// checks every request against the next recorded one (method, path, query, the headers the
// recording names, and the JSON body, compared as values) and fails the test at the first that
// differs, and at the end when a recorded request was never sent. No real provider account is
// used: the recordings are written from the providers' API documentation.
package recorded

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
)

// Recording is one testdata file.
type Recording struct {
	// Doc is where the provider documents what the exchanges show.
	Doc       string     `json:"doc"`
	Exchanges []Exchange `json:"exchanges"`
}

// Exchange is a request a client is expected to send and the provider's answer.
type Exchange struct {
	Request  Request  `json:"request"`
	Response Response `json:"response"`
}

// Request is what the client must send. Query lists every query parameter (none when empty);
// Header only the headers to check; Body, when set, is compared with the request's JSON body as
// a value (absent: the request has no body).
type Request struct {
	Method string              `json:"method"`
	Path   string              `json:"path"`
	Query  map[string][]string `json:"query,omitempty"`
	Header map[string]string   `json:"header,omitempty"`
	Body   json.RawMessage     `json:"body,omitempty"`
}

// Response is the provider's answer.
type Response struct {
	Status int               `json:"status"`
	Header map[string]string `json:"header,omitempty"`
	Body   json.RawMessage   `json:"body,omitempty"`
}

// Server replays a recording.
type Server struct {
	*httptest.Server
	t    testing.TB
	file string

	mu   sync.Mutex
	rec  Recording
	next int
}

// Serve starts a server replaying the recording in file (under testdata), and checks when the
// test ends that every recorded request was sent.
func Serve(t testing.TB, file string) *Server {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{t: t, file: file}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s.rec); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if len(s.rec.Exchanges) == 0 || s.rec.Doc == "" {
		t.Fatalf("%s: a recording names its documentation and has exchanges", file)
	}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		s.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.next < len(s.rec.Exchanges) {
			r := s.rec.Exchanges[s.next].Request
			t.Errorf("%s: %d recorded requests were never sent, the first %s %s", file, len(s.rec.Exchanges)-s.next, r.Method, r.Path)
		}
	})
	return s
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.next >= len(s.rec.Exchanges) {
		s.t.Errorf("%s: unexpected request %s %s after the last recorded one", s.file, r.Method, r.URL)
		http.Error(w, "not recorded", http.StatusTeapot)
		return
	}
	x := s.rec.Exchanges[s.next]
	s.next++
	if why := x.Request.differs(r, body); why != "" {
		s.t.Errorf("%s: request %d (%s %s): %s", s.file, s.next, r.Method, r.URL, why)
		http.Error(w, why, http.StatusTeapot)
		return
	}
	for k, v := range x.Response.Header {
		w.Header().Set(k, v)
	}
	if len(x.Response.Body) > 0 && w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
	}
	w.WriteHeader(x.Response.Status)
	_, _ = w.Write(x.Response.Body)
}

// differs says how r differs from the recorded request, or "".
func (want Request) differs(r *http.Request, body []byte) string {
	if r.Method != want.Method || r.URL.Path != want.Path {
		return fmt.Sprintf("want %s %s", want.Method, want.Path)
	}
	q := map[string][]string(r.URL.Query())
	if len(q) != 0 || len(want.Query) != 0 {
		if !reflect.DeepEqual(q, want.Query) {
			return fmt.Sprintf("query %v, want %v", q, want.Query)
		}
	}
	for k, v := range want.Header {
		if got := r.Header.Get(k); got != v {
			return fmt.Sprintf("header %s is %q, want %q", k, got, v)
		}
	}
	if len(want.Body) == 0 {
		if len(bytes.TrimSpace(body)) != 0 && string(bytes.TrimSpace(body)) != "null" {
			return fmt.Sprintf("a body %s, want none", body)
		}
		return ""
	}
	var got, exp any
	if err := json.Unmarshal(want.Body, &exp); err != nil {
		return "the recording's body: " + err.Error()
	}
	if err := json.Unmarshal(body, &got); err != nil {
		return fmt.Sprintf("the body %q is not JSON: %v", body, err)
	}
	if !reflect.DeepEqual(got, exp) {
		return fmt.Sprintf("body %s, want %s", compact(body), compact(want.Body))
	}
	return ""
}

// compact writes a JSON body on one line, its keys sorted, for messages.
func compact(b []byte) string {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return string(b)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

// Sent returns how many recorded requests were sent so far.
func (s *Server) Sent() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.next
}

// String names the recording, for messages.
func (s *Server) String() string { return strings.TrimSuffix(s.file, ".json") }
